"""What only the SQLite store promises: its file, its batching, its URL, its errors."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import pytest

from talkbridge.errors import ConfigError, StoreError
from talkbridge.store import HistoryEntry, Retention, SqliteStore, open_store
from talkbridge.store import sqlite as sqlite_module
from talkbridge.store._process import ProcessWriter
from talkbridge.store._writer import BatchRunner, GroupCommitWriter


@pytest.fixture
def db(sqlite_store: SqliteStore) -> SqliteStore:
    return sqlite_store


@pytest.fixture
async def thread_db(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    """A store whose writer is a thread: tests can hand it any callable, and patch the runner."""
    store = SqliteStore(tmp_path / "talkbridge.db", writer="thread")
    await store.open()
    yield store
    await store.close()


async def test_file_is_wal_normal_with_schema_version(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "x.db"
    store = SqliteStore(path)
    await store.open()
    try:
        [(sync,)] = await store._writer.submit(store._ops.query, "PRAGMA synchronous")
        assert sync == 1  # NORMAL
        [(temp,)] = await store._writer.submit(store._ops.query, "PRAGMA temp_store")
        assert temp == 2  # MEMORY: no temporary file per batch
        with sqlite3.connect(path) as peek:
            assert peek.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
            version = peek.execute("PRAGMA user_version").fetchone()[0]
            assert version == sqlite_module.SCHEMA_VERSION
    finally:
        await store.close()


async def test_history_queries_use_the_thread_index(tmp_path: Path) -> None:
    # Latest-N must not scan or sort the thread: cost independent of how long the thread is.
    store = SqliteStore(tmp_path / "x.db")
    await store.open()
    await store.close()
    with sqlite3.connect(tmp_path / "x.db") as peek:
        for sql in (
            sqlite_module._HISTORY_LATEST,
            sqlite_module._HISTORY_AFTER,
            sqlite_module._LAST_SEQ,
        ):
            plan = " ".join(
                row[3] for row in peek.execute(f"EXPLAIN QUERY PLAN {sql}", (1,) * sql.count("?"))
            )
            assert "SEARCH history USING" in plan and "(thread_key=?" in plan, plan
            assert "TEMP B-TREE" not in plan, plan


async def test_dedupe_and_completion_look_up_keys_by_index(sqlite_store: SqliteStore) -> None:
    # `(a, b) IN (VALUES ...)` made SQLite scan every inbound row ever received, per batch.
    for query in (
        f"{sqlite_module._keys(2)} SELECT k.c, k.m, {sqlite_module._KNOWN_INBOUND}",
        f"{sqlite_module._keys(2)} SELECT k.c, k.m, {sqlite_module._KNOWN_ONCE}",
        f"{sqlite_module._keys(2)} UPDATE inbound SET body = NULL WHERE body IS NOT NULL"
        f" AND id IN (SELECT i.id FROM {sqlite_module._KNOWN_KEYS})",
    ):
        rows = await sqlite_store._writer.submit(
            sqlite_store._ops.query, f"EXPLAIN QUERY PLAN {query}", ("x",) * 4
        )
        found = " | ".join(row[3] for row in rows)
        assert "SCAN inbound" not in found and "SCAN once_keys" not in found, found
        assert "SEARCH i USING" in found or "SEARCH o USING" in found, found


async def test_prune_keeps_rows_newer_than_the_mark_that_aged(tmp_path: Path) -> None:
    # Ages come from prune calls: rows that arrived after the aged mark wait for the next one.
    store = SqliteStore(tmp_path / "x.db")
    await store.open()
    keep = Retention(timedelta(days=1), timedelta(days=1), timedelta(days=1))
    t0 = datetime.now(UTC)
    try:
        await store.record_sent("tg", "old", ["1"])
        await store.prune(now=t0, keep=keep)
        await store.record_sent("tg", "new", ["2"])
        first = await store.prune(now=t0 + timedelta(days=1, hours=1), keep=keep)
        assert first.sent == 1
        assert await store.sent_result("tg", "old") is None
        assert await store.sent_result("tg", "new") == ["2"]
        second = await store.prune(now=t0 + timedelta(days=2, hours=2), keep=keep)
        assert second.sent == 1
        assert await store.sent_result("tg", "new") is None
        [(marks,)] = await store._writer.submit(
            store._ops.query, "SELECT count(*) FROM prune_marks"
        )
        assert marks == 2  # spent marks are dropped: one per table, from the last call
    finally:
        await store.close()


async def test_prune_deletes_the_state_rows_past_their_deadline(db: SqliteStore) -> None:
    keep = Retention(timedelta(days=7), timedelta(days=7), timedelta(days=30))
    t0 = 1_700_000_000.0
    db.wall_clock = lambda: t0
    await db.set_state("album:1", "an hour", keep_for=timedelta(hours=1))
    await db.set_state("album:2", "two hours", keep_for=timedelta(hours=2))
    await db.set_state("album:3", "three hours", keep_for=timedelta(hours=3))
    await db.set_state("offset", "for good")
    later = datetime.fromtimestamp(t0 + 2.5 * 3600, UTC)
    first = await db.prune(now=later, keep=keep, limit=1)
    assert (first.expired_state, first.more) == (1, True)  # the limit holds for state too
    second = await db.prune(now=later, keep=keep, limit=1)
    assert (second.expired_state, second.more) == (1, True)  # a full step: maybe more
    third = await db.prune(now=later, keep=keep, limit=1)
    assert (third.expired_state, third.more) == (0, False)
    rows = await db._writer.submit(db._ops.query, "SELECT key FROM state ORDER BY key")
    assert rows == [("album:3",), ("offset",)]


async def test_finding_state_that_expires_uses_its_index(db: SqliteStore) -> None:
    plan = await db._writer.submit(
        db._ops.query, f"EXPLAIN QUERY PLAN {sqlite_module._PRUNE_STATE}", (0.0, 10)
    )
    assert any("state_expiry" in row[-1] for row in plan), plan


async def test_unopenable_path_is_a_store_error_naming_it(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("I am a file, not a folder")
    store = SqliteStore(tmp_path / "file" / "x.db")
    with pytest.raises(StoreError, match=r"cannot open the sqlite store at .*file/x\.db"):
        await store.open()
    with pytest.raises(StoreError, match="not open"):
        await store.get_state("k")


async def test_a_file_that_is_not_a_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "junk.db"
    path.write_bytes(b"definitely not sqlite" * 100)
    with pytest.raises(StoreError, match=r"junk\.db.*not a database"):
        await SqliteStore(path).open()
    assert path.read_bytes() == b"definitely not sqlite" * 100  # and nothing was lost


async def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA user_version = 99")
    with pytest.raises(StoreError, match="schema version 99, newer"):
        await SqliteStore(path).open()


async def test_closed_store_refuses_calls_and_can_reopen(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "x.db")
    with pytest.raises(StoreError, match="not open"):
        await store.set_state("k", "v")
    await store.open()
    await store.open()  # idempotent
    await store.set_state("k", "v")
    await store.close()
    await store.close()  # idempotent
    with pytest.raises(StoreError, match="not open"):
        await store.get_state("k")
    await store.open()
    assert await store.get_state("k") == "v"
    await store.close()


async def test_close_finishes_what_was_queued(db: SqliteStore, tmp_path: Path) -> None:
    writes = [asyncio.ensure_future(db.set_state(f"k{i}", "v")) for i in range(100)]
    await asyncio.gather(*writes[:1])  # the rest are queued or in flight
    await db.close()
    assert all(w.done() and w.exception() is None for w in writes)
    with sqlite3.connect(tmp_path / "talkbridge.db") as peek:
        assert peek.execute("SELECT count(*) FROM state").fetchone()[0] == 100


class _Gate:
    """An operation that holds the writer thread until released, so later calls share a batch."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def __call__(self) -> None:
        self.release.wait(timeout=30)


