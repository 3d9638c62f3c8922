"""A redis-server on 127.0.0.1 for the tests: the one answering on 6379, else our own.

Tests share one server and keep apart by key prefix. Our own server (when 6379 is silent) is
started once per test process on a free port and stopped when the process exits.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Coroutine, Iterator
from typing import Any

from tests.peers.http import free_port
from tests.peers.proxy import TcpProxy

_url: str | None = None


def answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def start_redis(port: int) -> subprocess.Popen[bytes] | None:
    """A redis-server on 127.0.0.1:`port` that keeps nothing on disk, once it answers; None
    when none is installed or it did not come up (stop it with `stop_redis`)."""
    exe = shutil.which("redis-server")
    if exe is None:
        return None
    proc = subprocess.Popen(
        [exe, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10  # a safety net: it answers within ~50 ms
    while not answers(port):  # a process, not a task of ours: nothing to await
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_redis(proc)
            return None
        time.sleep(0.01)
    return proc


def stop_redis(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def redis_url() -> str | None:
    """The URL of a live redis-server, or None when none answers and none is installed."""
    global _url
    if _url is not None:
        return _url
    if answers(6379):
        _url = "redis://127.0.0.1:6379/0"
        return _url
    port = free_port()
    proc = start_redis(port)
    if proc is None:
        return None
    atexit.register(stop_redis, proc)
    _url = f"redis://127.0.0.1:{port}/0"
    return _url


@contextlib.contextmanager
def private_redis() -> Iterator[str | None]:
    """A redis-server of this test alone (for what would disturb a shared one), or None."""
    port = free_port()
    proc = start_redis(port)
    if proc is None:
        yield None
        return
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        stop_redis(proc)


class OutageRedis:
    """A redis-server of one test alone, which the test stops and starts again: an outage."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._proc: subprocess.Popen[bytes] | None = None

    def stop(self) -> None:
        if self._proc is not None:
            stop_redis(self._proc)
            self._proc = None

    async def start(self) -> None:
        """(Again:) on the same port, once it answers."""
        self._proc = await asyncio.to_thread(start_redis, self.port)
        assert self._proc is not None, f"redis-server did not start again on {self.port}"


@contextlib.asynccontextmanager
async def outage_redis() -> AsyncIterator[OutageRedis]:
    """A running `OutageRedis`, stopped at the end; the test is skipped (failed on CI) when
    no redis-server is installed."""
    from tests.conftest import require

    require(shutil.which("redis-server") is not None, "redis-server is not installed")
    server = OutageRedis()
    await server.start()
    try:
        yield server
    finally:
        server.stop()


class StallingProxy(TcpProxy):
    """A TCP proxy in front of a redis-server whose answers can be held back: while `hold`
    is on, what Redis answers reaches no client until `release`. A client behind it sees a
    command carried out by Redis, but hears so only later, as a node paused (SIGSTOP) right
    after sending it would: deterministically, at a chosen command."""

    def __init__(self, port: int) -> None:
        super().__init__(port)
        self._open = asyncio.Event()
        self._open.set()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def hold(self) -> None:
        self._open.clear()

    def release(self) -> None:
        self._open.set()

    def _pumps(
        self,
        client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        server: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    ) -> tuple[Coroutine[Any, Any, None], Coroutine[Any, Any, None]]:
        return self._pump(client[0], server[1], gated=False), self._pump(server[0], client[1])

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, gated: bool = True
    ) -> None:
        while data := await reader.read(65536):
            if gated:
                await self._open.wait()
            writer.write(data)
            await writer.drain()
        writer.close()
