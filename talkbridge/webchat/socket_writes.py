"""Write several frames to one socket with one system call.

`websockets.broadcast` (like `send`) hands each frame to the transport on its own, and an idle
transport sends at once: a `send` system call per frame, ~10 µs each on loopback, which is where
most of a busy webchat's time went. A message and its ack leave together, so they are written
together. This uses the connection's Sans-I/O protocol (`protocol.send_text`, `data_to_send`) the
way websockets' own `broadcast` does; with a websockets that lacks those, it falls back to it.
"""

from __future__ import annotations

from collections.abc import Sequence

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


__all__ = ["write_frames"]
