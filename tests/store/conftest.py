"""The `store` fixture: one parametrized point, so every contract test runs on every backend.

Add a backend by adding a `Backend` to `BACKENDS` (Redis will: a unique key prefix per test, and a
cleanup that deletes the keys). `reopen` stands for a process restart: it closes the current store
and opens a new one over the same data.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from talkbridge.store import SqliteStore, Store


@dataclass
class Backend:
    """Makes stores over one backing data set (a file, a key prefix)."""

    make: Callable[[], Store]


def _sqlite(tmp_path: Path) -> Backend:
    path = tmp_path / "db" / "talkbridge.db"  # "db/" does not exist yet: the store must make it
    return Backend(make=lambda: SqliteStore(path))


BACKENDS: dict[str, Callable[[Path], Backend]] = {"sqlite": _sqlite}

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
    yield current.store
    await current.store.close()


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
