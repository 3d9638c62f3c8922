"""Fixtures shared by the whole suite."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from talkbridge.store import SqliteStore

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require(condition: bool, why: str) -> None:
    """Skip locally when a peer is missing; under CI a missing peer is a failure."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"{why} (CI=true: missing peers fail instead of skipping)")
    pytest.skip(why)


@pytest.fixture
async def sqlite_store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    store = SqliteStore(tmp_path / "talkbridge.db")
    await store.open()
    yield store
    await store.close()


from tests.store.conftest import BACKENDS, Backend  # noqa: E402 - it needs `require`, above


@pytest.fixture(params=sorted(BACKENDS))
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    """Each store backend in turn, over data of its own (made as a new process would)."""
    made = BACKENDS[request.param](tmp_path)
    yield made
    if made.cleanup is not None:
        await made.cleanup()
