"""Group commit: one owner of the sqlite3 connection runs what coroutines queue for it in batches.

Why: SQLite must never block the event loop, and a commit (an fsync in WAL mode at checkpoints,
always a lock round) per operation would cap throughput far below what the bridge needs. So every
call is an `(operation, args, token)` on a queue; the owner drains the queue, runs the whole batch
in one transaction, commits once, and resolves every token's future in one go.

The owner is a thread (`GroupCommitWriter`) or a child process (`talkbridge.store._process`);
both run batches with `BatchRunner`. A thread shares the GIL with the event loop: SQLite releases
it around each statement and must wait to get it back while the loop computes, so in practice the
batch runs only when the loop idles. A process commits on the other core meanwhile.

A batch first runs without savepoints, so the common case costs nothing extra. If any operation
raises, the transaction is rolled back and the batch re-run with one SAVEPOINT per operation, so
only the failing operation's future gets the exception and the others commit. Operations must
therefore only touch the database and caches that `on_rollback` resets.

Measured and rejected: one `json_each` statement per run of like calls (SQLite re-parses the JSON
per column: 50% more writer CPU) and a free-running checkpoint thread (the WAL never resets under
a steady write load). The writer process does checkpoint on a second thread, but only once it
has run out of work (`talkbridge.store._checkpoint`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import sqlite3
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

log = logging.getLogger("talkbridge.store")


class BulkOp:
    """An operation whose queued calls of one batch run together: `run` takes every call's
    arguments (in queue order) and returns one result per call."""

    def __init__(self, name: str, phase: int, run: Callable[[list[tuple[Any, ...]]], list[Any]]):
        self.name = name
        self.phase = phase
        self.run = run

    def __call__(self, *args: Any) -> Any:  # one call alone (the isolated slow path)
        return self.run([args])[0]

    def __repr__(self) -> str:
        return f"BulkOp({self.name})"


Token = Any
"""Who waits for an operation: a future (thread writer), a request number (process writer), or
None for a write nobody awaits."""
_Item = tuple[Callable[..., Any] | None, tuple[Any, ...], Token]
_Result = tuple[Token, BaseException | None, Any]

MAX_BATCH = 4096
"""Upper bound of operations per transaction, so one huge backlog does not delay every reply."""


def deliver(results: list[_Result]) -> None:
    """Resolve the futures of a batch (on the event loop)."""
    for fut, exc, value in results:
        settle(fut, exc, value)


def settle(fut: asyncio.Future[Any] | None, exc: BaseException | None, value: Any) -> None:
    """Tell the caller of one operation its outcome (the log, if nobody waits for it)."""
    if fut is None:  # submitted without waiting: nobody to tell but the log
        if exc is not None:
            log.error("a store write failed: %s", exc)
        return
    if fut.done():  # the caller was cancelled; the operation ran anyway
        return
    if exc is None:
        fut.set_result(value)
    else:
        fut.set_exception(exc)


_STORAGE_ERRORS = frozenset(
    {
        sqlite3.SQLITE_FULL,
        sqlite3.SQLITE_IOERR,
        sqlite3.SQLITE_BUSY,
        sqlite3.SQLITE_LOCKED,
        sqlite3.SQLITE_READONLY,
        sqlite3.SQLITE_CORRUPT,
        sqlite3.SQLITE_NOTADB,
        sqlite3.SQLITE_CANTOPEN,
        sqlite3.SQLITE_PROTOCOL,
    }
)


def _storage_trouble(exc: BaseException) -> bool:
    """Whether `exc` (as `map_error` left it: the sqlite3 error is its cause) says that the
    database file itself fails, not the operation."""
    cause = exc if isinstance(exc, sqlite3.Error) else exc.__cause__
    code = getattr(cause, "sqlite_errorcode", None) if isinstance(cause, sqlite3.Error) else None
    return isinstance(code, int) and code & 0xFF in _STORAGE_ERRORS


class BatchRunner:
    """Runs batches of queued operations on one connection, one transaction per batch."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        *,
        on_rollback: Callable[[], None],
        map_error: Callable[[Exception], Exception],
    ) -> None:
        self._conn = conn
        self._on_rollback = on_rollback
        self._map_error = map_error
        self.failing: str | None = None
        """Why writes fail on the file itself (a full disk, a lock held elsewhere, an I/O error,
        a corrupt page), until a batch commits a change again: `/healthz` shows it. A write that
        is refused for what it asks (a constraint) is no trouble of the store's."""

    def run(self, batch: list[_Item]) -> list[_Result]:
        changes = self._conn.total_changes
        try:
            results = self._run_batch(batch)
        except Exception as exc:  # a bug here must not strand the callers
            return [(token, exc, None) for _, _, token in batch]
        trouble = next((e for _, e, _ in results if e is not None and _storage_trouble(e)), None)
        if trouble is not None:
            self.failing = f"writes are failing: {trouble}"
        elif self._conn.total_changes != changes:
            self.failing = None  # a write went through
        return results

    def close(self) -> Exception | None:
        try:
            self._conn.close()
        except Exception as exc:
            return self._map_error(exc)
        return None

    def _run_batch(self, batch: list[_Item]) -> list[_Result]:
        conn = self._conn
        try:
            conn.execute("BEGIN")
            results = self._run_grouped(batch)
            conn.execute("COMMIT")
            return results
        except Exception:
            self._abort()
        return self._run_isolated(batch)

    @staticmethod
    def _run_grouped(batch: list[_Item]) -> list[_Result]:
        bulk: dict[BulkOp, list[_Item]] = {}
        others: list[_Item] = []
        for item in batch:
            fn = item[0]
            if isinstance(fn, BulkOp):
                bulk.setdefault(fn, []).append(item)
            else:
                others.append(item)
        results: list[_Result] = []
        for op in sorted(bulk, key=lambda o: o.phase):
            items = bulk[op]
            values = op.run([args for _, args, _ in items])
            results.extend(
                (token, None, value) for (_, _, token), value in zip(items, values, strict=True)
            )
        results.extend((token, None, fn(*args)) for fn, args, token in others)  # type: ignore[misc]
        return results

    def _abort(self) -> None:
        self._on_rollback()
        if self._conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                self._conn.execute("ROLLBACK")

    def _fail_all(self, batch: list[_Item], exc: Exception) -> list[_Result]:
        self._abort()
        err = self._map_error(exc)
        return [(token, err, None) for _, _, token in batch]

    def _run_isolated(self, batch: list[_Item]) -> list[_Result]:
        """The slow path: one SAVEPOINT per operation, so a failure stays with its operation."""
        conn = self._conn
        results: list[_Result] = []
        try:
            conn.execute("BEGIN")
            for fn, args, token in batch:
                assert fn is not None
                conn.execute("SAVEPOINT op")
                try:
                    value = fn(*args)
                except Exception as exc:
                    self._on_rollback()
                    if not conn.in_transaction:  # SQLite gave up the whole transaction
                        return self._fail_all(batch, exc)
                    conn.execute("ROLLBACK TO op")
                    conn.execute("RELEASE op")
                    results.append((token, self._map_error(exc), None))
                else:
                    conn.execute("RELEASE op")
                    results.append((token, None, value))
            conn.execute("COMMIT")
        except Exception as exc:
            return self._fail_all(batch, exc)
        return results


