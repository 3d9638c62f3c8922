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
