"""Streamed reply pieces, sent at most once per window per stream.

A reply that is complete within the first window (the echo agent, a cached answer) needs no
pieces at all: its final message arrives before any delta would, and every frame costs each tab
a write. A slow reply (a model producing tokens) shows its first pieces after one window, then
at most one frame per window, however many tokens arrive in between.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

DELTA_WINDOW = 0.05
"""Seconds between delta frames of one stream (and before the first one)."""

Publish = Callable[[str, str, str], Awaitable[None]]


class DeltaCoalescer:
    """Rather than a timer per stream, one sweep (while any stream holds pieces) sends the
    pieces of every stream whose window is over: adding a piece is a dict operation."""

    def __init__(self, publish: Publish, window: float = DELTA_WINDOW) -> None:
        self._publish = publish
        self._window = window
        self._buffers: dict[str, tuple[float, str, list[str]]] = {}
        """Streams holding pieces, by when their window opened (insertion order is that order):
        (opened at, thread id, pieces)."""
        self._sweep: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def add(self, thread_id: str, stream_id: str, text: str) -> None:
        buffered = self._buffers.get(stream_id)
        if buffered is not None:
            buffered[2].append(text)
            return
        loop = asyncio.get_running_loop()
        self._buffers[stream_id] = (loop.time(), thread_id, [text])
        if self._sweep is None:
            self._sweep = loop.call_later(self._window, self._send_due)

    def _send_due(self) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time() - self._window
        while self._buffers:
            stream_id, (opened, thread_id, pieces) = next(iter(self._buffers.items()))
            if opened > due:  # every later stream opened later still
                break
            del self._buffers[stream_id]
            task = asyncio.ensure_future(self._publish(thread_id, stream_id, "".join(pieces)))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        if self._buffers:
            oldest = next(iter(self._buffers.values()))[0]
            self._sweep = loop.call_at(oldest + self._window, self._send_due)
        else:
            self._sweep = None

    async def finish(self, stream_id: str) -> None:
        """The final message is about to go out: it carries the whole text, so what is still
        buffered is dropped, and pieces already on their way go out first."""
        self._buffers.pop(stream_id, None)
        if not self._buffers and self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
