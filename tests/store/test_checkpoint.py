"""WAL checkpoints on a thread beside the writer: the log stays small, and closing leaves none."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from talkbridge.store._checkpoint import BATCHES_PER_CHECKPOINT, WalCheckpointer

ROW = b"x" * 100_000


def open_writer(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("CREATE TABLE IF NOT EXISTS t (x BLOB)")
    return conn


def commit_batches(writer: sqlite3.Connection, keeper: WalCheckpointer, count: int) -> None:
    for _ in range(count):
        writer.execute("BEGIN")
        writer.execute("INSERT INTO t VALUES (?)", (ROW,))
        writer.execute("COMMIT")
        keeper.committed()


def test_checkpoints_when_the_writer_idles_keep_the_log_small(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"
    writer = open_writer(path)
    keeper = WalCheckpointer(lambda: sqlite3.connect(path, isolation_level=None))
    keeper.start(writer)
    for _ in range(20):  # ~20 MB written in all: under the backstop, so only the thread helps
        commit_batches(writer, keeper, BATCHES_PER_CHECKPOINT)
        keeper.idle()
        keeper.drain()
    log_size = path.with_name(path.name + "-wal").stat().st_size
    assert log_size < 3 * BATCHES_PER_CHECKPOINT * len(ROW)  # restarted after each checkpoint
    keeper.close()
    writer.close()
    reopened = open_writer(path)
    assert reopened.execute("SELECT count(*) FROM t").fetchone() == (200,)  # nothing lost
    reopened.close()


def test_a_few_batches_do_not_start_a_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"
    writer = open_writer(path)
    opened: list[sqlite3.Connection] = []

    def connect() -> sqlite3.Connection:
        conn = sqlite3.connect(path, isolation_level=None)
        opened.append(conn)
        return conn

    keeper = WalCheckpointer(connect)
    keeper.start(writer)
    commit_batches(writer, keeper, BATCHES_PER_CHECKPOINT - 1)
    keeper.idle()
    keeper.drain()
    commit_batches(writer, keeper, 1)  # would restart the log had a checkpoint run
    size = path.with_name(path.name + "-wal").stat().st_size
    assert size > BATCHES_PER_CHECKPOINT * len(ROW)
    keeper.close()
    writer.close()


def test_closing_hands_the_last_checkpoint_to_the_writer(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"
    writer = open_writer(path)
    keeper = WalCheckpointer(lambda: sqlite3.connect(path, isolation_level=None))
    keeper.start(writer)
    commit_batches(writer, keeper, BATCHES_PER_CHECKPOINT)
    keeper.idle()
    keeper.drain()  # its connection has the log open now
    commit_batches(writer, keeper, 3)
    keeper.close()  # and closes it, so the writer's is the last one
    writer.close()
    assert not path.with_name(path.name + "-wal").exists()
