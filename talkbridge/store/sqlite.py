"""The embedded store: one SQLite file in WAL mode, written by one group-committing writer.

All SQL runs in the writer (a child process by default, `talkbridge.store._process`; or a thread,
`GroupCommitWriter`); the coroutines here only validate arguments, queue the operation and await
its future. Reads go through the same writer, so they always see every write queued before them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import fcntl
import functools
import json
import os
import sqlite3
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any, Literal, get_args

from talkbridge.errors import PairingExpiredError, StoreError
from talkbridge.message import NormalizedMessage, utcnow
from talkbridge.store import _process
from talkbridge.store._checkpoint import WalCheckpointer
from talkbridge.store._writer import BulkOp, GroupCommitWriter, QueueingWriter
from talkbridge.store.base import (
    DELETED,
    EXPIRED_PAIRINGS_KEPT,
    FORGET_EXPIRED_PER_CALL,
    Appended,
    FailedSend,
    HistoryEntry,
    HookDelivery,
    Pairing,
    Pruned,
    Retention,
    Role,
    check_history_window,
    state_deadline,
)
from talkbridge.store.seen import SeenFilter

MEMORY = ":memory:"
SCHEMA_VERSION = 6

_MIGRATIONS: tuple[str, ...] = (
    # version 1
    """
    CREATE TABLE inbound (
        id INTEGER PRIMARY KEY,
        connection_id TEXT NOT NULL,
        message_id TEXT NOT NULL,
        body TEXT,  -- the message JSON while pending; NULL once completed (kept for dedupe)
        UNIQUE (connection_id, message_id)
    );
    CREATE INDEX inbound_pending ON inbound (id) WHERE body IS NOT NULL;

    CREATE TABLE history (
        id INTEGER PRIMARY KEY,
        thread_key TEXT NOT NULL,
        seq INTEGER NOT NULL,
        role TEXT NOT NULL,
        message_id TEXT NOT NULL,
        sender TEXT NOT NULL,
        text TEXT NOT NULL,
        created_at TEXT NOT NULL,
        data TEXT,
        UNIQUE (thread_key, seq)
    );

    CREATE TABLE id_map (
        connection_id TEXT NOT NULL,
        native_id TEXT NOT NULL,
        message_id TEXT NOT NULL,
        UNIQUE (connection_id, native_id)
    );
    CREATE INDEX id_map_message ON id_map (connection_id, message_id);

    CREATE TABLE sent (
        connection_id TEXT NOT NULL,
        idempotency_key TEXT NOT NULL,
        message_ids TEXT NOT NULL,
        PRIMARY KEY (connection_id, idempotency_key)
    ) WITHOUT ROWID;

    CREATE TABLE failed_sends (
        id INTEGER PRIMARY KEY,
        connection_id TEXT NOT NULL,
        thread_id TEXT NOT NULL,
        text TEXT NOT NULL,
        reason TEXT NOT NULL,
        failed_at TEXT NOT NULL
    );

    CREATE TABLE trusted (
        connection_id TEXT NOT NULL,
        channel_user_id TEXT NOT NULL,
        PRIMARY KEY (connection_id, channel_user_id)
    ) WITHOUT ROWID;

    CREATE TABLE pairings (
        id INTEGER PRIMARY KEY,
        code_key TEXT NOT NULL UNIQUE,  -- the code casefolded: codes match case-insensitively
        code TEXT NOT NULL,
        connection_id TEXT NOT NULL,
        channel_user_id TEXT NOT NULL,
        display_name TEXT NOT NULL,
        created_at TEXT NOT NULL,
        approved INTEGER NOT NULL DEFAULT 0
    );
    CREATE UNIQUE INDEX pairings_pending ON pairings (connection_id, channel_user_id)
        WHERE approved = 0;

    CREATE TABLE state (
        key TEXT PRIMARY KEY,
        value TEXT NOT NULL
    ) WITHOUT ROWID;
    """,
    # version 2: the durable hook queue (talkbridge.hooks.durable)
    """
    CREATE TABLE hook_queue (
        id INTEGER PRIMARY KEY,
        app_id TEXT NOT NULL,
        handler TEXT NOT NULL,
        conversation TEXT NOT NULL,
        event_id TEXT NOT NULL,
        body TEXT NOT NULL,
        created_at REAL NOT NULL,  -- epoch seconds
        next_at REAL NOT NULL,     -- due (or leased until), epoch seconds
        attempts INTEGER NOT NULL DEFAULT 0,
        dead INTEGER NOT NULL DEFAULT 0,
        last_error TEXT
    );
    CREATE INDEX hook_queue_live ON hook_queue (app_id, handler, conversation, id)
        WHERE dead = 0;
    CREATE INDEX hook_queue_app ON hook_queue (app_id, handler, id);
    CREATE INDEX hook_queue_created ON hook_queue (created_at);
    """,
    # version 3: retention (`prune`): `sent` gets an ordered id, prune calls leave marks
    """
    CREATE TABLE sent_v3 (
        id INTEGER PRIMARY KEY,
        connection_id TEXT NOT NULL,
        idempotency_key TEXT NOT NULL,
        message_ids TEXT NOT NULL,
        UNIQUE (connection_id, idempotency_key)
    );
    INSERT INTO sent_v3 (connection_id, idempotency_key, message_ids)
        SELECT connection_id, idempotency_key, message_ids FROM sent;
    DROP TABLE sent;
    ALTER TABLE sent_v3 RENAME TO sent;

    -- At `at` (epoch seconds) a prune call saw ids up to `max_id` in `tbl`: once `at` is older
    -- than the retention, so is every row up to `max_id`. No timestamp (nor its index) per row.
    CREATE TABLE prune_marks (
        tbl TEXT NOT NULL,
        at REAL NOT NULL,
        max_id INTEGER NOT NULL
    );
    """,
    # version 4: `append_history_once`'s records get a table of their own. In the id map they
    # cost a row and two index entries each (one of them, by message id, never read), and
    # `lookup_native` had to tell them apart from real mappings.
    """
    CREATE TABLE once_keys (
        connection_id TEXT NOT NULL,
        native_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        PRIMARY KEY (connection_id, native_id)
    ) WITHOUT ROWID;
    INSERT OR IGNORE INTO once_keys (connection_id, native_id, seq)
        SELECT connection_id, substr(native_id, 7), CAST(message_id AS INTEGER) FROM id_map
        WHERE substr(native_id, 1, 6) = char(31) || 'once' || char(31);
    DELETE FROM id_map WHERE substr(native_id, 1, 6) = char(31) || 'once' || char(31);
    """,
    # version 5: pending pairings expire. Codes still pending from before had no lifetime:
    # they expired when they were given (their senders get new ones by writing again).
    """
    ALTER TABLE pairings ADD COLUMN expires_at INTEGER;  -- microseconds since 1970 (UTC), or NULL
    UPDATE pairings SET expires_at = CAST(strftime('%s', created_at) AS INTEGER) * 1000000
        + (CASE WHEN substr(created_at, 20, 1) = '.' THEN CAST(substr(created_at, 21, 6) AS INTEGER)
           ELSE 0 END)  -- created_at is ISO, in UTC, with or without microseconds
        WHERE approved = 0;
    CREATE INDEX pairings_expiry ON pairings (expires_at) WHERE approved = 0;
    """,
    # version 6: state may expire (`set_state(..., keep_for=...)`): read as gone past its
    # deadline, deleted by `prune`. Only expiring rows are in the index.
    """
    ALTER TABLE state ADD COLUMN expires_at REAL;  -- epoch seconds; NULL: kept for good
    CREATE INDEX state_expiry ON state (expires_at) WHERE expires_at IS NOT NULL;
    """,
)

_ROLES = frozenset(get_args(Role))
_CACHE_MAX = 100_000
"""Entries kept in the per-thread seq cache and the trust cache before they are dropped."""
TRUST_CACHE_SECONDS = 5.0
"""How long a sender found trusted is taken as such without asking the writer again: how late
a revocation made by another process (`talkbridge pair revoke`) reaches a running bridge."""

_ACCEPT_HEAD = "INSERT INTO inbound (connection_id, message_id, body)"
_PENDING = "SELECT body FROM inbound WHERE body IS NOT NULL ORDER BY id"
_COUNT_INBOUND = "SELECT count(*) FROM inbound"
_INBOUND_KEYS_AFTER = (
    "SELECT id, connection_id, message_id FROM inbound WHERE id > ? ORDER BY id LIMIT ?"
)
SEEN_STEP_ROWS = 20_000
"""Rows a filter build reads per operation (~40 ms): other writes go on in between."""
_LAST_SEQ = "SELECT seq FROM history WHERE thread_key = ? ORDER BY seq DESC LIMIT 1"
_RECENTLY_APPENDED = (
    "SELECT 1 FROM (SELECT role, message_id FROM history WHERE thread_key = ?"
    " ORDER BY seq DESC LIMIT 1000) WHERE role = ? AND message_id = ?"
)
"""A replayed append was made, if at all, just before its writer died: among the latest."""
_APPEND_HEAD = (
    "INSERT INTO history (thread_key, seq, role, message_id, sender, text, created_at, data)"
)
_HISTORY_COLS = "seq, role, message_id, sender, text, created_at, data"
_HISTORY_LATEST = (
    f"SELECT {_HISTORY_COLS} FROM history WHERE thread_key = ? ORDER BY seq DESC LIMIT ?"
)
_HISTORY_BEFORE = (
    f"SELECT {_HISTORY_COLS} FROM history WHERE thread_key = ? AND seq < ? "
    "ORDER BY seq DESC LIMIT ?"
)
_HISTORY_AFTER = (
    f"SELECT {_HISTORY_COLS} FROM history WHERE thread_key = ? AND seq > ? ORDER BY seq LIMIT ?"
)
_ERASED_DATA = json.dumps({DELETED: True})
_FORGET_HISTORY = (
    "UPDATE history SET sender = '', text = '', data = ? WHERE thread_key = ?"
    " AND (data IS NULL OR data != ?) AND (message_id IN {ids}"
    " OR (data IS NOT NULL AND json_extract(data, '$.edit_of') IN {ids}))"
)
_MAP_ID_HEAD = "INSERT OR REPLACE INTO id_map (connection_id, native_id, message_id)"
_LOOKUP_ID = "SELECT message_id FROM id_map WHERE connection_id = ? AND native_id = ?"
_ONCE_HEAD = "INSERT INTO once_keys (connection_id, native_id, seq)"
_ONCE_SEQ = "SELECT seq FROM once_keys WHERE connection_id = ? AND native_id = ?"
_LOOKUP_NATIVE = (
    "SELECT native_id FROM id_map WHERE connection_id = ? AND message_id = ? ORDER BY rowid LIMIT 1"
)
_SENT_RESULT = "SELECT message_ids FROM sent WHERE connection_id = ? AND idempotency_key = ?"
_RECORD_SENT_HEAD = "INSERT OR REPLACE INTO sent (connection_id, idempotency_key, message_ids)"
_RECORD_FAILED = (
    "INSERT INTO failed_sends (connection_id, thread_id, text, reason, failed_at)"
    " VALUES (?, ?, ?, ?, ?)"
)
_FAILED = (
    "SELECT connection_id, thread_id, text, reason, failed_at FROM failed_sends"
    " ORDER BY id DESC LIMIT ?"
)
_PRUNABLE = {"inbound": " AND body IS NULL", "sent": ""}
"""Tables pruned by marks, with the condition a row must meet: pending messages stay."""
_AGED_MARK = "SELECT max(max_id) FROM prune_marks WHERE tbl = ? AND at <= ?"
_SPENT_MARKS = "DELETE FROM prune_marks WHERE tbl = ? AND at <= ?"
_MARK = "INSERT INTO prune_marks (tbl, at, max_id) SELECT ?, ?, coalesce(max(id), 0) FROM {table}"
_PRUNE_FAILED = (
    "DELETE FROM failed_sends WHERE id IN (SELECT id FROM failed_sends WHERE failed_at < ? LIMIT ?)"
)
_IS_TRUSTED = "SELECT 1 FROM trusted WHERE connection_id = ? AND channel_user_id = ?"
_TRUST = "INSERT OR IGNORE INTO trusted (connection_id, channel_user_id) VALUES (?, ?)"
_DISTRUST = "DELETE FROM trusted WHERE connection_id = ? AND channel_user_id = ?"
_PAIRING_COLS = (
    "code, connection_id, channel_user_id, display_name, created_at, approved, expires_at"
)
_PENDING_PAIRING = (
    f"SELECT {_PAIRING_COLS} FROM pairings"
    " WHERE connection_id = ? AND channel_user_id = ? AND approved = 0"
)
_INSERT_PAIRING = (
    "INSERT INTO pairings (code_key, code, connection_id, channel_user_id, display_name,"
    " created_at, expires_at, approved) VALUES (?, ?, ?, ?, ?, ?, ?, 0)"
)
_FORGET_EXPIRED = (
    "DELETE FROM pairings WHERE id IN (SELECT id FROM pairings"
    " WHERE approved = 0 AND expires_at <= ? LIMIT ?)"
)
_CODE_IN_USE = "SELECT 1 FROM pairings WHERE code_key = ?"
_PAIRING_BY_CODE = f"SELECT {_PAIRING_COLS} FROM pairings WHERE code_key = ?"
_APPROVE = "UPDATE pairings SET approved = 1 WHERE code_key = ?"
_FORGET_PAIRING = "DELETE FROM pairings WHERE code_key = ?"
_PAIRINGS_ALL = f"SELECT {_PAIRING_COLS} FROM pairings ORDER BY id"
_PAIRINGS_PENDING = (
    f"SELECT {_PAIRING_COLS} FROM pairings"
    " WHERE approved = 0 AND (expires_at IS NULL OR expires_at > ?) ORDER BY id"
)
_GET_STATE = "SELECT value FROM state WHERE key = ? AND (expires_at IS NULL OR expires_at > ?)"
_SET_STATE = (
    "INSERT INTO state (key, value, expires_at) VALUES (?, ?, ?)"
    " ON CONFLICT (key) DO UPDATE SET value = excluded.value, expires_at = excluded.expires_at"
)
_DELETE_STATE = "DELETE FROM state WHERE key = ?"
_PRUNE_STATE = (
    "DELETE FROM state WHERE key IN"
    " (SELECT key FROM state WHERE expires_at <= ? ORDER BY expires_at LIMIT ?)"
)

_HOOK_COLS = (
    "id, app_id, handler, conversation, event_id, body, created_at, attempts, dead, last_error"
)
_HOOK_INSERT = (
    "INSERT INTO hook_queue (app_id, handler, conversation, event_id, body, created_at, next_at)"
    " VALUES (?, ?, ?, ?, ?, ?, ?)"
)
_HOOK_COUNT = "SELECT count(*) FROM hook_queue WHERE app_id = ? AND handler = ?"
_HOOK_TRIM = (
    "DELETE FROM hook_queue WHERE app_id = ? AND handler = ? AND id IN (SELECT id FROM hook_queue"
    " WHERE app_id = ? AND handler = ? ORDER BY id LIMIT ?)"
)
# The head (oldest live delivery) of each (handler, conversation), when it is due.
_HOOK_CLAIM = (
    f"SELECT {_HOOK_COLS} FROM hook_queue WHERE id IN ("
    " SELECT min(id) FROM hook_queue WHERE app_id = ? AND dead = 0 AND handler IN ({marks})"
    " GROUP BY handler, conversation"
    ") AND next_at <= ? ORDER BY id LIMIT ?"
)
_HOOK_ACK = "DELETE FROM hook_queue WHERE id = ?"
_HOOK_FAIL = (
    "UPDATE hook_queue SET attempts = attempts + 1, last_error = ?,"
    " next_at = coalesce(?, next_at), dead = ? WHERE id = ?"
)
_HOOK_RELEASE = "UPDATE hook_queue SET next_at = ? WHERE id = ? AND dead = 0"
_HOOK_PURGE = "DELETE FROM hook_queue WHERE created_at < ?"
_HOOK_CLEAR = "DELETE FROM hook_queue WHERE app_id = ?"


def _hook_filter(app_id: str | None, dead: bool | None) -> tuple[str, tuple[Any, ...]]:
    clauses: list[str] = []
    params: list[Any] = []
    if app_id is not None:
        clauses.append("app_id = ?")
        params.append(app_id)
    if dead is not None:
        clauses.append("dead = ?")
        params.append(int(dead))
    where = (" WHERE " + " AND ".join(clauses)) if clauses else " WHERE 1"
    return where, tuple(params)


def _delivery(row: tuple[Any, ...]) -> HookDelivery:
    id_, app_id, handler, conversation, event_id, body, created, attempts, dead, error = row
    return HookDelivery(
        id=id_,
        app_id=app_id,
        handler=handler,
        conversation=conversation,
        event_id=event_id,
        body=body,
        created_at=datetime.fromtimestamp(created, UTC),
        attempts=attempts,
        dead=bool(dead),
        last_error=error,
    )


def _epoch(value: datetime, what: str) -> float:
    if value.tzinfo is None:
        raise ValueError(f"{what} must be timezone-aware, got naive {value.isoformat()}")
    return value.timestamp()


_CHUNK_PARAMS = 30_000
"""Bound parameters per statement: SQLite allows 32,766."""

HistoryRow = tuple[str, Role, str, str, str, dict[str, Any]]
"""thread_key, role, message_id, sender, text, data (encoded by the writer, off the loop)"""


def _chunks(rows: list[tuple[Any, ...]], width: int) -> list[list[tuple[Any, ...]]]:
    size = max(1, _CHUNK_PARAMS // width)
    return [rows[i : i + size] for i in range(0, len(rows), size)]


def _values(count: int, width: int) -> str:
    row = "(" + ",".join("?" * width) + ")"
    return ",".join([row] * count)


_KNOWN_KEYS = "k JOIN inbound i ON i.connection_id = k.c AND i.message_id = k.m"
"""Inbound rows matching the `k` keys: a join, because `(a, b) IN (VALUES ...)` scans the whole
table (SQLite 3.40 does not use the unique index for row values), so dedupe grew with every
message ever received."""
_KNOWN_INBOUND = f"'' FROM {_KNOWN_KEYS}"
_KNOWN_ONCE = "o.seq FROM k JOIN once_keys o ON o.connection_id = k.c AND o.native_id = k.m"


def _keys(count: int) -> str:
    return f"WITH k(c, m) AS (VALUES {_values(count, 2)})"


def _insert_many(cur: sqlite3.Cursor, head: str, rows: list[tuple[Any, ...]], width: int) -> None:
    """One multi-row INSERT per chunk: one GIL hand-off instead of one per row."""
    for chunk in _chunks(rows, width):
        cur.execute(f"{head} VALUES {_values(len(chunk), width)}", [v for r in chunk for v in r])


def _iso(value: datetime, what: str) -> str:
    if value.tzinfo is None:
        raise ValueError(f"{what} must be timezone-aware, got naive {value.isoformat()}")
    return value.astimezone(UTC).isoformat()


def _code_key(code: str) -> str:
    return code.strip().casefold()


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def _micros(value: datetime, what: str) -> int:
    """An instant as whole microseconds since 1970: exact, and ordered in SQL."""
    if value.tzinfo is None:
        raise ValueError(f"{what} must be timezone-aware, got naive {value.isoformat()}")
    return (value - _EPOCH) // _MICROSECOND


def _pairing(row: tuple[Any, ...]) -> Pairing:
    code, connection_id, channel_user_id, display_name, created_at, approved, expires = row
    return Pairing(
        code=code,
        connection_id=connection_id,
        channel_user_id=channel_user_id,
        display_name=display_name,
        created_at=datetime.fromisoformat(created_at),
        approved=bool(approved),
        expires_at=None if expires is None else _EPOCH + expires * _MICROSECOND,
    )


class _SqliteOps:
    """The SQL of every operation; runs only in the writer (its process or thread), inside its
    transaction."""

    def __init__(self, path: Path | str) -> None:
        self.path = path
        self._cur: sqlite3.Cursor
        self._next_seq: dict[str, int] = {}
        self._seen_builds: dict[int, tuple[SeenFilter, int]] = {}
        """Filters being built (`seen_begin`), with the last row id read."""
        self._builds = 0

    def connect(self) -> sqlite3.Connection:
        try:
            if isinstance(self.path, Path):
                self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, isolation_level=None)
        except (OSError, sqlite3.Error) as exc:
            raise self._unopenable(exc) from exc
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            # Statement journals of the multi-row writes stay in memory: on disk they were a
            # temporary file created and deleted in /var/tmp for each batch.
            conn.execute("PRAGMA temp_store = MEMORY")
            conn.execute("PRAGMA busy_timeout = 5000")
            self._migrate(conn)
        except (sqlite3.Error, StoreError) as exc:
            conn.close()
            if isinstance(exc, StoreError):
                raise
            raise self._unopenable(exc) from exc
        self._cur = conn.cursor()
        return conn

    def _unopenable(self, exc: Exception) -> StoreError:
        why = _unwritable(self.path) if isinstance(self.path, Path) else None
        detail = f"{exc} ({why})" if why else str(exc)
        return StoreError(f"cannot open the sqlite store at {self.path}: {detail}")

    def connect_checkpointer(self) -> sqlite3.Connection:
        """A second connection for `WalCheckpointer`, opened after the writer's (migrated)."""
        conn = sqlite3.connect(self.path, isolation_level=None)
        conn.execute("PRAGMA busy_timeout = 5000")
        return conn

    def _migrate(self, conn: sqlite3.Connection) -> None:
        (version,) = conn.execute("PRAGMA user_version").fetchone()
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"the sqlite store at {self.path} has schema version {version}, newer than the"
                f" {SCHEMA_VERSION} this talkbridge knows; upgrade talkbridge"
            )
        for target in range(version + 1, SCHEMA_VERSION + 1):
            # executescript commits first, so BEGIN inside the script keeps each step atomic.
            conn.executescript(
                f"BEGIN; {_MIGRATIONS[target - 1]}\nPRAGMA user_version = {target}; COMMIT;"
            )

    def reset_caches(self) -> None:
        self._next_seq.clear()

    # -- inbound and history (bulk: every call of a batch in a few statements) ------------------

    def write_messages(self, calls: list[tuple[Any, ...]]) -> list[Any]:
        """Accepts (`("accept", cid, mid, body, history_row | None)`), history appends
        (`("append", history_row)`, or `("replay", history_row)` when a writer that died may have
        made it), and once-only appends (`("once", cid, native_id, row)`), in queue order, so a
        thread's seqs follow arrival."""
        cur = self._cur
        accepted = self._known(_KNOWN_INBOUND, {(c[1], c[2]) for c in calls if c[0] == "accept"})
        recorded = self._known(_KNOWN_ONCE, {(c[1], c[2]) for c in calls if c[0] == "once"})
        inbound_rows: list[tuple[Any, ...]] = []
        history_rows: list[tuple[Any, ...]] = []
        once_rows: list[tuple[Any, ...]] = []
        results: list[Any] = []
        now = datetime.now(UTC)
        stamp = now.isoformat()
        for call in calls:
            kind = call[0]
            if kind == "accept":
                _, cid, mid, body, row = call
                if (cid, mid) in accepted:
                    results.append(False)
                    continue
                accepted[cid, mid] = ""
                inbound_rows.append((cid, mid, body))
                results.append(True)
                if row is not None:
                    self._history_row(row, now, stamp, history_rows)
            elif kind == "once":
                _, cid, native_id, row = call
                earlier = recorded.get((cid, native_id))
                if earlier is not None:
                    results.append(Appended(earlier, None))
                    continue
                entry = self._history_row(row, now, stamp, history_rows)
                recorded[cid, native_id] = entry.seq
                once_rows.append((cid, native_id, entry.seq))
                results.append(Appended(entry.seq, entry))
            elif kind == "replay" and self._appended_already(call[1]):
                results.append(None)  # the writer before this one made it
            else:
                results.append(self._history_row(call[1], now, stamp, history_rows))
        _insert_many(cur, _ACCEPT_HEAD, inbound_rows, 3)
        _insert_many(cur, _APPEND_HEAD, history_rows, 8)
        _insert_many(cur, _ONCE_HEAD, once_rows, 3)
        return results

    def _appended_already(self, row: HistoryRow) -> bool:
        """Whether an append sent again after its writer died is among its thread's latest."""
        thread_key, role, message_id = row[0], row[1], row[2]
        return (
            self._cur.execute(_RECENTLY_APPENDED, (thread_key, role, message_id)).fetchone()
            is not None
        )

    def _known(self, source: str, keys: set[tuple[str, str]]) -> dict[tuple[str, str], Any]:
        """Which (connection id, id) keys `source` already holds, with the value it gives."""
        found: dict[tuple[str, str], Any] = {}
        for chunk in _chunks(list(keys), 2):
            rows = self._cur.execute(
                f"{_keys(len(chunk))} SELECT k.c, k.m, {source}", [v for r in chunk for v in r]
            )
            found.update(((c, m), value) for c, m, value in rows)
        return found

    def _history_row(
        self, row: HistoryRow, now: datetime, stamp: str, out: list[tuple[Any, ...]]
    ) -> HistoryEntry:
        thread_key, role, message_id, sender, text, data = row
        seq = self._next_seq.get(thread_key)
        if seq is None:
            last = self._cur.execute(_LAST_SEQ, (thread_key,)).fetchone()
            seq = last[0] + 1 if last else 1
            if len(self._next_seq) >= _CACHE_MAX:
                self._next_seq.clear()
        self._next_seq[thread_key] = seq + 1
        data_json = json.dumps(data) if data else None
        out.append((thread_key, seq, role, message_id, sender, text, stamp, data_json))
        return HistoryEntry(seq, thread_key, role, message_id, sender, text, now, data)

    def complete_many(self, calls: list[tuple[Any, ...]]) -> list[None]:
        for chunk in _chunks(calls, 2):
            self._cur.execute(
                f"{_keys(len(chunk))} UPDATE inbound SET body = NULL WHERE body IS NOT NULL"
                f" AND id IN (SELECT i.id FROM {_KNOWN_KEYS})",
                [v for r in chunk for v in r],
            )
        return [None] * len(calls)

    def pending_inbound(self) -> list[NormalizedMessage]:
        rows = self._cur.execute(_PENDING).fetchall()
        return [NormalizedMessage.model_validate_json(body) for (body,) in rows]

    def seen_begin(self, capacity: int) -> int:
        """Start building a `SeenFilter` in steps (a large inbox takes seconds: at once, it would
        hold up every write queued behind it); the build's number."""
        (held,) = self._cur.execute(_COUNT_INBOUND).fetchone()
        self._builds += 1
        self._seen_builds[self._builds] = (SeenFilter(max(capacity, 2 * held)), 0)
        return self._builds

    def seen_step(self, build: int, limit: int) -> bool:
        """Add the next `limit` rows; True while there may be more."""
        seen, after = self._seen_builds[build]
        rows = self._cur.execute(_INBOUND_KEYS_AFTER, (after, limit)).fetchall()
        for _, connection_id, message_id in rows:
            seen.add(connection_id, message_id)
        if rows:
            self._seen_builds[build] = (seen, rows[-1][0])
        return len(rows) == limit

    def seen_end(self, build: int) -> tuple[bytes, int]:
        seen, _ = self._seen_builds.pop(build)
        return seen.dump()

    def history(
        self, thread_key: str, limit: int, after_seq: int, before_seq: int = 0
    ) -> list[HistoryEntry]:
        if after_seq:
            rows = self._cur.execute(_HISTORY_AFTER, (thread_key, after_seq, limit)).fetchall()
        elif before_seq:
            rows = self._cur.execute(_HISTORY_BEFORE, (thread_key, before_seq, limit)).fetchall()
            rows.reverse()
        else:
            rows = self._cur.execute(_HISTORY_LATEST, (thread_key, limit)).fetchall()
            rows.reverse()
        fromiso, loads = datetime.fromisoformat, json.loads
        return [
            HistoryEntry(
                seq, thread_key, role, mid, sender, text, fromiso(at), loads(data) if data else {}
            )
            for seq, role, mid, sender, text, at, data in rows
        ]

    def forget_history(self, thread_key: str, message_ids: tuple[str, ...]) -> int:
        forgotten = 0
        for chunk in _chunks([(i,) for i in message_ids], 2):  # each id is bound twice
            ids = f"({', '.join('?' * len(chunk))})"
            chunk_ids = [i for (i,) in chunk]
            self._cur.execute(
                _FORGET_HISTORY.format(ids=ids),
                (_ERASED_DATA, thread_key, _ERASED_DATA, *chunk_ids, *chunk_ids),
            )
            forgotten += self._cur.rowcount
        return forgotten

    # -- id map -----------------------------------------------------------------------------

    def map_many(self, calls: list[tuple[Any, ...]]) -> list[None]:
        _insert_many(self._cur, _MAP_ID_HEAD, calls, 3)  # in order: a later remap wins
        return [None] * len(calls)

    def lookup(self, sql: str, *params: str | float) -> Any:
        row = self._cur.execute(sql, params).fetchone()
        return row[0] if row else None

    # -- outbound ---------------------------------------------------------------------------

    def record_sent_many(self, calls: list[tuple[Any, ...]]) -> list[None]:
        """Calls are (connection id, idempotency key, message ids): the ids are encoded here, in
        the writer, rather than on the event loop."""
        dumps = json.dumps
        rows = [(cid, key, dumps(ids)) for cid, key, ids in calls]
        _insert_many(self._cur, _RECORD_SENT_HEAD, rows, 3)
        return [None] * len(calls)

    def record_failed_send(self, f: FailedSend, failed_at: str) -> None:
        self._cur.execute(
            _RECORD_FAILED, (f.connection_id, f.thread_id, f.text, f.reason, failed_at)
        )

    def prune(
        self, now: float, cutoffs: dict[str, float], failed_before: str, limit: int
    ) -> Pruned:
        expired = self._cur.execute(_PRUNE_STATE, (now, limit)).rowcount
        pruned = self._prune_marked(now, cutoffs, failed_before, limit)
        return pruned._replace(expired_state=expired, more=pruned.more or expired >= limit)

    def _prune_marked(
        self, now: float, cutoffs: dict[str, float], failed_before: str, limit: int
    ) -> Pruned:
        cur = self._cur
        counts: dict[str, int] = {}
        more = False
        for table, condition in _PRUNABLE.items():
            (mark,) = cur.execute(_AGED_MARK, (table, cutoffs[table])).fetchone()
            count = 0
            if mark is not None:
                count = cur.execute(
                    f"DELETE FROM {table} WHERE id IN"
                    f" (SELECT id FROM {table} WHERE id <= ?{condition} LIMIT ?)",
                    (mark, limit),
                ).rowcount
                if count < limit:  # done up to the mark: the marks it covers are spent
                    cur.execute(_SPENT_MARKS, (table, cutoffs[table]))
                else:
                    more = True
            counts[table] = count
        failed = cur.execute(_PRUNE_FAILED, (failed_before, limit)).rowcount
        more = more or failed >= limit
        if not more:
            for table in _PRUNABLE:
                cur.execute(_MARK.format(table=table), (table, now))
        return Pruned(counts["inbound"], counts["sent"], failed, more)

    def failed_sends(self, limit: int) -> list[FailedSend]:
        return [
            FailedSend(conn, thread, text, reason, datetime.fromisoformat(at))
            for conn, thread, text, reason, at in self._cur.execute(_FAILED, (limit,)).fetchall()
        ]

    # -- trust and pairing ------------------------------------------------------------------

    def set_trusted(self, connection_id: str, channel_user_id: str, trusted: bool) -> None:
        self._cur.execute(_TRUST if trusted else _DISTRUST, (connection_id, channel_user_id))

    def create_pairing(
        self, pairing: Pairing, created_at: str, expires_at: int | None, forget_before: int
    ) -> Pairing:
        cur = self._cur
        row = cur.execute(
            _PENDING_PAIRING, (pairing.connection_id, pairing.channel_user_id)
        ).fetchone()
        if row:
            pending = _pairing(row)
            if not pending.expired(pairing.created_at):
                return pending
            cur.execute(_FORGET_PAIRING, (_code_key(pending.code),))  # a fresh code instead
        cur.execute(_FORGET_EXPIRED, (forget_before, FORGET_EXPIRED_PER_CALL))
        key = _code_key(pairing.code)
        if cur.execute(_CODE_IN_USE, (key,)).fetchone():
            raise StoreError("that pairing code is already in use; issue a new code")
        cur.execute(
            _INSERT_PAIRING,
            (
                key,
                pairing.code,
                pairing.connection_id,
                pairing.channel_user_id,
                pairing.display_name,
                created_at,
                expires_at,
            ),
        )
        return pairing

    def pairings(self, include_approved: bool, now: int) -> list[Pairing]:
        if include_approved:
            return [_pairing(row) for row in self._cur.execute(_PAIRINGS_ALL).fetchall()]
        return [_pairing(row) for row in self._cur.execute(_PAIRINGS_PENDING, (now,)).fetchall()]

    def _pairing_by_code(self, code: str) -> tuple[str, Pairing] | None:
        key = _code_key(code)
        row = self._cur.execute(_PAIRING_BY_CODE, (key,)).fetchone()
        return None if row is None else (key, _pairing(row))

    def approve_pairing(self, code: str, now: datetime) -> Pairing | None:
        """The pairing approved; as it was (pending) when it expired at `now`."""
        found = self._pairing_by_code(code)
        if found is None:
            return None
        key, pairing = found
        if pairing.expired(now):
            return pairing
        self._cur.execute(_APPROVE, (key,))
        self._cur.execute(_TRUST, (pairing.connection_id, pairing.channel_user_id))
        return dataclasses.replace(pairing, approved=True)

    def revoke_pairing(self, code: str) -> Pairing | None:
        found = self._pairing_by_code(code)
        if found is None:
            return None
        key, pairing = found
        self._cur.execute(_FORGET_PAIRING, (key,))
        if pairing.approved:  # a pending code trusted nobody: nothing to take back
            self._cur.execute(_DISTRUST, (pairing.connection_id, pairing.channel_user_id))
        return pairing

    # -- state ------------------------------------------------------------------------------

    def set_state(self, key: str, value: str, expires_at: float | None = None) -> None:
        self._cur.execute(_SET_STATE, (key, value, expires_at))

    def delete_state(self, key: str) -> None:
        self._cur.execute(_DELETE_STATE, (key,))

    # -- durable hook queue -----------------------------------------------------------------

    def enqueue_hook(
        self,
        app_id: str,
        handlers: tuple[str, ...],
        conversation: str,
        event_id: str,
        body: str,
        created_at: float,
        capacity: int,
    ) -> int:
        cur = self._cur
        dropped = 0
        for handler in handlers:
            cur.execute(
                _HOOK_INSERT,
                (app_id, handler, conversation, event_id, body, created_at, created_at),
            )
            (count,) = cur.execute(_HOOK_COUNT, (app_id, handler)).fetchone()
            if count > capacity:
                cur.execute(_HOOK_TRIM, (app_id, handler, app_id, handler, count - capacity))
                dropped += cur.rowcount
        return dropped

    def claim_hooks(
        self, app_id: str, handlers: tuple[str, ...], now: float, lease: float, limit: int
    ) -> list[HookDelivery]:
        marks = ",".join("?" * len(handlers))
        rows = self._cur.execute(
            _HOOK_CLAIM.format(marks=marks), (app_id, *handlers, now, limit)
        ).fetchall()
        if rows:
            ids = [r[0] for r in rows]
            self._cur.execute(
                f"UPDATE hook_queue SET next_at = ? WHERE id IN ({','.join('?' * len(ids))})",
                (lease, *ids),
            )
        return [_delivery(r) for r in rows]

    def hook_backlog(self, app_id: str | None, dead: bool | None, limit: int) -> list[HookDelivery]:
        where, params = _hook_filter(app_id, dead)
        sql = f"SELECT {_HOOK_COLS} FROM hook_queue{where} ORDER BY id LIMIT ?"
        return [_delivery(r) for r in self._cur.execute(sql, (*params, limit)).fetchall()]

    def replay_hooks(self, ids: tuple[int, ...] | None, now: float, app_id: str | None) -> int:
        where, params = _hook_filter(app_id, True)
        if ids is not None:
            where += f" AND id IN ({','.join('?' * len(ids))})"
            params = (*params, *ids)
        self._cur.execute(
            f"UPDATE hook_queue SET dead = 0, attempts = 0, next_at = ?{where}", (now, *params)
        )
        return self._cur.rowcount

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Any statement's rows: for tests and operators looking inside (`EXPLAIN`, pragmas)."""
        return self._cur.execute(sql, params).fetchall()

    def change(self, sql: str, *params: Any) -> int:
        self._cur.execute(sql, params)
        return self._cur.rowcount


