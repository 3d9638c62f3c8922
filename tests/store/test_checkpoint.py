"""WAL checkpoints on a thread beside the writer: the log stays small, and closing leaves none."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import pytest

from talkbridge.store._checkpoint import BATCHES_PER_CHECKPOINT, WalCheckpointer

ROW = b"x" * 100_000


def open_writer(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("CREATE TABLE IF NOT EXISTS t (x BLOB)")
    return conn


def started(path: Path) -> tuple[sqlite3.Connection, WalCheckpointer]:
    writer = open_writer(path)
    keeper = WalCheckpointer(lambda: sqlite3.connect(path, isolation_level=None), path)
    keeper.start(writer)
    return writer, keeper


def log_size(path: Path) -> int:
    return path.with_name(path.name + "-wal").stat().st_size


def commit_batches(writer: sqlite3.Connection, keeper: WalCheckpointer, count: int) -> None:
    for _ in range(count):
        writer.execute("BEGIN")
        writer.execute("INSERT INTO t VALUES (?)", (ROW,))
        writer.execute("COMMIT")
        keeper.committed()


def then_idle(keeper: WalCheckpointer) -> None:
    """The writer runs out of work; wait for the checkpoint that may start."""
    keeper.idle()
    keeper.drain()


def test_checkpoints_when_the_writer_idles_keep_the_log_small(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"
    writer, keeper = started(path)
    for _ in range(20):  # ~20 MB written in all: under the backstop, so only the thread helps
        commit_batches(writer, keeper, BATCHES_PER_CHECKPOINT)
        then_idle(keeper)
    assert log_size(path) < 3 * BATCHES_PER_CHECKPOINT * len(ROW)  # restarted each time
    keeper.close()
    writer.close()
    reopened = open_writer(path)
    assert reopened.execute("SELECT count(*) FROM t").fetchone() == (200,)  # nothing lost
    reopened.close()


def test_a_few_batches_do_not_start_a_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"
    writer, keeper = started(path)
    commit_batches(writer, keeper, BATCHES_PER_CHECKPOINT - 1)
    then_idle(keeper)
    commit_batches(writer, keeper, 1)  # would restart the log had a checkpoint run
    assert log_size(path) > BATCHES_PER_CHECKPOINT * len(ROW)
    keeper.close()
    writer.close()


def test_closing_hands_the_last_checkpoint_to_the_writer(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"
    writer, keeper = started(path)
    commit_batches(writer, keeper, BATCHES_PER_CHECKPOINT)
    then_idle(keeper)  # its connection has the log open now
    commit_batches(writer, keeper, 3)
    keeper.close()  # and closes it, so the writer's is the last one
    writer.close()
    assert not path.with_name(path.name + "-wal").exists()


def test_a_failing_checkpoint_names_its_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The warning comes from the writer process, where nothing else says which store it is."""
    path = tmp_path / "db.sqlite"
    writer = open_writer(path)

    def refused() -> sqlite3.Connection:
        raise sqlite3.OperationalError("database or disk is full")

    keeper = WalCheckpointer(refused, path)
    with caplog.at_level(logging.WARNING, logger="talkbridge.store"):
        keeper.start(writer)
        keeper.close()  # the thread gave up already: nothing to wait for
    writer.close()
    assert caplog.messages == [
        f"no checkpoint thread for the sqlite store at {path}: database or disk is full"
    ]
