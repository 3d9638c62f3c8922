"""Serving a peer on 127.0.0.1 at a free port: the boilerplate every local peer shares."""

from __future__ import annotations

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
