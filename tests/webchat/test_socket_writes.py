"""write_frames: several frames, in order, in one transport write; a closed socket is skipped."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from websockets.asyncio.client import connect
from websockets.asyncio.server import ServerConnection, serve

from talkbridge.webchat.socket_writes import write_frames


class CountingTransport:
    """Wraps the server connection's transport to count what reaches the socket."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))
        self.inner.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@asynccontextmanager
async def server_socket() -> AsyncIterator[tuple[ServerConnection, Any]]:
    """A real server connection (its transport counted) and the client talking to it."""
    accepted: asyncio.Queue[ServerConnection] = asyncio.Queue()
    done = asyncio.Event()

    async def handler(ws: ServerConnection) -> None:
        await accepted.put(ws)
        await done.wait()

    async with serve(handler, "127.0.0.1", 0) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        async with connect(f"ws://127.0.0.1:{port}/") as client:
            ws = await asyncio.wait_for(accepted.get(), 5)
            ws.transport = CountingTransport(ws.transport)  # type: ignore[assignment]
            try:
                yield ws, client
            finally:
                done.set()


async def test_frames_arrive_in_order_from_one_write() -> None:
    async with server_socket() as (ws, client):
        write_frames(ws, ('{"type":"message"}', '{"type":"ack"}', "héllo"))
        got = [await asyncio.wait_for(client.recv(), 5) for _ in range(3)]
        assert got == ['{"type":"message"}', '{"type":"ack"}', "héllo"]
        assert len(ws.transport.writes) == 1  # type: ignore[attr-defined]


async def test_a_closed_socket_is_skipped_without_an_error() -> None:
    async with server_socket() as (ws, client):
        await client.close()
        await asyncio.wait_for(ws.wait_closed(), 5)
        writes_before = len(ws.transport.writes)  # type: ignore[attr-defined]
        write_frames(ws, ("one", "two"))
        assert len(ws.transport.writes) == writes_before  # type: ignore[attr-defined]


async def test_frames_wait_behind_a_fragmented_message_being_sent() -> None:
    """While `send` streams a fragmented message, frames must not land between its pieces."""
    async with server_socket() as (ws, client):
        first_sent, release = asyncio.Event(), asyncio.Event()

        async def fragments() -> AsyncIterator[str]:
            yield "part one, "
            first_sent.set()  # asked for the next piece: the first is on the wire
            await release.wait()
            yield "part two"

        sending = asyncio.create_task(ws.send(fragments()))
        await asyncio.wait_for(first_sent.wait(), 5)
        assert ws.send_in_progress is not None
        write_frames(ws, ("interloper",))
        release.set()
        await sending
        assert await asyncio.wait_for(client.recv(), 5) == "part one, part two"
