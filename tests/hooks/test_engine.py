"""The generic hook engine: order, block/modify, failures, filters, scopes, observers, prefetch."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, replace
from typing import Any

import pytest

from talkbridge.hooks.engine import (
    GLOBAL,
    Allow,
    Block,
    ChainOutcome,
    HookChain,
    HookFilter,
    Modify,
    Scope,
)

from .support import WAIT


@dataclass(frozen=True)
class Ev:
    text: str = "hi"
    channel: str = "webchat"
    connection_id: str = "conn-a"
    thread_id: str = "t1"
    direction: str = "inbound"
    event_type: str = "message"


def recorder(calls: list[str], name: str, result: Any = None) -> Any:
    async def hook(event: Ev) -> Any:
        calls.append(name)
        return result

    return hook


async def test_lowest_order_first_and_ties_in_registration_order() -> None:
    chain: HookChain[Ev] = HookChain("test")
    calls: list[str] = []
    chain.add(recorder(calls, "late-a"), name="late-a", order=5)
    chain.add(recorder(calls, "first"), name="first", order=-1)
    chain.add(recorder(calls, "late-b"), name="late-b", order=5)
    chain.add(recorder(calls, "middle"), name="middle", order=1)
    chain.add(recorder(calls, "late-c"), name="late-c", order=5)
    outcome = await chain.run(Ev())
    assert calls == ["first", "middle", "late-a", "late-b", "late-c"]
    assert outcome.allowed and outcome.decided_by is None


async def test_block_stops_chain_but_observers_still_see_it() -> None:
    chain: HookChain[Ev] = HookChain("test")
    calls: list[str] = []
    seen: list[ChainOutcome[Ev]] = []
    chain.add(recorder(calls, "allow", Allow()), name="allow", order=0)
    chain.add(recorder(calls, "blocker", Block("nope")), name="blocker", order=1)
    chain.add(recorder(calls, "after"), name="after", order=2)

    async def watch(event: Ev, outcome: ChainOutcome[Ev]) -> None:
        await asyncio.sleep(0)  # suspends: runs in the background
        seen.append(outcome)

    chain.add(watch, name="watch", observer=True, order=-5)
    outcome = await chain.run(Ev())
    await chain.drain()
    assert calls == ["allow", "blocker"]  # "after" never served the refused event
    assert outcome.blocked and outcome.decision == Block("nope")
    assert outcome.decided_by == "blocker"
    assert len(seen) == 1 and seen[0].blocked and seen[0].decided_by == "blocker"


async def test_modify_passes_the_new_event_on() -> None:
    chain: HookChain[Ev] = HookChain("test")
    seen: list[str] = []

    async def upper(event: Ev) -> Modify[Ev]:
        return Modify(replace(event, text=event.text.upper()))

    async def look(event: Ev) -> None:
        seen.append(event.text)

    chain.add(upper, name="upper", order=0)
    chain.add(look, name="look", order=1)
    outcome = await chain.run(Ev(text="quiet"))
    assert seen == ["QUIET"]
    assert outcome.event.text == "QUIET" and outcome.modified_by == ("upper",)
    assert outcome.allowed


async def test_sync_hooks_and_ctx_argument() -> None:
    chain: HookChain[Ev] = HookChain("test")
    got: list[Any] = []

    def plain(event: Ev, ctx: Any) -> Block | None:
        got.append(ctx)
        return Block("sync") if ctx == "stop" else None

    chain.add(plain, name="plain")
    assert (await chain.run(Ev(), "go")).allowed
    assert (await chain.run(Ev(), "stop")).decision == Block("sync")
    assert got == ["go", "stop"]


def _never(calls: list[str]) -> Any:
    async def hook(event: Ev) -> None:
        calls.append("never-started")
        await asyncio.Event().wait()

    return hook


def _raises(calls: list[str]) -> Any:
    async def hook(event: Ev) -> None:
        calls.append("raiser")
        raise ValueError("broken rule")

    return hook


def _unusable(calls: list[str]) -> Any:
    async def hook(event: Ev) -> int:
        calls.append("weird")
        return 42

    return hook


@pytest.mark.parametrize(
    ("make", "kind", "words"),
    [
        (_never, "timeout", "timed out"),
        (_raises, "exception", "ValueError: broken rule"),
        (_unusable, "unusable", "returned a value of type int, which is not a decision"),
    ],
)
async def test_fail_open_skips_the_broken_hook(
    make: Any, kind: str, words: str, caplog: pytest.LogCaptureFixture
) -> None:
    chain: HookChain[Ev] = HookChain("test")
    calls: list[str] = []
    chain.add(make(calls), name="broken", order=0, timeout=0.05)
    chain.add(recorder(calls, "next"), name="next", order=1)
    with caplog.at_level(logging.WARNING, logger="talkbridge.hooks"):
        outcome = await chain.run(Ev())
    assert calls[-1] == "next"
    assert outcome.allowed
    assert [(f.hook, f.kind) for f in outcome.failures] == [("broken", kind)]
    assert words in outcome.failures[0].detail
    assert "'broken'" in caplog.text and "fail-open" in caplog.text


@pytest.mark.parametrize(
    ("make", "words"),
    [(_never, "timed out"), (_raises, "ValueError"), (_unusable, "not a decision")],
)
async def test_fail_closed_blocks_naming_the_hook(make: Any, words: str) -> None:
    chain: HookChain[Ev] = HookChain("test")
    calls: list[str] = []
    chain.add(make(calls), name="guard", order=0, timeout=0.05, on_error="fail-closed")
    chain.add(recorder(calls, "next"), name="next", order=1)
    outcome = await chain.run(Ev())
    assert "next" not in calls
    assert outcome.blocked and outcome.decided_by == "guard"
    assert "'guard'" in outcome.decision.reason and words in outcome.decision.reason
    assert outcome.failures[0].on_error == "fail-closed"


async def test_a_timeout_error_raised_by_the_hook_is_an_exception_not_a_timeout() -> None:
    chain: HookChain[Ev] = HookChain("test")

    async def own_timeout(event: Ev) -> None:
        await asyncio.sleep(0)
        raise TimeoutError("upstream slow")

    chain.add(own_timeout, name="own", timeout=WAIT)
    outcome = await chain.run(Ev())
    assert outcome.failures[0].kind == "exception"


FILTER_CASES = [
    ("channels", ["telegram"], {"channel": "telegram"}, {"channel": "slack"}),
    ("connection_ids", ["bot-1"], {"connection_id": "bot-1"}, {"connection_id": "bot-2"}),
    ("direction", "outbound", {"direction": "outbound"}, {"direction": "inbound"}),
    ("event_types", ["edit"], {"event_type": "edit"}, {"event_type": "message"}),
    ("thread_ids", ["room-9"], {"thread_id": "room-9"}, {"thread_id": "room-1"}),
]


@pytest.mark.parametrize(("field", "value", "hit", "miss"), FILTER_CASES)
async def test_each_filter_field(
    field: str, value: Any, hit: dict[str, str], miss: dict[str, str]
) -> None:
    flt = HookFilter.model_validate({field: value})
    assert flt.matches(Ev(**hit)) and not flt.matches(Ev(**miss))
    chain: HookChain[Ev] = HookChain("test")
    calls: list[str] = []
    chain.add(recorder(calls, "filtered"), name="filtered", filter=flt)
    chain.add(recorder(calls, "any"), name="any")
    await chain.run(Ev(**miss))
    assert calls == ["any"]
    await chain.run(Ev(**hit))
    assert calls == ["any", "filtered", "any"]


def test_filter_refuses_empty_lists_and_unknown_keys() -> None:
    with pytest.raises(ValueError, match="empty list"):
        HookFilter(channels=frozenset())
    with pytest.raises(ValueError, match="channel"):
        HookFilter.model_validate({"channel": ["telegram"]})


async def test_thread_and_connection_scopes_and_removal_by_name() -> None:
    chain: HookChain[Ev] = HookChain("test")
    calls: list[str] = []
    chain.add(recorder(calls, "global"), name="global", order=5)
    chain.freeze()  # scoped hooks stay changeable after start
    room = Scope.thread("conn-a\x1froom")
    chain.add(recorder(calls, "room"), name="mod", scope=room, order=0)
    chain.add(recorder(calls, "conn-b"), name="mod", scope=Scope.connection("conn-b"), order=9)

    await chain.run(Ev(thread_id="room"))
    assert calls == ["room", "global"]
    calls.clear()
    await chain.run(Ev(thread_id="room", connection_id="conn-b"))  # same id, other connection
    assert calls == ["global", "conn-b"]
    calls.clear()
    await chain.run(Ev(thread_id="other"))
    assert calls == ["global"]

    assert chain.remove("mod", scope=room) == 1
    calls.clear()
    await chain.run(Ev(thread_id="room"))
    assert calls == ["global"]
    assert chain.remove("mod") == 1  # the connection-scoped one
    assert chain.remove("mod", missing_ok=True) == 0
    with pytest.raises(KeyError, match="mod"):
        chain.remove("mod")


async def test_freeze_applies_to_global_hooks_only() -> None:
    chain: HookChain[Ev] = HookChain("test")
    reg = chain.add(recorder([], "a"), name="a")
    chain.freeze()
    with pytest.raises(RuntimeError, match="frozen"):
        chain.add(recorder([], "b"), name="b")
    with pytest.raises(RuntimeError, match="frozen"):
        chain.remove("a")
    with pytest.raises(RuntimeError, match="frozen"):
        reg.remove()
    with chain.add(recorder([], "c"), name="c", scope=Scope.connection("x")) as scoped:
        assert "c" in chain.names()
    assert not scoped.active and "c" not in chain.names()


def test_has_listeners_counts_through_add_and_remove() -> None:
    chain: HookChain[Ev] = HookChain("test")
    assert not chain.has_listeners() and not chain.has_listeners("edit")
    edits = chain.add(
        recorder([], "e"), name="e", filter=HookFilter(event_types=frozenset({"edit", "delete"}))
    )
    assert chain.has_listeners() and chain.has_listeners("edit") and chain.has_listeners("delete")
    assert not chain.has_listeners("message")
    anything = chain.add(recorder([], "o"), name="o", observer=True, scope=Scope.connection("c"))
    assert chain.has_listeners("message")
    anything.remove()
    assert not chain.has_listeners("message") and chain.has_listeners("edit")
    edits.remove()
    assert not chain.has_listeners() and not chain.has_listeners("edit") and len(chain) == 0


def test_registration_errors_are_clear() -> None:
    chain: HookChain[Ev] = HookChain("test")
    chain.add(recorder([], "a"), name="a")
    with pytest.raises(ValueError, match="'a' is already registered"):
        chain.add(recorder([], "a"), name="a")
    with pytest.raises(ValueError, match="on_error"):
        chain.add(recorder([], "b"), name="b", on_error="ignore")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout"):
        chain.add(recorder([], "b"), name="b", timeout=0)
    with pytest.raises(TypeError, match=r"cannot be called as <lambda>\(event\)"):
        chain.add(lambda: None, name="b")


async def test_observer_failures_are_logged_never_raised(caplog: pytest.LogCaptureFixture) -> None:
    chain: HookChain[Ev] = HookChain("test")
    done = asyncio.Event()

    def bad_now(event: Ev) -> None:
        raise RuntimeError("sync observer broke")

    async def bad_later(event: Ev) -> None:
        await asyncio.sleep(0)
        raise RuntimeError("async observer broke")

    async def good(event: Ev) -> None:
        await asyncio.sleep(0)
        done.set()

    chain.add(bad_now, name="bad-now", observer=True)
    chain.add(bad_later, name="bad-later", observer=True)
    chain.add(good, name="good", observer=True)
    with caplog.at_level(logging.WARNING, logger="talkbridge.hooks"):
        outcome = await chain.run(Ev())
        await asyncio.wait_for(done.wait(), WAIT)
        await chain.drain()
    assert outcome.allowed and outcome.failures == ()
    assert "'bad-now'" in caplog.text and "'bad-later'" in caplog.text


async def test_prefetched_lock_free_hook_overlaps_earlier_message_yet_applies_in_order() -> None:
    chain: HookChain[Ev] = HookChain("test")
    thread_lock = asyncio.Lock()
    first_in_slow = asyncio.Event()
    moderation_started_for_second = asyncio.Event()
    log: list[str] = []
    moderation_calls: list[str] = []

    async def slow(event: Ev) -> None:
        log.append(f"slow:{event.text}")
        if event.text == "first":
            first_in_slow.set()
            # Only finishes if the second message's moderation runs while we hold the lock.
            await moderation_started_for_second.wait()

    async def before_moderation(event: Ev) -> None:
        log.append(f"before:{event.text}")

    async def moderation(event: Ev) -> Block | None:
        moderation_calls.append(event.text)
        if event.text == "second":
            moderation_started_for_second.set()
            return Block("flagged")
        return None

    async def after(event: Ev) -> None:
        log.append(f"after:{event.text}")

    chain.add(slow, name="slow", order=0)
    chain.add(before_moderation, name="before", order=5)
    chain.add(moderation, name="moderation", order=10, needs_thread_lock=False)
    chain.add(after, name="after", order=20)

    async def process(event: Ev) -> ChainOutcome[Ev]:
        prefetch = chain.prefetch(event)  # on arrival, before waiting for the thread
        async with thread_lock:
            outcome = await chain.run(event, prefetch=prefetch)
        log.append(f"done:{event.text}")
        return outcome

    first = asyncio.create_task(process(Ev(text="first")))
    await asyncio.wait_for(first_in_slow.wait(), WAIT)
    second = asyncio.create_task(process(Ev(text="second")))
    o1, o2 = await asyncio.wait_for(asyncio.gather(first, second), WAIT)

    assert o1.allowed
    assert o2.blocked and o2.decided_by == "moderation"
    assert sorted(moderation_calls) == ["first", "second"]  # prefetched results used, not re-run
    assert log == [
        "slow:first",
        "before:first",
        "after:first",
        "done:first",
        "slow:second",
        "before:second",  # the block applies at moderation's turn, not before
        "done:second",  # and "after" never sees the refused message
    ]


async def test_prefetched_hook_is_cancelled_when_chain_blocks_earlier() -> None:
    chain: HookChain[Ev] = HookChain("test")
    started = asyncio.Event()
    cancelled = asyncio.Event()

    async def blocker(event: Ev) -> Block:
        await asyncio.wait_for(started.wait(), WAIT)
        return Block("early")

    async def slow_check(event: Ev) -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    chain.add(blocker, name="blocker", order=0)
    chain.add(slow_check, name="slow-check", order=1, needs_thread_lock=False)
    event = Ev()
    prefetch = chain.prefetch(event)
    assert prefetch is not None and len(prefetch) == 1
    outcome = await chain.run(event, prefetch=prefetch)
    assert outcome.decided_by == "blocker"
    await asyncio.wait_for(cancelled.wait(), WAIT)


async def test_lock_free_hook_may_not_modify() -> None:
    chain: HookChain[Ev] = HookChain("test")

    async def sneaky(event: Ev) -> Modify[Ev]:
        return Modify(replace(event, text="changed"))

    chain.add(sneaky, name="sneaky", needs_thread_lock=False, on_error="fail-closed")
    event = Ev()
    outcome = await chain.run(event, prefetch=chain.prefetch(event))
    assert outcome.blocked and outcome.decision.reason == (  # the log said "hook 'sneaky' a
        "test hook 'sneaky' failed closed: returned Modify, but a hook with "  # lock-free hook…"
        "needs_thread_lock: false may not modify the message (it may run before earlier ones end)"
    )
    assert outcome.event.text == "hi"


def test_prefetch_is_none_without_lock_free_hooks() -> None:
    chain: HookChain[Ev] = HookChain("test")
    chain.add(recorder([], "a"), name="a")
    assert chain.prefetch(Ev()) is None
    assert GLOBAL.kind == "global"
