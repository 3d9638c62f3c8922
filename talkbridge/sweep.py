"""Entries that fall due a fixed delay after they were added, on one timer for all of them.

Typing indicators (a turn shows typing once it has run a while) and streamed reply pieces (sent
at most once per window) both have one such deadline per turn or stream, by the hundred under
load. A timer each costs a heap entry and a handle, and most are cancelled before they fire (the
turn or stream ends first). Here adding and removing an entry is a dict operation, and one timer
runs while any entry waits: entries fall due in the order they were added, since they share the
delay. At most one timer fires per `delay` while entries keep coming and going.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class DelayedSweep(Generic[K, V]):
    def __init__(self, delay: float, due: Callable[[K, V], None]) -> None:
        self._delay = delay
        self._due = due
        self._waiting: dict[K, tuple[float, V]] = {}
        """Entries by when they were added (insertion order is that order)."""
        self._timer: asyncio.TimerHandle | None = None

    def add(self, key: K, value: V) -> None:
        """`key` falls due `delay` seconds from now (unless it is already waiting)."""
        if key in self._waiting:
            return
        loop = asyncio.get_running_loop()
        self._waiting[key] = (loop.time(), value)
        if self._timer is None:
            self._timer = loop.call_later(self._delay, self._sweep)

    def get(self, key: K) -> V | None:
        waiting = self._waiting.get(key)
        return None if waiting is None else waiting[1]

    def pop(self, key: K) -> V | None:
        """Take `key` out before it falls due; its value, or None if it was not waiting.

        The timer stays, even with nothing left: most entries are taken out soon after they
        were added (a quick turn), and the next one added reuses it instead of making another.
        """
        waiting = self._waiting.pop(key, None)
        return None if waiting is None else waiting[1]

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._waiting.clear()

    def _sweep(self) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time() - self._delay
        waiting = self._waiting
        while waiting:
            key, (added, value) = next(iter(waiting.items()))
            if added > due:  # every later entry was added later still
                break
            del waiting[key]
            self._due(key, value)
        if waiting:
            oldest = next(iter(waiting.values()))[0]
            self._timer = loop.call_at(oldest + self._delay, self._sweep)
        else:
            self._timer = None