class QueueingWriter:
    """What the store's coroutines see: `submit` and `submit_nowait`, batched per loop turn."""

    flush_at: int | None = None
    """Hand the outbox over as soon as it holds this many operations, not only at the end of the
    loop turn: lets a writer that runs in parallel start on a long turn's writes early."""

    def __init__(self, *, not_running: Callable[[], Exception]) -> None:
        self._not_running = not_running
        self._outbox: list[_Item] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._accepting = False

    @property
    def running(self) -> bool:
        return self._accepting

    def health(self) -> dict[str, Any]:
        """For `/healthz`: `up`, or `down` (closed, or its owner gone for good)."""
        return {"state": "up"} if self._accepting else {"state": "down", "error": "not open"}

    async def start(self) -> None:
        raise NotImplementedError

    async def stop(self) -> None:
        raise NotImplementedError

    def submit(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """Queue `fn(*args)` for the writer; the future resolves after its batch commits."""
        if not self._accepting:
            raise self._not_running()
        op = self._op(fn)
        fut: asyncio.Future[T] = self._loop.create_future()  # type: ignore[union-attr]
        self._enqueue((op, args, self._token(fut)))
        return fut

    def submit_nowait(self, fn: Callable[..., Any], *args: Any) -> None:
        """Queue `fn(*args)` without waiting for it; it runs before anything queued later."""
        if not self._accepting:
            raise self._not_running()
        self._enqueue((self._op(fn), args, None))

    def _op(self, fn: Callable[..., Any]) -> Any:
        """How the writer is told which operation to run."""
        return fn

    def _token(self, fut: asyncio.Future[Any]) -> Token:
        return fut

    def _enqueue(self, item: _Item) -> None:
        # Everything queued in one turn of the event loop crosses to the writer as one list: one
        # wake-up of the writer per loop turn, not one per operation.
        outbox = self._outbox
        if not outbox:
            self._loop.call_soon(self._flush)  # type: ignore[union-attr]
        outbox.append(item)
        if self.flush_at is not None and len(outbox) >= self.flush_at:
            self._outbox = []  # the flush already scheduled finds the next ones
            self._send(outbox)

    def _flush(self) -> None:
        if self._outbox:
            items, self._outbox = self._outbox, []
            self._send(items)

    def _send(self, items: list[_Item]) -> None:
        raise NotImplementedError


class GroupCommitWriter(QueueingWriter):
    """Runs queued operations on one thread in group-committed transactions."""

    def __init__(
        self,
        *,
        name: str,
        connect: Callable[[], sqlite3.Connection],
        on_rollback: Callable[[], None],
        map_error: Callable[[Exception], Exception],
        not_running: Callable[[], Exception],
    ) -> None:
        super().__init__(not_running=not_running)
        self._name = name
        self._connect = connect
        self._on_rollback = on_rollback
        self._map_error = map_error
        self._queue: queue.SimpleQueue[list[_Item]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._runner: BatchRunner | None = None

    def health(self) -> dict[str, Any]:
        failing = None if self._runner is None else self._runner.failing
        if self._accepting and failing is not None:
            return {"state": "down", "error": failing}
        return super().health()

    async def start(self) -> None:
        """Start the thread and wait until it has opened the database (or failed to)."""
        self._loop = loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = loop.create_future()
        self._thread = threading.Thread(
            target=self._run, args=(ready,), name=self._name, daemon=True
        )
        self._thread.start()
        try:
            await ready
        except BaseException:
            self._thread.join()
            raise
        self._accepting = True

    async def stop(self) -> None:
        """Refuse new operations, finish the queued ones, close the connection, end the thread."""
        if not self._accepting or self._loop is None:
            return
        self._accepting = False
        done: asyncio.Future[None] = self._loop.create_future()
        self._flush()
        self._queue.put([(None, (), done)])
        await done
        if self._thread is not None:
            self._thread.join()

    def _send(self, items: list[_Item]) -> None:
        self._queue.put(items)

    # -- writer thread ----------------------------------------------------------------------

    def _post(self, results: list[_Result]) -> None:
        assert self._loop is not None
        if not any(fut is not None or exc is not None for fut, exc, _ in results):
            return  # only fire-and-forget writes that succeeded: no need to wake the loop
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            self._loop.call_soon_threadsafe(deliver, results)

    def _run(self, ready: asyncio.Future[None]) -> None:
        try:
            conn = self._connect()
        except Exception as exc:
            self._post([(ready, exc, None)])
            return
        runner = BatchRunner(conn, on_rollback=self._on_rollback, map_error=self._map_error)
        self._runner = runner
        self._post([(ready, None, None)])
        get, get_nowait = self._queue.get, self._queue.get_nowait
        while True:
            batch = list(get())
            try:
                while len(batch) < MAX_BATCH:
                    batch.extend(get_nowait())
            except queue.Empty:
                pass
            stop = batch[-1][0] is None
            stop_item = batch.pop() if stop else None
            if batch:
                self._post(runner.run(batch))
            if stop_item is not None:
                self._post([(stop_item[2], runner.close(), None)])
                return
