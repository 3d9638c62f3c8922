"""Delta coalescing: fewer frames, same text, always before the final message."""

from __future__ import annotations

import asyncio

from talkbridge.webchat.streams import DeltaCoalescer


class Recorder:
    def __init__(self) -> None:
        self.frames: list[tuple[str, str, str]] = []
        self.changed = asyncio.Event()

    async def __call__(self, thread_id: str, stream_id: str, text: str) -> None:
        self.frames.append((thread_id, stream_id, text))
        self.changed.set()


async def test_the_first_piece_goes_at_once_and_the_rest_are_merged() -> None:
    out = Recorder()
    streams = DeltaCoalescer(out, window=60)
    for piece in ("Hel", "lo ", "wor", "ld"):
        await streams.add("t", "s1", piece)
    assert out.frames == [("t", "s1", "Hel")]
    await streams.finish("s1")
    assert out.frames == [("t", "s1", "Hel"), ("t", "s1", "lo world")]


async def test_buffered_pieces_are_sent_when_the_window_ends() -> None:
    out = Recorder()
    streams = DeltaCoalescer(out, window=0.01)
    await streams.add("t", "s1", "a")
    out.changed.clear()
    await streams.add("t", "s1", "b")
    await streams.add("t", "s1", "c")
    await asyncio.wait_for(out.changed.wait(), 5)  # the window's timer flushed them
    assert [f[2] for f in out.frames] == ["a", "bc"]
    await streams.finish("s1")
    assert [f[2] for f in out.frames] == ["a", "bc"]


async def test_streams_do_not_mix() -> None:
    out = Recorder()
    streams = DeltaCoalescer(out, window=60)
    await streams.add("t1", "s1", "one")
    await streams.add("t2", "s2", "two")
    await streams.add("t1", "s1", "+1")
    await streams.finish("s2")
    await streams.finish("s1")
    assert out.frames == [("t1", "s1", "one"), ("t2", "s2", "two"), ("t1", "s1", "+1")]
