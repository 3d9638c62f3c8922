"""Typing shows only for turns that outlast the delay, and stops when they end."""

from __future__ import annotations

import asyncio

from talkbridge.indicators import TypingIndicators


class Activity:
    def __init__(self) -> None:
        self.shown: list[str] = []
        self.event = asyncio.Event()
        self.fail = False

    async def typing(self, thread_id: str) -> None:
        self.shown.append(thread_id)
        self.event.set()
        if self.fail:
            raise RuntimeError("token=hunter2 rejected")


async def test_only_a_slow_turn_shows_typing_and_it_refreshes_until_the_end() -> None:
    indicators = TypingIndicators(delay=0.02, refresh=0.01)
    activity = Activity()
    fast = indicators.begin(activity, "fast")
    slow = indicators.begin(activity, "slow")
    indicators.end(fast)  # answered at once: never shown
    await asyncio.wait_for(activity.event.wait(), 5)
    assert activity.shown == ["slow"]
    while len(activity.shown) < 3:  # refreshed while the turn runs
        activity.event.clear()
        await asyncio.wait_for(activity.event.wait(), 5)
    indicators.end(slow)  # its task is cancelled: it never shows typing again
    count = len(activity.shown)
    later = indicators.begin(activity, "later")  # a turn after: the sweep runs again
    activity.event.clear()
    await asyncio.wait_for(activity.event.wait(), 5)
    assert activity.shown[count:] == ["later"]
    indicators.end(later)
    indicators.close()


async def test_a_failing_indicator_never_breaks_the_turn() -> None:
    indicators = TypingIndicators(delay=0.0, refresh=0.01)
    activity = Activity()
    activity.fail = True
    turn = indicators.begin(activity, "t")
    for _ in range(2):
        activity.event.clear()
        await asyncio.wait_for(activity.event.wait(), 5)
    indicators.end(turn)
    indicators.close()
    assert activity.shown == ["t", "t"]


class SwallowingActivity:
    """Typing through a client that takes a cancel for a failed call and returns (redis-py's
    publish can): the cancel `end` sends arrives while an indication is under way."""

    def __init__(self) -> None:
        self.shown: list[str] = []
        self.calling = asyncio.Event()
        self.cancel_swallowed = asyncio.Event()

    async def typing(self, thread_id: str) -> None:
        self.shown.append(thread_id)
        self.calling.set()
        if self.cancel_swallowed.is_set():
            return  # later indications go through at once
        try:
            await asyncio.Event().wait()  # the server has not answered when the cancel comes
        except asyncio.CancelledError:
            self.cancel_swallowed.set()


async def test_typing_ends_with_its_turn_even_when_the_client_swallows_the_cancel() -> None:
    indicators = TypingIndicators(delay=0.0, refresh=0.0)
    activity = SwallowingActivity()
    turn = indicators.begin(activity, "t")
    await asyncio.wait_for(activity.calling.wait(), 5)
    [typing] = [t for t in asyncio.all_tasks() if "_keep_typing" in repr(t.get_coro())]
    indicators.end(turn)  # the reply is out: typing must stop
    await asyncio.wait_for(asyncio.wait([typing]), 5)  # the loop ends, not just this call
    assert typing.cancelled() and activity.cancel_swallowed.is_set()
    assert activity.shown == ["t"]
    indicators.close()