def _history_row(
    thread_key: str,
    role: Role,
    message_id: str,
    sender: str,
    text: str,
    data: dict[str, Any] | None,
) -> HistoryRow:
    if role not in _ROLES:
        raise ValueError(f"role must be one of {sorted(_ROLES)}, got {role!r}")
    return (thread_key, role, message_id, sender, text, dict(data) if data else {})


def _bulk_ops(ops: _SqliteOps) -> dict[str, BulkOp]:
    return {
        op.name: op
        for op in (
            BulkOp("messages", 0, ops.write_messages),
            BulkOp("map_id", 1, ops.map_many),
            BulkOp("record_sent", 2, ops.record_sent_many),
            BulkOp("complete_inbound", 3, ops.complete_many),
        )
    }


def _replayed(item: Any) -> Any:
    """A write the writer that died may have made already, as sent to the next one: history
    appends are skipped if their entry is there (the id map, sent records and completions are
    the same written twice)."""
    name, args, token = item
    if name == "messages" and args[0] == "append":
        return name, ("replay", *args[1:]), token
    return item


def _unwritable(path: Path) -> str | None:
    """Why SQLite may not write `path` or its folder (where it keeps the `-wal` and `-shm` files
    beside it): said with its "unable to open database file", which names neither."""
    folder = path.parent
    for target, what in ((folder, f"the folder {folder}"), (path, f"the file {path}")):
        if target.exists() and not os.access(target, os.W_OK):
            try:
                read_only = bool(os.statvfs(target).f_flag & os.ST_RDONLY)
            except OSError:
                read_only = False
            return f"{what} is {'on a read-only file system' if read_only else 'not writable'}"
    return None


