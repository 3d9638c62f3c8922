"""The filter of seen inbound keys: never a miss, rarely a false "maybe"."""

from __future__ import annotations

import pytest

from talkbridge.store.seen import SeenFilter


def keys(prefix: str, count: int) -> list[tuple[str, str]]:
    return [(f"conn-{i % 7}", f"{prefix}{i}") for i in range(count)]


def holding(added: list[tuple[str, str]], capacity: int) -> SeenFilter:
    seen = SeenFilter(capacity)
    for key in added:
        seen.add(*key)
    return seen


def test_a_key_once_added_is_never_called_new_again() -> None:
    seen = SeenFilter(5_000)
    first = [seen.add(*k) for k in keys("m", 5_000)]
    assert first.count(True) > 4_900  # new, bar a few false "maybe"s
    assert [seen.add(*k) for k in keys("m", 5_000)] == [False] * 5_000
    assert seen.count == 10_000


def test_at_capacity_few_new_keys_are_called_maybe_seen() -> None:
    seen = holding(keys("old", 10_000), 10_000)
    fresh = [seen.add(*k) for k in keys("new", 2_000)]
    assert fresh.count(False) / len(fresh) < 0.02  # ~0.6 % by design; blake2b: deterministic


def test_the_connection_is_part_of_the_key() -> None:
    seen = SeenFilter(100)
    assert seen.add("a", "1")
    assert seen.add("b", "1")
    assert not seen.add("a", "1")


def test_ids_with_lone_surrogates_are_keys_too() -> None:
    seen = SeenFilter(100)
    assert seen.add("c", "\ud800x")
    assert not seen.add("c", "\ud800x")


def test_a_dumped_filter_restores_with_its_keys_and_count() -> None:
    seen = holding(keys("m", 1_000), 1_000)
    restored = SeenFilter.restore(seen.dump())
    assert (restored.count, restored.capacity) == (seen.count, seen.capacity)
    assert not any(restored.add(*k) for k in keys("m", 1_000))
    with pytest.raises(ValueError, match="power of two"):
        SeenFilter.restore((b"\0" * 3, 0))
