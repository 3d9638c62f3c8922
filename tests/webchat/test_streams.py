"""Delta coalescing: no frames for a quick reply, at most one per window for a slow one."""

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

    async def next_frame(self) -> tuple[str, str, str]:
        count = len(self.frames)
        while len(self.frames) == count:
            self.changed.clear()
            await asyncio.wait_for(self.changed.wait(), 5)
        return self.frames[-1]


async def test_a_reply_finished_within_the_window_sends_no_pieces() -> None:
    out = Recorder()
    streams = DeltaCoalescer(out, window=60)
    for piece in ("Hel", "lo ", "wor", "ld"):
        await streams.add("t", "s1", piece)
    await streams.finish("s1")  # the final message carries "Hello world"
    assert out.frames == []


async def test_a_slow_reply_streams_its_pieces_merged_per_window() -> None:
    out = Recorder()
    streams = DeltaCoalescer(out, window=0.01)
    await streams.add("t", "s1", "a")
    await streams.add("t", "s1", "b")
    assert await out.next_frame() == ("t", "s1", "ab")
    await streams.add("t", "s1", "c")
    assert await out.next_frame() == ("t", "s1", "c")
    await streams.add("t", "s1", "never shown")
    await streams.finish("s1")
    assert [f[2] for f in out.frames] == ["ab", "c"]


async def test_streams_do_not_mix() -> None:
    out = Recorder()
    streams = DeltaCoalescer(out, window=0.01)
    await streams.add("t1", "s1", "one")
    await streams.add("t2", "s2", "two")
    await out.next_frame()
    if len(out.frames) < 2:
        await out.next_frame()
    assert sorted(out.frames) == [("t1", "s1", "one"), ("t2", "s2", "two")]
    await streams.finish("s1")
    await streams.finish("s2")


async def test_the_text_so_far_holds_only_pieces_already_sent() -> None:
    """A tab joining mid-stream gets the text so far, then the deltas after it: a piece counted
    in that text before its own delta went out reached the tab twice (a word shown twice)."""
    out = Recorder()
    streams = DeltaCoalescer(out, window=0.01)
    await streams.add("t", "s1", "a piece")
    for _ in range(10_000):  # each turn of the loop, as a history answer would look
        if streams.so_far("t") is not None:
            break
        await asyncio.sleep(0)
    assert streams.so_far("t") == ("s1", "a piece")
    assert out.frames == [("t", "s1", "a piece")]