async def test_a_failing_op_is_isolated_within_its_batch(
    thread_db: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = thread_db
    isolated_batches: list[int] = []
    original = BatchRunner._run_isolated

    def spy(self: BatchRunner, batch: list[Any]) -> Any:
        isolated_batches.append(len(batch))
        return original(self, batch)

    monkeypatch.setattr(BatchRunner, "_run_isolated", spy)
    gate = _Gate()
    gated = db._writer.submit(gate)
    ops, w = db._ops, db._writer
    futures: list[asyncio.Future[Any]] = [
        w.submit(db._messages, "append", ("k", "user", "m1", "s", "one", {})),
        w.submit(db._messages, "append", ("k", "user", "m2", "s", "two", {})),
        w.submit(db._messages, "append", ("bad\ud800", "user", "m", "s", "x", {})),
        w.submit(ops.set_state, "bad\ud800", "x"),
        w.submit(db._messages, "append", ("k", "user", "m3", "s", "three", {})),
        w.submit(ops.set_state, "good", "yes"),
    ]
    cancelled = w.submit(ops.set_state, "cancelled", "still written")
    cancelled.cancel()
    gate.release.set()
    await gated
    results = await asyncio.gather(*futures, return_exceptions=True)

    assert isinstance(results[2], UnicodeEncodeError)
    assert isinstance(results[3], UnicodeEncodeError)
    entries = [results[0], results[1], results[4]]
    assert [e.seq for e in entries if isinstance(e, HistoryEntry)] == [1, 2, 3]
    assert isolated_batches and max(isolated_batches) >= len(futures)
    assert [e.text for e in await db.history("k")] == ["one", "two", "three"]
    assert await db.get_state("good") == "yes"
    assert await db.get_state("cancelled") == "still written"
    assert (await db.append_history("k", "user", "m4", "s", "four")).seq == 4


@pytest.mark.parametrize("writer", ["process", "thread"])
async def test_sqlite_errors_are_store_errors(tmp_path: Path, writer: Any) -> None:
    db = SqliteStore(tmp_path / "talkbridge.db", writer=writer)
    await db.open()
    try:
        with pytest.raises(StoreError, match=r"talkbridge\.db.*no such table") as info:
            await db._writer.submit(db._ops.query, "SELECT * FROM no_such_table")
        if writer == "thread":  # a process sends the error back without its cause
            assert isinstance(info.value.__cause__, sqlite3.OperationalError)
        await db.set_state("after", "ok")  # the writer carries on
        assert await db.get_state("after") == "ok"
    finally:
        await db.close()


async def test_memory_store_works() -> None:
    store = open_store("sqlite:///:memory:")
    await store.open()
    try:
        assert (await store.append_history("k", "user", "m", "s", "x")).seq == 1
        assert [e.text for e in await store.history("k")] == ["x"]
    finally:
        await store.close()


async def test_bad_arguments_fail_before_reaching_the_store(db: SqliteStore) -> None:
    with pytest.raises(ValueError, match="role must be one of"):
        await db.append_history("k", "robot", "m", "s", "x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="limit"):
        await db.history("k", limit=-1)
    assert list(await db.history("k", limit=0)) == []


async def test_data_that_is_not_json_is_refused_and_nothing_recorded(db: SqliteStore) -> None:
    # Encoded by the writer (off the event loop): the error comes back with the call.
    with pytest.raises(TypeError, match="JSON serializable"):
        await db.append_history("k", "user", "m", "s", "x", {"bad": object()})
    assert (await db.append_history("k", "user", "m2", "s", "y", {"ok": 1})).seq == 1
    assert [(e.text, e.data) for e in await db.history("k")] == [("y", {"ok": 1})]


# -- open_store ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "path"),
    [
        ("sqlite:///talkbridge.db", Path("talkbridge.db")),
        ("sqlite:///data/x.db", Path("data/x.db")),
        ("sqlite:////var/lib/tb/x.db", Path("/var/lib/tb/x.db")),
        ("  SQLite:///x.db ", Path("x.db")),
        ("sqlite:///:memory:", ":memory:"),
    ],
)
def test_open_store_sqlite_urls(url: str, path: Path | str) -> None:
    store = open_store(url)
    assert isinstance(store, SqliteStore)
    assert store.path == path


def test_a_short_lived_store_writes_from_a_thread() -> None:
    # `talkbridge pair approve` makes a few calls: a writer process would cost it more to start.
    assert isinstance(open_store("sqlite:///x.db")._writer, ProcessWriter)  # type: ignore[attr-defined]
    brief = open_store("sqlite:///x.db", short_lived=True)
    assert isinstance(brief._writer, GroupCommitWriter)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("postgres://u:s3cret@h/db", "unsupported URL scheme 'postgres'"),
        ("talkbridge.db", "scheme missing"),
        ("sqlite://host/x.db", "has a host part"),
        ("sqlite:///", "names no database file"),
        ("sqlite:///x.db?mode=ro", "query parameters are not supported"),
        ("sqlite:///x.db?key=s3cret", "query parameters are not supported"),
    ],
)
def test_open_store_rejects_other_urls(url: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        open_store(url)
    assert "s3cret" not in str(info.value)


async def test_an_approval_by_another_process_is_seen_at_once(tmp_path: Path) -> None:
    from talkbridge.message import utcnow
    from talkbridge.store import Pairing

    bridge_side, cli_side = SqliteStore(tmp_path / "s.db"), SqliteStore(tmp_path / "s.db")
    await bridge_side.open()
    await cli_side.open()
    try:
        await bridge_side.create_pairing(Pairing("AAAA-BBBB", "c", "u", "U", utcnow(), False))
        assert not await bridge_side.is_trusted("c", "u")
        assert await cli_side.approve_pairing("AAAA-BBBB") is not None
        assert await bridge_side.is_trusted("c", "u")
    finally:
        await bridge_side.close()
        await cli_side.close()


async def test_a_revocation_by_another_process_is_seen_once_the_trust_cache_expires(
    tmp_path: Path,
) -> None:
    from talkbridge.message import utcnow
    from talkbridge.store import Pairing

    bridge_side, cli_side = SqliteStore(tmp_path / "s.db"), SqliteStore(tmp_path / "s.db")
    await bridge_side.open()
    await cli_side.open()
    try:
        await bridge_side.create_pairing(Pairing("AAAA-BBBB", "c", "u", "U", utcnow(), False))
        await cli_side.approve_pairing("AAAA-BBBB")
        assert await bridge_side.is_trusted("c", "u")  # cached from now on
        assert await cli_side.revoke_pairing("AAAA-BBBB") is not None
        assert await bridge_side.is_trusted("c", "u")  # for a few seconds more
        later = time.monotonic() + SqliteStore.trust_cache_seconds + 1
        bridge_side.clock = lambda: later  # type: ignore[method-assign]
        assert not await bridge_side.is_trusted("c", "u")
    finally:
        await bridge_side.close()
        await cli_side.close()


async def test_a_version_1_file_is_migrated_keeping_its_data(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    with sqlite3.connect(path) as conn:
        conn.executescript(sqlite_module._MIGRATIONS[0])
        conn.execute("INSERT INTO state (key, value) VALUES ('tg:offset', '41')")
        conn.execute("INSERT INTO sent VALUES ('tg', 'reply:1', '[\"9\"]')")
        conn.execute("PRAGMA user_version = 1")
    conn.close()
    store = SqliteStore(path)
    await store.open()
    try:
        assert await store.get_state("tg:offset") == "41"
        from datetime import UTC, datetime

        now = datetime.now(UTC)
        await store.enqueue_hook_event("app", ["h"], "c", "e1", "{}", now, capacity=10)
        assert [d.event_id for d in await store.hook_backlog()] == ["e1"]
        # version 3 rebuilt `sent` with an ordered id: earlier records are kept and replaceable.
        assert await store.sent_result("tg", "reply:1") == ["9"]
        await store.record_sent("tg", "reply:1", ["10"])
        assert await store.sent_result("tg", "reply:1") == ["10"]
    finally:
        await store.close()
    with sqlite3.connect(path) as peek:
        assert peek.execute("PRAGMA user_version").fetchone()[0] == sqlite_module.SCHEMA_VERSION
        assert peek.execute("SELECT count(*) FROM sent").fetchone()[0] == 1


async def test_a_version_3_file_keeps_its_once_records_and_reply_map(tmp_path: Path) -> None:
    """Version 3 kept `append_history_once`'s records in the id map, under a prefixed key."""
    path = tmp_path / "v3.db"
    key = "web\x1fs.c"
    with sqlite3.connect(path) as conn:
        for script in sqlite_module._MIGRATIONS[:3]:
            conn.executescript(script)
        conn.execute(
            "INSERT INTO history (thread_key, seq, role, message_id, sender, text, created_at)"
            " VALUES (?, 1, 'user', 's.c:a', 's', 'hi', '2026-11-01T00:00:00+00:00')",
            (key,),
        )
        conn.executemany(
            "INSERT INTO id_map (connection_id, native_id, message_id) VALUES (?, ?, ?)",
            [("web", "\x1fonce\x1fs.c:a", "1"), ("web", "s.c:a", "reply-1")],
        )
        conn.execute("PRAGMA user_version = 3")
    conn.close()
    store = SqliteStore(path)
    await store.open()
    try:
        assert await store.history_seq("web", "s.c:a") == 1
        assert await store.lookup_id("web", "s.c:a") == "reply-1"
        assert await store.lookup_native("web", "reply-1") == "s.c:a"
        assert await store.lookup_native("web", "1") is None  # a seq is not a mapped message id
        resend = await store.append_history_once("web", "s.c:a", key, "user", "s", "hi")
        assert resend == (1, None)
        fresh = await store.append_history_once("web", "s.c:b", key, "user", "s", "there")
        assert fresh.seq == 2 and fresh.entry is not None
    finally:
        await store.close()
    with sqlite3.connect(path) as peek:
        assert peek.execute("SELECT count(*) FROM id_map").fetchone()[0] == 1
    peek.close()


async def test_a_version_4_file_has_its_old_pending_codes_expired_and_approvals_kept(
    tmp_path: Path,
) -> None:
    """Codes given before pending pairings expired could be approved months later: they
    count as expired since they were given; what was approved stays approved."""
    from talkbridge.errors import PairingExpiredError

    path = tmp_path / "v4.db"
    insert = (
        "INSERT INTO pairings (code_key, code, connection_id, channel_user_id, display_name,"
        " created_at, approved) VALUES (?, ?, 'tg', ?, 'N', '2024-05-01T12:00:00.250000+00:00', ?)"
    )
    with sqlite3.connect(path) as conn:
        for script in sqlite_module._MIGRATIONS[:4]:
            conn.executescript(script)
        conn.execute(insert, ("abcd-efgh", "ABCD-EFGH", "old", 0))
        conn.execute(insert, ("jklm-npqr", "JKLM-NPQR", "approved", 1))
        conn.execute("INSERT INTO trusted VALUES ('tg', 'approved')")
        conn.execute("PRAGMA user_version = 4")
    conn.close()
    store = SqliteStore(path)
    await store.open()
    try:
        assert [p.code for p in await store.pairings()] == []
        old, approved = await store.pairings(include_approved=True)
        assert old.expires_at == old.created_at  # expired when it was given
        assert approved.approved and approved.expires_at is None
        with pytest.raises(PairingExpiredError):
            await store.approve_pairing("ABCD-EFGH")
        assert not await store.is_trusted("tg", "old")
        assert await store.is_trusted("tg", "approved")
    finally:
        await store.close()


async def test_the_seen_filter_is_built_in_steps_with_other_writes_in_between(
    db: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.store.test_store_contract import msg

    monkeypatch.setattr(sqlite_module, "SEEN_STEP_ROWS", 7)
    accepted = [msg(f"m{i}") for i in range(30)]
    for m in accepted:
        await db.accept_inbound(m)
    operations: list[str] = []
    submit = db._writer.submit

    def recording(fn: Any, *args: Any) -> Any:
        operations.append(getattr(fn, "__name__", str(fn)))
        return submit(fn, *args)

    monkeypatch.setattr(db._writer, "submit", recording)
    seen = await db.seen_inbound(10)
    # One writer operation per 7 rows, each a chance for the writes queued meanwhile.
    assert operations == ["seen_begin", *["seen_step"] * 5, "seen_end"]
    assert not any(seen.add(m.connection_id, m.id) for m in accepted)


async def test_an_append_sent_again_after_its_writer_died_is_made_once(
    thread_db: SqliteStore,
) -> None:
    """The dead writer may have committed it before it could say so."""
    made = sqlite_module._history_row("k", "assistant", "r1", "bridge", "hi", None)
    await thread_db._writer.submit(thread_db._messages, "append", made)
    await thread_db._writer.submit(thread_db._messages, "replay", made)
    not_made = sqlite_module._history_row("k", "assistant", "r2", "bridge", "there", None)
    await thread_db._writer.submit(thread_db._messages, "replay", not_made)
    entries = await thread_db.history("k", limit=10)
    assert [(e.seq, e.message_id) for e in entries] == [(1, "r1"), (2, "r2")]


@pytest.mark.parametrize("writer", ["process", "thread"])
async def test_health_says_writes_fail_while_the_file_refuses_them(
    tmp_path: Path, writer: Literal["process", "thread"]
) -> None:
    """Another process holding the file's write lock (a `sqlite3` shell left in a transaction):
    every write fails after the busy timeout, and `/healthz` said `up` all along. It now says
    `down`, naming the file and why, until a write goes through again."""
    path = tmp_path / "x.db"
    store = SqliteStore(path, writer=writer)
    await store.open()
    try:
        await store.set_state("k", "1")
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")
        try:
            with pytest.raises(StoreError, match="database is locked"):
                await store.set_state("k", "2")
            health = store.health()
            assert health["state"] == "down", health
            assert health["error"] == (
                f"writes are failing: sqlite store at {path}: database is locked"
            )
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert store.health()["state"] == "down"  # nothing written since: not known yet
        await store.set_state("k", "3")
        assert store.health() == {"state": "up"}
        assert await store.get_state("k") == "3"
    finally:
        await store.close()
