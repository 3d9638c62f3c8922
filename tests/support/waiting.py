"""Waiting on something that changes, without sleeping: peers and recorders signal each change.

`Waitable` is mixed into peers and test recorders; they call `_notify()` after every change and
tests `await x.wait_for(condition)`. A subclass creates `self._changed = asyncio.Event()`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, ClassVar


class Waitable:
    wait_timeout: ClassVar[float] = 10.0
    """The safety net of `wait_for`: a condition not met by then fails the test."""
    _changed: asyncio.Event

    def _notify(self) -> None:
        event, self._changed = self._changed, asyncio.Event()
        event.set()

    def _next_change(self) -> Coroutine[Any, Any, bool]:
        """Awaits the next `_notify()` after this call (not after the first await)."""
        return self._changed.wait()

    async def wait_for(self, condition: Callable[[], bool], timeout: float | None = None) -> None:
        """Wait until `condition()` holds, checking it after every change."""

        async def wait() -> None:
            while not condition():
                await self._next_change()

        await asyncio.wait_for(wait(), self.wait_timeout if timeout is None else timeout)
