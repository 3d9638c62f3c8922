"""Write several frames to one socket with one system call.

`websockets.broadcast` (like `send`) hands each frame to the transport on its own, and an idle
transport sends at once: a `send` system call per frame, ~10 µs each on loopback, which is where
most of a busy webchat's time went. A message and its ack leave together, so they are written
together. This uses the connection's Sans-I/O protocol (`protocol.send_text`, `data_to_send`) the
way websockets' own `broadcast` does; with a websockets that lacks those, it falls back to it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from websockets.asyncio.server import ServerConnection, broadcast
from websockets.protocol import State


def write_frames(ws: ServerConnection, texts: Sequence[str]) -> None:
    """Queue `texts` as text frames on `ws`, in order, without waiting; skip a closed socket."""
    if (
        ws.protocol.state is not State.OPEN
        or getattr(ws, "send_in_progress", True) is not None  # a fragmented send, or unknown
    ):
        for text in texts:
            broadcast((ws,), text)  # logs and skips the way it always does
        return
    protocol = ws.protocol
    for text in texts:
        protocol.send_text(text.encode())
    chunks = protocol.data_to_send()
    if all(chunks):
        ws.transport.write(b"".join(chunks))
    else:  # an end-of-stream marker: not expected while OPEN, but never drop it
        for chunk in chunks:
            if chunk:
                ws.transport.write(chunk)
        if ws.transport.can_write_eof():
            ws.transport.write_eof()
        else:
            ws.transport.close()


def keeping_up(
    sockets: Iterable[ServerConnection], limit: int, log: logging.Logger
) -> list[ServerConnection]:
    """The sockets with at most `limit` bytes still waiting to be written; the others are cut.

    Frames are written without waiting, so a socket whose reader stopped (a client that never
    reads, a phone whose network died without a close) would hold every frame of its session
    in memory, without end. Cut, it gets nothing more here; its page reconnects and resumes
    from history, which holds every message.
    """
    kept: list[ServerConnection] = []
    for ws in sockets:
        if ws.transport.get_write_buffer_size() <= limit:
            kept.append(ws)
        elif not ws.transport.is_closing():
            log.info("webchat: cut a socket that stopped reading (over %d bytes unsent)", limit)
            ws.transport.abort()
    return kept


__all__ = ["keeping_up", "write_frames"]
