"""A TCP proxy on 127.0.0.1 in front of a real server, for peers that interfere with the
traffic between a client and that server (hold answers back, cut a connection at a command)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, Self


class TcpProxy:
    """Listens on a port of its own (`port`, once entered) and opens one connection to
    `target` per client; subclasses say how each direction is carried (`_pumps`)."""

    until_first_ends = False
    """End a client's connection once either direction ends (a cut), rather than both."""

    def __init__(self, target: int) -> None:
        self._target = target
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    def _pumps(
        self,
        client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        server: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    ) -> tuple[Coroutine[Any, Any, None], Coroutine[Any, Any, None]]:
        """The client-to-server and server-to-client carriers of one connection."""
        raise NotImplementedError

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._target)
        pumps = self._pumps((reader, writer), (up_reader, up_writer))
        tasks = [asyncio.create_task(p) for p in pumps]
        self._tasks.update(tasks)
        try:
            if self.until_first_ends:
                await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            else:
                await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            for task in tasks:
                task.cancel()
            self._tasks.difference_update(tasks)
            for w in (writer, up_writer):
                w.close()
