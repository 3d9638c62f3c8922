"""The HTTP servers a platform posts to (Slack's Events API, Telegram's webhook).

Anyone who can reach such a server can open connections to it before any signature or secret
is checked, and aiohttp waits for a request head up to its keep-alive timeout (an hour) and
for a body as long as a byte trickles in now and then: a client sending slowly (slowloris)
held a connection, and a socket of the bridge, for as long as it liked. Platforms send a
request at once, so both waits are bounded here.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

READ_TIMEOUT = 10.0
"""Seconds a request's head, and then its body, may take to arrive."""


def app_runner(app: web.Application, read_timeout: float = READ_TIMEOUT) -> web.AppRunner:
    """A runner whose connections close when no complete request head came within
    `read_timeout` (aiohttp's keep-alive timer also runs from a connection's start), and
    which reads the rest of a body answered early (a wrong secret) for no longer than that."""
    return web.AppRunner(
        app, access_log=None, keepalive_timeout=read_timeout, lingering_time=read_timeout
    )


async def read_body(request: web.Request, read_timeout: float = READ_TIMEOUT) -> bytes | None:
    """The request's body, or None when it did not all come within `read_timeout`."""
    try:
        async with asyncio.timeout(read_timeout):
            return await request.read()
    except TimeoutError:
        return None


def too_slow() -> web.Response:
    """The answer to a body that did not come in time; the connection closes after it."""
    response = web.Response(status=408, text="the request body did not arrive in time")
    response.force_close()
    return response
