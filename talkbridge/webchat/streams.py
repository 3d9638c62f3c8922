"""Streamed reply pieces, sent at most once per window per stream.

A reply that is complete within the first window (the echo agent, a cached answer) needs no
pieces at all: its final message arrives before any delta would, and every frame costs each tab
a write. A slow reply (a model producing tokens) shows its first pieces after one window, then
at most one frame per window, however many tokens arrive in between.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from talkbridge.sweep import DelayedSweep

DELTA_WINDOW = 0.05
"""Seconds between delta frames of one stream (and before the first one)."""

Publish = Callable[[str, str, str], Awaitable[None]]
MAX_OPEN_STREAMS = 1024
"""Streams whose text so far is kept for late joiners (and, apart, streams of this node not
ended yet); past this the oldest is forgotten (an app streaming pieces through the feature
may never end them)."""


class DeltaCoalescer:
    """Rather than a timer per stream, one sweep (`DelayedSweep`) sends the pieces of every
    stream whose window is over: adding a piece is a dict operation."""

    def __init__(self, publish: Publish, window: float = DELTA_WINDOW) -> None:
        self._publish = publish
        self._buffers: DelayedSweep[str, tuple[str, list[str]]] = DelayedSweep(window, self._send)
        """Streams holding pieces: (thread id, pieces)."""
        self._published: dict[str, tuple[str, list[str]]] = {}
        """Per thread, its reply under way: (stream id, the pieces sent so far), for a tab that
        joins late. One per thread: a thread runs one turn at a time."""
        self._shown: dict[str, str] = {}
        """This node's streams with pieces sent and neither their final message nor their
        end yet: stream id -> thread id (`cut`)."""
        self._tasks: set[asyncio.Task[None]] = set()

    async def add(self, thread_id: str, stream_id: str, text: str) -> None:
        buffered = self._buffers.get(stream_id)
        if buffered is not None:
            buffered[1].append(text)
        else:
            self._buffers.add(stream_id, (thread_id, [text]))

    def so_far(self, thread_id: str) -> tuple[str, str] | None:
        """(stream id, text sent so far) of the thread's reply under way, if any."""
        published = self._published.get(thread_id)
        return None if published is None else (published[0], "".join(published[1]))

    def _send(self, stream_id: str, buffered: tuple[str, list[str]]) -> None:
        thread_id, pieces = buffered
        text = "".join(pieces)
        if stream_id not in self._shown and len(self._shown) >= MAX_OPEN_STREAMS:
            del self._shown[next(iter(self._shown))]
        self._shown[stream_id] = thread_id
        task = asyncio.ensure_future(self._send_now(thread_id, stream_id, text))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send_now(self, thread_id: str, stream_id: str, text: str) -> None:
        """Counted in the text so far in the step that writes it to this node's sockets: a
        history answer in between would carry it in its `from_start` text, and the delta after."""
        self.published(thread_id, stream_id, text)
        await self._publish(thread_id, stream_id, text)

    def published(self, thread_id: str, stream_id: str, text: str) -> None:
        """`text` of a stream went out (from this node, or from another one through the
        fan-out): a tab joining later gets it. A thread runs one turn at a time, so a new
        stream in it replaces one that was cut off (a node stopped mid-turn)."""
        current = self._published.get(thread_id)
        if current is not None and current[0] == stream_id:
            current[1].append(text)
            return
        if current is None and len(self._published) >= MAX_OPEN_STREAMS:
            del self._published[next(iter(self._published))]
        self._published[thread_id] = (stream_id, [text])

    def ended(self, thread_id: str, stream_id: str | None = None) -> None:
        """The thread's reply is complete (or cut off): nothing of it to catch up on.
        `stream_id`: the reply's own stream, whose final message this node sent."""
        self._published.pop(thread_id, None)
        if stream_id is not None:
            self._shown.pop(stream_id, None)

    def forget(self, thread_id: str, stream_id: str) -> None:
        """A stream ended without its final message: a tab joining later is not shown it."""
        current = self._published.get(thread_id)
        if current is not None and current[0] == stream_id:
            del self._published[thread_id]

    async def cut(self, stream_id: str) -> bool:
        """The turn that streamed `stream_id` is over, and its final message did not go out
        from here: drop what is buffered of it, wait for its pieces on their way, and say
        whether any went out (the pages show them: they must be told it ended)."""
        await self.finish(stream_id)
        thread_id = self._shown.pop(stream_id, None)
        if thread_id is None:
            return False
        self.forget(thread_id, stream_id)
        return True

    async def finish(self, stream_id: str) -> None:
        """The final message is about to go out: it carries the whole text, so what is still
        buffered is dropped, and pieces already on their way go out first."""
        self._buffers.pop(stream_id)
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
