"""The `store` fixture: one parametrized point, so every contract test runs on every backend.

Add a backend by adding a `Backend` to `BACKENDS`. Redis: a unique key prefix per test, and a
cleanup that deletes the keys (on the server answering 6379, or one the tests start). `reopen`
stands for a process restart: it closes the current store and opens a new one over the same data.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from talkbridge.store import SqliteStore, Store
from tests.conftest import require
from tests.peers.redis import redis_url


@dataclass
class Backend:
    """Makes stores over one backing data set (a file, a key prefix)."""

    make: Callable[[], Store]
    cleanup: Callable[[], Awaitable[None]] | None = None


def _sqlite(tmp_path: Path) -> Backend:
    path = tmp_path / "db" / "talkbridge.db"  # "db/" does not exist yet: the store must make it
    return Backend(make=lambda: SqliteStore(path))


def _sqlite_thread(tmp_path: Path) -> Backend:
    """The writer on a thread: where forking is not available."""
    path = tmp_path / "db" / "talkbridge.db"
    return Backend(make=lambda: SqliteStore(path, writer="thread"))


def _redis(tmp_path: Path) -> Backend:
    url = redis_url()
    require(url is not None, "no redis-server answers on 127.0.0.1:6379 and none is installed")
    assert url is not None
    from redis.asyncio import Redis

    from talkbridge.store.redis import RedisKeys, RedisStore

    prefix = f"tbtest-{uuid.uuid4().hex[:12]}"

    async def cleanup() -> None:
        client = Redis.from_url(url)
        try:
            keys = [k async for k in client.scan_iter(match=RedisKeys(prefix).pattern(), count=500)]
            if keys:
                await client.delete(*keys)
        finally:
            await client.aclose()

    return Backend(make=lambda: RedisStore(url, prefix=prefix), cleanup=cleanup)


BACKENDS: dict[str, Callable[[Path], Backend]] = {
    "sqlite": _sqlite,
    "sqlite-thread": _sqlite_thread,
    "redis": _redis,
}

Reopen = Callable[[], Awaitable[Store]]


@dataclass
class _Current:
    backend: Backend
    store: Store


_CURRENT = pytest.StashKey[_Current]()


@pytest.fixture(params=sorted(BACKENDS))
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    backend = BACKENDS[request.param](tmp_path)
    current = _Current(backend, backend.make())
    await current.store.open()
    request.node.stash[_CURRENT] = current
    try:
        yield current.store
    finally:
        await current.store.close()
        if backend.cleanup is not None:
            await backend.cleanup()


@pytest.fixture
def reopen(store: Store, request: pytest.FixtureRequest) -> Reopen:
    """Simulate a restart: close the store and return a freshly opened one on the same data."""
    current: _Current = request.node.stash[_CURRENT]

    async def _reopen() -> Store:
        await current.store.close()
        current.store = current.backend.make()
        await current.store.open()
        return current.store

    return _reopen
