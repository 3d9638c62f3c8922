"""The SQLite writer in its own process: it outlives no parent, survives no kill unnoticed, and
does not stop for the signals meant for the bridge."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from talkbridge.errors import StoreError
from talkbridge.store import SqliteStore
from talkbridge.store._process import ProcessWriter

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="the writer process needs fork")


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    store = SqliteStore(tmp_path / "talkbridge.db")
    await store.open()
    yield store
    await store.close()


def _child(store: SqliteStore) -> int:
    writer = store._writer
    assert isinstance(writer, ProcessWriter)
    assert writer._pid is not None
    return writer._pid


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie still answers kill(0); the fork server reaps its children, so this is brief.
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(") ", 1)[1].startswith("Z")


async def _wait_gone(pid: int) -> None:
    # The child is not ours to wait for (the fork server is its parent): poll until it is gone.
    async with asyncio.timeout(10):
        while not _gone(pid):  # noqa: ASYNC110 - another process's exit: nothing to await
            await asyncio.sleep(0.02)


async def test_the_writer_runs_in_another_process_and_ends_with_close(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "x.db")
    await store.open()
    pid = _child(store)
    assert pid != os.getpid()
    await store.set_state("k", "v")
    await store.close()
    await _wait_gone(pid)
    assert store._writer.running is False


async def test_the_writer_ignores_ctrl_c_and_sigterm(db: SqliteStore) -> None:
    # Both reach the whole process group; the bridge still drains through its store after them.
    pid = _child(db)
    os.kill(pid, signal.SIGINT)
    os.kill(pid, signal.SIGTERM)
    await db.set_state("after", "signals")
    assert await db.get_state("after") == "signals"


async def test_a_killed_writer_fails_waiting_calls_with_a_clear_error(db: SqliteStore) -> None:
    pid = _child(db)
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(StoreError, match=r"talkbridge\.db.*writer process .* exited unexpectedly"):
        async with asyncio.timeout(10):
            while True:  # the first calls may still be in flight when the socket closes
                await db.get_state("k")
    with pytest.raises(StoreError, match="not open"):
        await db.set_state("k", "v")


async def test_a_store_can_open_again_after_its_writer_died(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "x.db")
    await store.open()
    await store.set_state("kept", "yes")
    os.kill(_child(store), signal.SIGKILL)
    with pytest.raises(StoreError):
        async with asyncio.timeout(10):
            while True:
                await store.get_state("kept")
    await store.close()
    await store.open()
    try:
        assert await store.get_state("kept") == "yes"
    finally:
        await store.close()


async def test_an_argument_that_cannot_be_sent_fails_alone(db: SqliteStore) -> None:
    unsendable = db._writer.submit(db._ops.set_state, "k", lambda: None)
    fine = db._writer.submit(db._ops.set_state, "k2", "v2")
    with pytest.raises(TypeError, match="set_state: argument cannot be sent"):
        await unsendable
    assert await fine is None
    assert await db.get_state("k2") == "v2"


async def test_only_store_operations_cross_to_the_writer(db: SqliteStore) -> None:
    with pytest.raises(TypeError, match="only store operations"):
        db._writer.submit(lambda: None)


async def test_the_writer_ends_when_its_parent_is_killed(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import asyncio, sys
        sys.path[:0] = {[p for p in sys.path if p]!r}
        from talkbridge.store import SqliteStore

        async def main():
            store = SqliteStore({str(tmp_path / "x.db")!r})
            await store.open()
            print(store._writer._pid, flush=True)
            await asyncio.Event().wait()

        asyncio.run(main())
        """
    )
    parent = await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, stdout=subprocess.PIPE
    )
    try:
        assert parent.stdout is not None
        child = int(await parent.stdout.readline())
        assert not _gone(child)
    finally:
        parent.kill()
        await parent.wait()
    await _wait_gone(child)


def test_writes_queued_before_close_are_committed(tmp_path: Path) -> None:
    async def write_and_close() -> None:
        store = SqliteStore(tmp_path / "x.db")
        await store.open()
        for i in range(500):
            store.queue_history("t", "user", f"m{i}", "u", f"text {i}")
        await store.close()

    async def read() -> int:
        store = SqliteStore(tmp_path / "x.db", writer="thread")
        await store.open()
        try:
            return len(await store.history("t", limit=1000))
        finally:
            await store.close()

    asyncio.run(write_and_close())
    assert asyncio.run(read()) == 500


async def test_a_relative_path_is_the_callers_not_the_fork_servers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The fork server keeps the working directory it started in; the caller may have moved on.
    for folder in ("first", "second"):
        (tmp_path / folder).mkdir()
        monkeypatch.chdir(tmp_path / folder)
        store = SqliteStore("relative.db")
        await store.open()
        try:
            await store.set_state("folder", folder)
        finally:
            await store.close()
    for folder in ("first", "second"):
        check = SqliteStore(tmp_path / folder / "relative.db", writer="thread")
        await check.open()
        try:
            assert await check.get_state("folder") == folder
        finally:
            await check.close()
