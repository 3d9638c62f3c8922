"""Serving a peer on 127.0.0.1 at a free port: the boilerplate every local peer shares."""

from __future__ import annotations

import asyncio
import socket

from aiohttp import web


async def serve(app: web.Application) -> tuple[web.AppRunner, int]:
    """Start `app` on 127.0.0.1, port 0; returns the runner (`cleanup()` it) and the port."""
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = next(int(a[1]) for a in runner.addresses if isinstance(a, tuple))
    return runner, port


def free_port() -> int:
    """A port free right now, for servers that must be told their port before they start."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def send_and_stall(port: int, start: bytes, wait: float = 10.0) -> bytes:
    """Send the start of a request and nothing more, as a slow client (slowloris) does; return
    what the server answers before it closes the connection (TimeoutError if it never does)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(start)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), wait)
    finally:
        writer.close()
