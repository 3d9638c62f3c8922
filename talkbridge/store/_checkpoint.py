"""WAL checkpoints beside the writer, not inside its commits.

SQLite copies the write-ahead log back into the database file when the log reaches
`wal_autocheckpoint` pages, inside the COMMIT that crossed the mark: with the bridge's
writes (a random history-index page per message) that was a 3-10 ms stall every ~300 messages,
and every caller waiting for that commit (an inbound message's acceptance) waited with it. Here a
thread of the writer process, on a connection of its own, runs PASSIVE checkpoints when the
writer runs out of work after a few batches. A checkpoint and the writer's next commits proceed
side by side (SQLite releases the GIL in both); the log restarts from its beginning at the first
commit after a checkpoint that caught up. `wal_autocheckpoint` stays as the backstop, set higher,
for a writer that never idles.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("talkbridge.store")

BATCHES_PER_CHECKPOINT = 10
"""Measured with `benchmarks/core.py`: more lets each checkpoint grow past the writer's idle gap."""
BACKSTOP_PAGES = 8000
"""The writer checkpoints inline past this (32 MiB of log at 4 KiB pages): if it never idles."""
LOG_SIZE_LIMIT = 64 << 20
"""A log that grew in a burst is truncated back to this when it restarts."""


class WalCheckpointer:
    def __init__(self, connect: Callable[[], sqlite3.Connection], path: Path | str) -> None:
        self._connect = connect
        self._path = path
        """The database file, named in the warnings (they come from the writer process)."""
        self._batches = 0
        self._wanted = threading.Condition()
        self._pending = False
        self._closing = False
        self._thread: threading.Thread | None = None

    def start(self, writer: sqlite3.Connection) -> None:
        writer.execute(f"PRAGMA wal_autocheckpoint = {BACKSTOP_PAGES}")
        writer.execute(f"PRAGMA journal_size_limit = {LOG_SIZE_LIMIT}")
        self._thread = threading.Thread(target=self._run, name="wal-checkpoint", daemon=True)
        self._thread.start()

    def committed(self) -> None:
        """The writer committed a batch."""
        self._batches += 1

    def idle(self) -> None:
        """The writer has nothing queued: a checkpoint now overlaps the fewest commits."""
        if self._batches < BATCHES_PER_CHECKPOINT or self._thread is None:
            return
        self._batches = 0
        with self._wanted:
            self._pending = True
            self._wanted.notify()

    def drain(self) -> None:
        """Wait until the checkpoint asked for (if any) is done."""
        with self._wanted:
            self._wanted.wait_for(lambda: not self._pending or self._thread is None)

    def close(self) -> None:
        """Stop the thread and close its connection, so the writer's own close is the last one
        (SQLite then checkpoints everything and removes the log)."""
        thread = self._thread
        if thread is None:
            return
        with self._wanted:
            self._closing = True
            self._wanted.notify_all()
        thread.join()

    def _run(self) -> None:
        try:
            conn = self._connect()
        except Exception as exc:  # the writer goes on; its backstop checkpoints inline
            log.warning("no checkpoint thread for the sqlite store at %s: %s", self._path, exc)
            self._stopped()
            return
        try:
            while True:
                with self._wanted:
                    self._wanted.wait_for(lambda: self._pending or self._closing)
                    if self._closing:
                        return
                try:
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                except sqlite3.Error as exc:  # busy or failing disk: the backstop remains
                    log.warning(
                        "checkpoint of the sqlite store at %s failed (the writer checkpoints "
                        "itself past %d pages of log): %s",
                        self._path,
                        BACKSTOP_PAGES,
                        exc,
                    )
                with self._wanted:
                    self._pending = False
                    self._wanted.notify_all()
        finally:
            conn.close()
            self._stopped()

    def _stopped(self) -> None:
        with self._wanted:
            self._thread = None
            self._pending = False
            self._wanted.notify_all()
