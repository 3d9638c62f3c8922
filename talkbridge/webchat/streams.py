"""Merge streamed reply pieces that arrive faster than a frame is worth sending."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

DELTA_WINDOW = 0.05
"""Seconds: at most one delta frame per stream in this window; the first piece goes at once."""

MAX_STREAMS = 10_000

Publish = Callable[[str, str, str], Awaitable[None]]


class DeltaCoalescer:
    """Per stream: send the first piece now, gather later ones, send them when the window ends
    (or when the stream finishes, so the last piece always precedes the final message)."""

    def __init__(self, publish: Publish, window: float = DELTA_WINDOW) -> None:
        self._publish = publish
        self._window = window
        self._buffers: dict[str, tuple[str, list[str]]] = {}
        self._last_sent: dict[str, float] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def add(self, thread_id: str, stream_id: str, text: str) -> None:
        loop = asyncio.get_running_loop()
        buffered = self._buffers.get(stream_id)
        if buffered is not None:
            buffered[1].append(text)
            return
        last = self._last_sent.get(stream_id)
        now = loop.time()
        if last is None or now - last >= self._window:
            if len(self._last_sent) >= MAX_STREAMS:  # streams that never finished: forget them
                self._last_sent.clear()
            self._last_sent[stream_id] = now
            await self._publish(thread_id, stream_id, text)
            return
        self._buffers[stream_id] = (thread_id, [text])
        self._timers[stream_id] = loop.call_at(last + self._window, self._flush_later, stream_id)

    def _flush_later(self, stream_id: str) -> None:
        self._timers.pop(stream_id, None)
        flushed = self._take(stream_id)
        if flushed is not None:
            self._last_sent[stream_id] = asyncio.get_running_loop().time()
            self._spawn(self._publish(*flushed))

    def _take(self, stream_id: str) -> tuple[str, str, str] | None:
        buffered = self._buffers.pop(stream_id, None)
        if buffered is None:
            return None
        return buffered[0], stream_id, "".join(buffered[1])

    async def finish(self, stream_id: str) -> None:
        """The stream is over: send what is buffered now and forget the stream."""
        timer = self._timers.pop(stream_id, None)
        if timer is not None:
            timer.cancel()
        self._last_sent.pop(stream_id, None)
        flushed = self._take(stream_id)
        if self._tasks:  # a timed flush already on its way goes out before the rest
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        if flushed is not None:
            await self._publish(*flushed)

    def _spawn(self, publish: Awaitable[None]) -> None:
        task = asyncio.ensure_future(publish)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
