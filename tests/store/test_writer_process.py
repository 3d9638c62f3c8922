"""The SQLite writer in its own process: it outlives no parent, survives no kill unnoticed, and
does not stop for the signals meant for the bridge."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from talkbridge.errors import StoreError
from talkbridge.store import SqliteStore, _process
from talkbridge.store._process import ProcessWriter

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="the writer process needs fork")


@pytest.fixture
def db(sqlite_store: SqliteStore) -> SqliteStore:
    return sqlite_store


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
    """Wait for another process's exit: it is not our child, but a pidfd becomes readable when
    it ends (Linux 5.3+)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    loop = asyncio.get_running_loop()
    ended = loop.create_future()
    loop.add_reader(fd, lambda: ended.done() or ended.set_result(None))
    try:
        await asyncio.wait_for(ended, 10)
    finally:
        loop.remove_reader(fd)
        os.close(fd)


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


async def test_a_killed_writer_is_replaced_and_calls_in_flight_fail_clearly(
    db: SqliteStore, caplog: pytest.LogCaptureFixture
) -> None:
    await db.set_state("kept", "yes")
    writer = db._writer
    assert isinstance(writer, ProcessWriter)
    dead = _child(db)
    in_flight = asyncio.gather(*(db.get_state("kept") for _ in range(50)), return_exceptions=True)
    os.kill(dead, signal.SIGKILL)
    await asyncio.wait_for(writer.restarted.wait(), 10)
    # Each call either ran before the kill or failed saying what happened; none hangs.
    for outcome in await in_flight:
        if isinstance(outcome, BaseException):
            assert isinstance(outcome, StoreError)
            assert re.search(r"talkbridge\.db.*writer process .* exited unexpectedly", str(outcome))
        else:
            assert outcome == "yes"
    assert _child(db) != dead
    assert await db.get_state("kept") == "yes"  # committed before the kill: still there
    await db.set_state("after", "restart")
    assert await db.get_state("after") == "restart"
    assert "replaced by" in caplog.text


async def test_close_during_a_replacement_ends_it(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "x.db")
    await store.open()
    writer = store._writer
    assert isinstance(writer, ProcessWriter)
    os.kill(_child(store), signal.SIGKILL)  # dies within the restart pause: the new one waits
    await store.close()
    assert not writer.running and not writer.restarted.is_set()


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


def _parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(") ", 1)[1].split()[1])


def test_a_forked_copy_of_the_bridge_starts_its_own_fork_server(tmp_path: Path) -> None:
    # A pre-forking server forks its workers after imports (and maybe after a first store):
    # two processes writing requests to one fork server's socket would mix them up.
    async def write(path: Path, value: str) -> int:
        """The pid of the process that started the fork server of the store's writer."""
        store = SqliteStore(path)
        await store.open()
        try:
            await store.set_state("who", value)
            return _parent_of(_parent_of(_child(store)))
        finally:
            await store.close()

    assert asyncio.run(write(tmp_path / "parent.db", "parent")) == os.getpid()
    pid = os.fork()
    if pid == 0:  # the copy: its writer must come from a fork server of its own
        code = 1
        try:
            code = 0 if asyncio.run(write(tmp_path / "copy.db", "copy")) == os.getpid() else 2
        except BaseException as exc:
            print(f"in the copy: {exc!r}", file=sys.stderr, flush=True)
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


async def test_writes_nobody_waited_for_reach_the_next_writer_when_one_dies(
    db: SqliteStore, caplog: pytest.LogCaptureFixture
) -> None:
    """A reply's history entry, its id map and the message's completion are written without
    waiting: a writer killed before committing them must not take them along."""
    writer = db._writer
    assert isinstance(writer, ProcessWriter)
    await db.append_history("web\x1ft1", "user", "before", "Ada", "committed")
    dead = _child(db)
    os.kill(dead, signal.SIGSTOP)  # it reads nothing more, commits nothing more
    for i in range(100):
        db.queue_history("web\x1ft1", "assistant", f"r{i}", "bridge", f"reply {i}")
    await db.map_id("web", "m1", "r0")
    sent = asyncio.ensure_future(db.get_state("anything"))  # in the same frames: flushed
    await asyncio.wait([sent], timeout=0)
    os.kill(dead, signal.SIGKILL)
    await asyncio.wait_for(writer.restarted.wait(), 10)
    with pytest.raises(StoreError, match="exited unexpectedly"):
        await sent  # a caller that waits is told, and may try again itself
    entries = await db.history("web\x1ft1", limit=500)
    assert [e.message_id for e in entries] == ["before", *(f"r{i}" for i in range(100))]
    assert [e.seq for e in entries] == list(range(1, 102))
    assert await db.lookup_id("web", "m1") == "r0"
    assert "(101 unconfirmed writes sent to it again)" in caplog.text


async def test_results_confirm_the_writes_sent_before_them(
    db: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a writer that dies has to hand on stays small: every result confirms what was sent
    before it, and a run of writes nobody waits for asks for a result of its own."""
    monkeypatch.setattr(_process, "SYNC_AFTER_FRAMES", 3)
    writer = db._writer
    assert isinstance(writer, ProcessWriter)
    for i in range(10):
        db.queue_history("k", "assistant", f"r{i}", "bridge", "x")
        writer._flush()  # a frame each
    assert writer._syncing  # more than 3 frames unconfirmed: a sync is on its way
    assert len(await db.history("k", limit=20)) == 10
    assert len(writer._unconfirmed) <= 1  # only the frame of that last call may remain
    assert not writer._syncing


def test_the_writer_processes_leave_no_socket_open_for_the_collector(tmp_path: Path) -> None:
    # Under `-W default` each socket the fork server or a writer child left to the collector
    # printed a ResourceWarning (`unclosed <socket.socket …>`) as the bridge stopped.
    script = textwrap.dedent(
        f"""
        import asyncio, sys
        sys.path[:0] = {[p for p in sys.path if p]!r}
        from talkbridge.store import SqliteStore

        async def main():
            store = SqliteStore({str(tmp_path / "x.db")!r})
            await store.open()
            await store.set_state("k", "v")
            await store.close()

        asyncio.run(main())
        """
    )
    env = {**os.environ, "PYTHONWARNINGS": "default"}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "ResourceWarning" not in done.stderr, done.stderr