def _map_error(path: Path | str, exc: Exception) -> Exception:
    if isinstance(exc, sqlite3.Error):
        err = StoreError(f"sqlite store at {path}: {exc}")
        err.__cause__ = exc
        return err
    return exc


def _child_ops(path: Path | str) -> _process.ChildOps:
    """The writer process's own operations on the same file."""
    ops = _SqliteOps(path)
    bulk = _bulk_ops(ops)

    def resolve(name: str) -> Callable[..., Any]:
        found = bulk.get(name) or (None if name.startswith("_") else getattr(ops, name, None))
        if found is None:

            def unknown(*_: Any) -> None:
                raise StoreError(f"sqlite store at {path}: no operation named {name!r}")

            return unknown
        return found

    return _process.ChildOps(
        ops.connect,
        resolve,
        ops.reset_caches,
        functools.partial(_map_error, path),
        None if path == MEMORY else WalCheckpointer(ops.connect_checkpointer, path),
    )


def _serving_lock(path: Path) -> IO[str]:
    """The lock on `path.lock`, with our pid in it; a StoreError naming the holder's pid when
    another process (or another store of this one) holds it."""
    shown = f"sqlite:///{path}"
    try:
        lock = open(f"{path}.lock", "a+", encoding="utf-8")  # noqa: SIM115 - held till close
    except OSError as exc:
        raise StoreError(f"cannot open {path}.lock: {exc.strerror or exc}") from None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = lock.read().strip()
        lock.close()
        raise StoreError(
            f"the store {shown} is in use by another talkbridge run"
            + (f" (pid {holder})" if holder.isdigit() else "")
            + ": a SQLite store serves one bridge at a time (several share a redis:// store)"
        ) from None
    lock.truncate(0)
    lock.write(f"{os.getpid()}\n")
    lock.flush()
    return lock


