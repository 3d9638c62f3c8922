"""A redis-server on 127.0.0.1 for the tests: the one answering on 6379, else our own.

Tests share one server and keep apart by key prefix. Our own server (when 6379 is silent) is
started once per test process on a free port and stopped when the process exits.
"""

from __future__ import annotations

import atexit
import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator

from tests.peers.http import free_port

_url: str | None = None


def answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def redis_url() -> str | None:
    """The URL of a live redis-server, or None when none answers and none is installed."""
    global _url
    if _url is not None:
        return _url
    if answers(6379):
        _url = "redis://127.0.0.1:6379/0"
        return _url
    exe = shutil.which("redis-server")
    if exe is None:
        return None
    port = free_port()
    proc = subprocess.Popen(
        [exe, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def stop() -> None:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)

    atexit.register(stop)
    deadline = time.monotonic() + 10  # a safety net: it answers within ~50 ms
    while not answers(port):
        if proc.poll() is not None or time.monotonic() > deadline:
            return None
        time.sleep(0.01)
    _url = f"redis://127.0.0.1:{port}/0"
    return _url


@contextlib.contextmanager
def private_redis() -> Iterator[str | None]:
    """A redis-server of this test alone (for what would disturb a shared one), or None."""
    exe = shutil.which("redis-server")
    if exe is None:
        yield None
        return
    port = free_port()
    proc = subprocess.Popen(
        [exe, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10  # a safety net: it answers within ~50 ms
        while not answers(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                yield None
                return
            time.sleep(0.01)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(timeout=5)
