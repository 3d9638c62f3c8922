"""Typing indicators for turns that take a while.

A turn shows typing only once it has run `TYPING_DELAY` seconds: an instant reply needs no
indicator. Rather than a timer per turn, one sweep (while any turn runs) finds the turns that
have become slow; registering and ending a turn is two dict operations.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable

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
        self._delay = delay
        self._refresh = refresh
        self._ids = itertools.count()
        self._waiting: dict[int, tuple[float, Activity, str]] = {}
        """Turns not showing typing yet, oldest first (insertion order is start order)."""
        self._showing: dict[int, asyncio.Task[None]] = {}
        self._sweep: asyncio.TimerHandle | None = None

    def begin(self, activity: Activity, thread_id: str) -> int:
        """A turn starts in `thread_id`; returns the handle to pass to `end`."""
        turn = next(self._ids)
        loop = asyncio.get_running_loop()
        self._waiting[turn] = (loop.time(), activity, thread_id)
        if self._sweep is None:
            self._sweep = loop.call_later(self._delay, self._start_slow_turns)
        return turn

    def end(self, turn: int) -> None:
        if self._waiting.pop(turn, None) is None:
            task = self._showing.pop(turn, None)
            if task is not None:
                task.cancel()

    def close(self) -> None:
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        for task in self._showing.values():
            task.cancel()
        self._showing.clear()
        self._waiting.clear()

    def _start_slow_turns(self) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time() - self._delay
        while self._waiting:
            turn, (started, activity, thread_id) = next(iter(self._waiting.items()))
            if started > due:  # every later turn started later still
                break
            del self._waiting[turn]
            self._showing[turn] = asyncio.create_task(self._keep_typing(activity, thread_id))
        if self._waiting:
            oldest = next(iter(self._waiting.values()))[0]
            self._sweep = loop.call_at(oldest + self._delay, self._start_slow_turns)
        else:
            self._sweep = None

    async def _keep_typing(self, activity: Activity, thread_id: str) -> None:
        while True:
            try:
                await activity.typing(thread_id)
            except Exception as exc:  # typing is a nicety: never let it break a turn
                log.debug("typing indication failed: %s", self._redact(str(exc)))
            await asyncio.sleep(self._refresh)