class SqliteStore:
    """The `Store` on one SQLite file (or ":memory:", which lives only while the store is open).

    A cancelled call may still be applied: its operation is already queued for the writer.
    """

    trust_cache_seconds = TRUST_CACHE_SECONDS
    clock: Callable[[], float] = staticmethod(time.monotonic)
    """What the trust cache's times are read from."""

    def __init__(
        self, path: str | Path, *, writer: Literal["process", "thread"] | None = None
    ) -> None:
        self._path: Path | str = MEMORY if str(path) == MEMORY else Path(path)
        self._ops = ops = _SqliteOps(self._path)
        bulk = _bulk_ops(ops)
        self._messages = bulk["messages"]
        self._map = bulk["map_id"]
        self._sent = bulk["record_sent"]
        self._complete = bulk["complete_inbound"]
        self._in_process = (writer or "process") == "process" and _process.available()
        """The writer runs in a child process (the default), else on a thread."""
        self._writer = self._new_writer()
        self._trust: dict[tuple[str, str], float] = {}
        """Senders known trusted, until when (`clock()`)."""
        self._trust_gen = 0
        """Bumped by every trust write, so a read that raced a write does not fill the cache."""
        self._serving: IO[str] | None = None
        """The lock `lock_for_serving` took, held open until `close`."""
        self.wall_clock: Callable[[], float] = time.time
        """What `keep_for` deadlines of state are set and read by (see `Store.wall_clock`)."""

    def __repr__(self) -> str:
        return f"SqliteStore({str(self._path)!r})"

    @property
    def path(self) -> Path | str:
        return self._path

    def _new_writer(self) -> QueueingWriter:
        name = f"talkbridge-sqlite:{self._path}"

        def not_running() -> StoreError:
            return StoreError(f"the sqlite store at {self._path} is not open")

        if self._in_process:
            return _process.ProcessWriter(
                name=name,
                setup=_child_ops,
                replayed=_replayed,
                # Absolute: the child runs in the fork server's working directory.
                args=(self._path if self._path == MEMORY else Path(self._path).absolute(),),
                describe=f"sqlite store at {self._path}",
                not_running=not_running,
            )
        return GroupCommitWriter(
            name=name,
            connect=self._ops.connect,
            on_rollback=self._ops.reset_caches,
            map_error=functools.partial(_map_error, self._path),
            not_running=not_running,
        )

    async def open(self) -> None:
        if self._writer.running:
            return
        self._writer = self._new_writer()
        self._trust.clear()
        self._ops.reset_caches()
        await self._writer.start()

    async def close(self) -> None:
        try:
            await self._writer.stop()
        finally:
            if self._serving is not None:
                self._serving.close()  # releases the lock
                self._serving = None

    def lock_for_serving(self) -> None:
        """Make this the one store a bridge serves its file through, until `close` (the
        `Bridge` takes it at start). A second bridge on the file would take the first's
        messages under way for left over from a crash and answer them again, and number the
        same conversations' messages on its own. Commands that read or change a few things
        (`talkbridge pair`, `check`) take no lock and work beside it.

        The lock is on a `.lock` file beside the database, so it goes with the process however
        it ends. A StoreError names the pid holding it."""
        if self._serving is None and self._path != MEMORY:
            self._serving = _serving_lock(Path(self._path))

    def health(self) -> dict[str, Any]:
        return self._writer.health()

    # -- inbound ----------------------------------------------------------------------------

    def accept_inbound(
        self, message: NormalizedMessage, *, record_history: bool = False
    ) -> asyncio.Future[bool]:
        """Queued when called (not when awaited): the router relies on that ordering."""
        row = (
            _history_row(
                message.thread_key,
                "user",
                message.id,
                message.display_name or message.channel_user_id,
                message.text,
                {"edit_of": message.edit_of} if message.edit_of else None,
            )
            if record_history
            else None
        )
        body = message.model_dump_json()
        return self._writer.submit(
            self._messages, "accept", message.connection_id, message.id, body, row
        )

    async def complete_inbound(self, connection_id: str, message_id: str) -> None:
        self._writer.submit_nowait(self._complete, connection_id, message_id)

    async def pending_inbound(self) -> Sequence[NormalizedMessage]:
        return await self._writer.submit(self._ops.pending_inbound)

    async def seen_inbound(self, capacity: int) -> SeenFilter:
        build = await self._writer.submit(self._ops.seen_begin, capacity)
        while await self._writer.submit(self._ops.seen_step, build, SEEN_STEP_ROWS):
            pass
        return SeenFilter.restore(await self._writer.submit(self._ops.seen_end, build))

    # -- history ----------------------------------------------------------------------------

    async def append_history(
        self,
        thread_key: str,
        role: Role,
        message_id: str,
        sender: str,
        text: str,
        data: dict[str, Any] | None = None,
    ) -> HistoryEntry:
        row = _history_row(thread_key, role, message_id, sender, text, data)
        return await self._writer.submit(self._messages, "append", row)

    async def append_history_once(
        self,
        connection_id: str,
        native_id: str,
        thread_key: str,
        role: Role,
        sender: str,
        text: str,
        data: dict[str, Any] | None = None,
    ) -> Appended:
        row = _history_row(thread_key, role, native_id, sender, text, data)
        return await self._writer.submit(self._messages, "once", connection_id, native_id, row)

    def queue_history(
        self,
        thread_key: str,
        role: Role,
        message_id: str,
        sender: str,
        text: str,
        data: dict[str, Any] | None = None,
    ) -> None:
        row = _history_row(thread_key, role, message_id, sender, text, data)
        self._writer.submit_nowait(self._messages, "append", row)

    async def history(
        self, thread_key: str, *, limit: int = 50, after_seq: int = 0, before_seq: int = 0
    ) -> Sequence[HistoryEntry]:
        if not check_history_window(limit, after_seq, before_seq):
            return []
        return await self._writer.submit(
            self._ops.history, thread_key, limit, after_seq, before_seq
        )

    async def history_seq(self, connection_id: str, native_id: str) -> int | None:
        found: int | None = await self._writer.submit(
            self._ops.lookup, _ONCE_SEQ, connection_id, native_id
        )
        return found

    async def forget_history(self, thread_key: str, message_ids: Sequence[str]) -> int:
        if not message_ids:
            return 0
        forgotten: int = await self._writer.submit(
            self._ops.forget_history, thread_key, tuple(message_ids)
        )
        return forgotten

    # -- id map -----------------------------------------------------------------------------

    async def map_id(self, connection_id: str, native_id: str, message_id: str) -> None:
        self._writer.submit_nowait(self._map, connection_id, native_id, message_id)

    async def lookup_id(self, connection_id: str, native_id: str) -> str | None:
        found: str | None = await self._writer.submit(
            self._ops.lookup, _LOOKUP_ID, connection_id, native_id
        )
        return found

    async def lookup_native(self, connection_id: str, message_id: str) -> str | None:
        found: str | None = await self._writer.submit(
            self._ops.lookup, _LOOKUP_NATIVE, connection_id, message_id
        )
        return found

    # -- outbound ---------------------------------------------------------------------------

    async def sent_result(self, connection_id: str, idempotency_key: str) -> list[str] | None:
        found: str | None = await self._writer.submit(
            self._ops.lookup, _SENT_RESULT, connection_id, idempotency_key
        )
        if found is None:
            return None
        ids: list[str] = json.loads(found)
        return ids

    async def record_sent(
        self, connection_id: str, idempotency_key: str, message_ids: Sequence[str]
    ) -> None:
        self._writer.submit_nowait(self._sent, connection_id, idempotency_key, list(message_ids))

    async def record_failed_send(self, failure: FailedSend) -> None:
        failed_at = _iso(failure.failed_at, "FailedSend.failed_at")
        await self._writer.submit(self._ops.record_failed_send, failure, failed_at)

    async def failed_sends(self, limit: int = 100) -> Sequence[FailedSend]:
        """The latest `limit` failures, newest first."""
        if limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        return await self._writer.submit(self._ops.failed_sends, limit)

    async def prune(self, *, now: datetime, keep: Retention, limit: int = 10_000) -> Pruned:
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        at = _epoch(now, "now")
        cutoffs = {
            "inbound": at - keep.dedupe.total_seconds(),
            "sent": at - keep.sent.total_seconds(),
        }
        failed_before = _iso(now - keep.failed_sends, "now")
        return await self._writer.submit(self._ops.prune, at, cutoffs, failed_before, limit)

    # -- trust and pairing ------------------------------------------------------------------

    async def is_trusted(self, connection_id: str, channel_user_id: str) -> bool:
        # Only "trusted" is cached: an approval made by another process (`talkbridge pair
        # approve` while the bridge runs) must be seen at the sender's next message. And only
        # for `trust_cache_seconds`: so is a revocation (`talkbridge pair revoke`), soon after.
        key = (connection_id, channel_user_id)
        now = self.clock()
        if self._trust.get(key, 0.0) > now:
            return True
        gen = self._trust_gen
        row = await self._writer.submit(self._ops.lookup, _IS_TRUSTED, *key)
        trusted = row is not None
        if trusted and gen == self._trust_gen:
            if len(self._trust) >= _CACHE_MAX:
                self._trust.clear()
            self._trust[key] = now + self.trust_cache_seconds
        return trusted

    def _invalidate_trust(self, key: tuple[str, str] | None = None) -> None:
        self._trust_gen += 1
        if key is not None:
            self._trust.pop(key, None)

    async def set_trusted(self, connection_id: str, channel_user_id: str, trusted: bool) -> None:
        self._invalidate_trust((connection_id, channel_user_id))
        await self._writer.submit(self._ops.set_trusted, connection_id, channel_user_id, trusted)

    async def create_pairing(self, pairing: Pairing) -> Pairing:
        if pairing.approved:
            raise ValueError("create_pairing stores a pending pairing; got one already approved")
        if not _code_key(pairing.code):
            raise ValueError("a pairing code must not be empty")
        created_at = _iso(pairing.created_at, "Pairing.created_at")
        expires_at = (
            None
            if pairing.expires_at is None
            else _micros(pairing.expires_at, "Pairing.expires_at")
        )
        forget_before = _micros(pairing.created_at - EXPIRED_PAIRINGS_KEPT, "Pairing.created_at")
        return await self._writer.submit(
            self._ops.create_pairing, pairing, created_at, expires_at, forget_before
        )

    async def pairings(
        self, *, include_approved: bool = False, now: datetime | None = None
    ) -> Sequence[Pairing]:
        at = _micros(now or utcnow(), "now")
        return await self._writer.submit(self._ops.pairings, include_approved, at)

    async def approve_pairing(self, code: str, *, now: datetime | None = None) -> Pairing | None:
        at = now or utcnow()
        _micros(at, "now")  # a naive `now` is refused here, not in the writer
        self._invalidate_trust()
        approved: Pairing | None = await self._writer.submit(self._ops.approve_pairing, code, at)
        if approved is None:
            return None
        if not approved.approved:
            raise PairingExpiredError(approved)
        self._trust.pop((approved.connection_id, approved.channel_user_id), None)
        return approved

    async def revoke_pairing(self, code: str) -> Pairing | None:
        self._invalidate_trust()
        revoked: Pairing | None = await self._writer.submit(self._ops.revoke_pairing, code)
        if revoked is not None:
            self._trust.pop((revoked.connection_id, revoked.channel_user_id), None)
        return revoked

    # -- state ------------------------------------------------------------------------------

    async def get_state(self, key: str) -> str | None:
        now = self.wall_clock()
        found: str | None = await self._writer.submit(self._ops.lookup, _GET_STATE, key, now)
        return found

    async def set_state(self, key: str, value: str, *, keep_for: timedelta | None = None) -> None:
        expires_at = state_deadline(self.wall_clock(), keep_for)
        await self._writer.submit(self._ops.set_state, key, value, expires_at)

    async def delete_state(self, key: str) -> None:
        await self._writer.submit(self._ops.delete_state, key)

    # -- durable hook queue -----------------------------------------------------------------

    async def enqueue_hook_event(
        self,
        app_id: str,
        handlers: Sequence[str],
        conversation: str,
        event_id: str,
        body: str,
        created_at: datetime,
        *,
        capacity: int,
    ) -> int:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        created = _epoch(created_at, "created_at")
        return await self._writer.submit(
            self._ops.enqueue_hook,
            app_id,
            tuple(handlers),
            conversation,
            event_id,
            body,
            created,
            capacity,
        )

    async def claim_hook_deliveries(
        self,
        app_id: str,
        handlers: Sequence[str],
        *,
        now: datetime,
        lease_until: datetime,
        limit: int,
    ) -> Sequence[HookDelivery]:
        if not handlers or limit <= 0:
            return []
        return await self._writer.submit(
            self._ops.claim_hooks,
            app_id,
            tuple(handlers),
            _epoch(now, "now"),
            _epoch(lease_until, "lease_until"),
            limit,
        )

    async def ack_hook_delivery(self, delivery_id: int) -> None:
        await self._writer.submit(self._ops.change, _HOOK_ACK, delivery_id)

    async def fail_hook_delivery(
        self, delivery_id: int, error: str, *, retry_at: datetime | None
    ) -> None:
        retry = None if retry_at is None else _epoch(retry_at, "retry_at")
        await self._writer.submit(
            self._ops.change, _HOOK_FAIL, error, retry, int(retry is None), delivery_id
        )

    async def release_hook_delivery(self, delivery_id: int, *, now: datetime) -> None:
        await self._writer.submit(self._ops.change, _HOOK_RELEASE, _epoch(now, "now"), delivery_id)

    async def hook_backlog(
        self, *, app_id: str | None = None, dead: bool | None = None, limit: int = 1000
    ) -> Sequence[HookDelivery]:
        if limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        return await self._writer.submit(self._ops.hook_backlog, app_id, dead, limit)

    async def replay_hook_deliveries(
        self, delivery_ids: Sequence[int] | None, *, now: datetime, app_id: str | None = None
    ) -> int:
        ids = None if delivery_ids is None else tuple(int(i) for i in delivery_ids)
        if ids == ():
            return 0
        return await self._writer.submit(self._ops.replay_hooks, ids, _epoch(now, "now"), app_id)

    async def purge_hook_events(self, *, older_than: datetime) -> int:
        cutoff = _epoch(older_than, "older_than")
        return await self._writer.submit(self._ops.change, _HOOK_PURGE, cutoff)

    async def clear_hook_events(self, app_id: str) -> int:
        return await self._writer.submit(self._ops.change, _HOOK_CLEAR, app_id)
