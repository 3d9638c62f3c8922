"""Typing indicators for turns that take a while.

A turn shows typing only once it has run `TYPING_DELAY` seconds: an instant reply needs no
indicator. Rather than a timer per turn, one sweep (`DelayedSweep`) finds the turns that have
become slow; registering and ending a turn is a dict operation each.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable

from talkbridge.cancellation import raise_if_cancelling
from talkbridge.sweep import DelayedSweep
from talkbridge.talk import Activity

log = logging.getLogger("talkbridge.bridge")

TYPING_DELAY = 0.5
"""Seconds a turn runs before the connection shows typing."""
TYPING_REFRESH = 4.0
"""Seconds between typing indications while an agent works (Telegram's lasts about 5 s)."""


class TypingIndicators:
    def __init__(
        self,
        redact: Callable[[str], str] = str,
        *,
        delay: float = TYPING_DELAY,
        refresh: float = TYPING_REFRESH,
    ) -> None:
        self._redact = redact
        self._refresh = refresh
        self._ids = itertools.count()
        self._waiting: DelayedSweep[int, tuple[Activity, str]] = DelayedSweep(
            delay, self._start_typing
        )
        """Turns not showing typing yet."""
        self._showing: dict[int, asyncio.Task[None]] = {}

    def begin(self, activity: Activity, thread_id: str) -> int:
        """A turn starts in `thread_id`; returns the handle to pass to `end`."""
        turn = next(self._ids)
        self._waiting.add(turn, (activity, thread_id))
        return turn

    def end(self, turn: int) -> None:
        if self._waiting.pop(turn) is None:
            task = self._showing.pop(turn, None)
            if task is not None:
                task.cancel()

    def close(self) -> None:
        self._waiting.close()
        for task in self._showing.values():
            task.cancel()
        self._showing.clear()

    def _start_typing(self, turn: int, waiting: tuple[Activity, str]) -> None:
        activity, thread_id = waiting
        self._showing[turn] = asyncio.create_task(self._keep_typing(activity, thread_id))

    async def _keep_typing(self, activity: Activity, thread_id: str) -> None:
        while True:
            try:
                await activity.typing(thread_id)
            except Exception as exc:  # typing is a nicety: never let it break a turn
                log.debug("typing indication failed: %s", self._redact(str(exc)))
            # `end` cancels once, and forgets the task: a cancel the client library swallowed
            # (redis-py's publish, in distributed mode) would leave typing shown for good.
            raise_if_cancelling()
            await asyncio.sleep(self._refresh)
