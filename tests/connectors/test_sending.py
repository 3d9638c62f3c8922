"""PartialSends: a retried split send resumes after the last step that went out."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from talkbridge.connectors.sending import PartialSends


class Boom(Exception):
    pass


def steps(
    calls: list[int], fail_at: int | None = None, ids_per_step: int = 1
) -> Callable[[int], Awaitable[list[str]]]:
    async def step(index: int) -> list[str]:
        calls.append(index)
        if index == fail_at:
            raise Boom
        return [f"m{index}.{n}" for n in range(ids_per_step)]

    return step


async def test_a_retry_with_the_same_key_skips_the_steps_already_done() -> None:
    sends = PartialSends()
    calls: list[int] = []
    with pytest.raises(Boom):
        await sends.run("k", 4, steps(calls, fail_at=2, ids_per_step=2))
    sent = await sends.run("k", 4, steps(calls))
    assert calls == [0, 1, 2, 2, 3]
    assert sent == ["m0.0", "m0.1", "m1.0", "m1.1", "m2.0", "m3.0"]
    assert await sends.run("k", 2, steps(calls)) == ["m0.0", "m1.0"]  # done: forgotten


async def test_without_a_key_every_step_runs_again() -> None:
    sends = PartialSends()
    calls: list[int] = []
    with pytest.raises(Boom):
        await sends.run(None, 3, steps(calls, fail_at=1))
    await sends.run(None, 3, steps(calls))
    assert calls == [0, 1, 0, 1, 2]


async def test_the_oldest_unfinished_key_is_forgotten_past_the_limit() -> None:
    sends = PartialSends(limit=1)
    calls: list[int] = []
    for key in ("a", "b"):
        with pytest.raises(Boom):
            await sends.run(key, 2, steps(calls, fail_at=1))
    calls.clear()
    await sends.run("b", 2, steps(calls))  # kept: resumes at step 1
    await sends.run("a", 2, steps(calls))  # forgotten: starts over
    assert calls == [1, 0, 1]
