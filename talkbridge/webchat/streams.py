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
    def __init__(self, publish: Publish, window: float = DELTA_WINDOW) -> None:
        self._publish = publish
        self._window = window
        self._buffers: dict[str, tuple[str, list[str]]] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def add(self, thread_id: str, stream_id: str, text: str) -> None:
        buffered = self._buffers.get(stream_id)
        if buffered is not None:
            buffered[1].append(text)
            return
        self._buffers[stream_id] = (thread_id, [text])
        if stream_id not in self._timers:
            loop = asyncio.get_running_loop()
            self._timers[stream_id] = loop.call_later(self._window, self._flush, stream_id)

    def _flush(self, stream_id: str) -> None:
        self._timers.pop(stream_id, None)
        buffered = self._buffers.pop(stream_id, None)
        if buffered is None:
            return
        thread_id, pieces = buffered
        task = asyncio.ensure_future(self._publish(thread_id, stream_id, "".join(pieces)))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def finish(self, stream_id: str) -> None:
        """The final message is about to go out: it carries the whole text, so what is still
        buffered is dropped, and pieces already on their way go out first."""
        timer = self._timers.pop(stream_id, None)
        if timer is not None:
            timer.cancel()
        self._buffers.pop(stream_id, None)
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
