"""Durable hooks against both stores: at least once, ACK on return, retries, dead letters,
per-conversation order, crash recovery, retention, capacity, restart survival."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from talkbridge.hooks.calls import shown_path
from talkbridge.hooks.durable import (
    CAPACITY,
    DurableHooks,
    JobCompleted,
    TurnCompleted,
    TurnRef,
    parse_event,
)
from talkbridge.message import utcnow
from talkbridge.store import Store
from tests.store.conftest import Backend

from .support import hook_folder_bridge

WAIT = 10.0
HERE = shown_path(__file__)
"""This file as a hook error names it (`(at FILE line N)`)."""
"""Safety net only: every wait below ends on an event long before this."""


@pytest.fixture
async def store(backend: Backend) -> AsyncIterator[Store]:
    opened = backend.make()
    await opened.open()
    yield opened
    await opened.close()


class Recorder:
    """A handler that records (event_id, conversation) per call and lets tests await counts."""

    def __init__(self, fail: Callable[[Any, int], bool] = lambda event, n: False) -> None:
        self.calls: list[str] = []
        self._fail = fail
        self._changed = asyncio.Event()

    async def __call__(self, event: TurnCompleted | JobCompleted) -> None:
        self.calls.append(event.event_id)
        self._changed.set()
        if self._fail(event, self.calls.count(event.event_id)):
            raise RuntimeError(f"refused {event.event_id}")

    async def wait(self, predicate: Callable[[list[str]], bool]) -> None:
        async with asyncio.timeout(WAIT):
            while not predicate(self.calls):
                self._changed.clear()
                await self._changed.wait()


RAISED_AT = Recorder.__call__.__code__.co_firstlineno + 4
"""The line where `Recorder` raises."""


def hooks(store: Store, **options: Any) -> DurableHooks:
    options = {"backoff": lambda retry: 0.0, "poll_interval": 0.05, **options}
    return DurableHooks(store, "app", **options)


def turn(event_id: str, conversation: str = "web\x1ft1") -> TurnCompleted:
    ref = TurnRef(
        session_id=conversation,
        turn_id=f"turn-{event_id}",
        agent_name="echo",
        connection_id="web",
        thread_id="t1",
    )
    return TurnCompleted(event_id=event_id, app_id="app", turn=ref, status="completed")


async def first_dead_then_second(durable: DurableHooks, second: asyncio.Event) -> None:
    """Emit e1 then e2 of one conversation and run the hooks until the handler sets `second`
    (e2 reached it: e1 is done with, here a dead letter)."""
    await durable.emit(turn("e1"))
    await durable.emit(turn("e2"))
    await durable.start()
    try:
        async with asyncio.timeout(WAIT):
            await second.wait()
    finally:
        await durable.stop()


async def test_fails_twice_then_succeeds_three_calls_same_event_id(store: Store) -> None:
    durable = hooks(store)
    handler = Recorder(fail=lambda event, n: n <= 2)
    durable.register("billing", handler)
    await durable.start()
    try:
        assert await durable.emit(turn("e1"))
        await handler.wait(lambda calls: len(calls) == 3)
        await durable.stop()  # wait for the ACK to be written
    finally:
        await durable.stop()
    assert handler.calls == ["e1", "e1", "e1"]
    assert list(await store.hook_backlog()) == []


async def test_dead_letter_after_six_attempts_does_not_block_the_conversation(
    store: Store,
) -> None:
    durable = hooks(store)
    handler = Recorder(fail=lambda event, n: event.event_id == "bad")
    durable.register("crm", handler)
    await durable.emit(turn("bad"))
    await durable.emit(turn("next"))
    await durable.emit(turn("last"))
    await durable.start()
    try:
        await handler.wait(lambda calls: "last" in calls)
    finally:
        await durable.stop()
    # In order: the next waits for the preceding one to be acked or dead.
    assert handler.calls == ["bad"] * 6 + ["next", "last"]
    [dead] = await durable.dead_letters()
    assert (dead.event_id, dead.attempts, dead.handler) == ("bad", 6, "crm")
    # with the line of the handler that raised, as the log says it
    assert dead.last_error == f"RuntimeError: refused bad (at {HERE} line {RAISED_AT})"
    assert parse_event(dead.body).model_dump(exclude={"occurred_at"}) == turn("bad").model_dump(
        exclude={"occurred_at"}
    )

    # A replay gives it a fresh set of attempts.
    fixed = Recorder()
    again = hooks(store)
    again.register("crm", fixed)
    await again.start()
    try:
        assert await again.replay([dead.id]) == 1
        await fixed.wait(lambda calls: calls == ["bad"])
    finally:
        await again.stop()


async def test_a_handler_raising_a_stray_cancelled_error_fails_and_becomes_a_dead_letter(
    store: Store,
) -> None:
    """A handler awaiting a task that something else cancelled raises CancelledError while
    the worker is not being stopped: a failed attempt, not a lease handed back for an
    immediate retry (it was retried at full speed for ever, never a dead letter, and held
    its conversation's later events back)."""
    calls: list[str] = []
    second = asyncio.Event()

    async def crm(event: TurnCompleted | JobCompleted) -> None:
        calls.append(event.event_id)
        if event.event_id == "e2":
            second.set()
            return
        task = asyncio.create_task(asyncio.Event().wait())
        task.cancel()  # by something else, before or while it runs: the same to its awaiter
        await task

    awaited_at = crm.__code__.co_firstlineno + 7  # `await task`

    durable = hooks(store)
    durable.register("crm", crm)
    await first_dead_then_second(durable, second)  # one conversation: e2 after e1 is done with
    assert calls == ["e1"] * 6 + ["e2"]
    [dead] = await durable.dead_letters()
    assert (dead.event_id, dead.attempts) == ("e1", 6)
    assert dead.last_error == f"CancelledError (at {HERE} line {awaited_at})"


async def test_other_conversations_go_on_while_one_waits(store: Store) -> None:
    release = asyncio.Event()
    seen: list[str] = []
    both = asyncio.Event()
    b1_seen = asyncio.Event()

    async def handler(event: TurnCompleted | JobCompleted) -> None:
        seen.append(event.event_id)
        if event.event_id == "b1":
            b1_seen.set()
        if event.event_id == "a1":
            await release.wait()
        if {"a2", "b1"} <= set(seen):
            both.set()

    durable = hooks(store)
    durable.register("h", handler)
    await durable.emit(turn("a1", "conv-a"))
    await durable.emit(turn("a2", "conv-a"))
    await durable.emit(JobCompleted(event_id="b1", app_id="app", job_id="j1", status="failed"))
    await durable.start()
    try:
        async with asyncio.timeout(WAIT):
            await b1_seen.wait()
        assert "a2" not in seen  # held behind a1, which is still in its attempt
        release.set()
        async with asyncio.timeout(WAIT):
            await both.wait()
    finally:
        await durable.stop()
    assert seen.index("a1") < seen.index("a2")


async def test_a_timed_out_attempt_is_a_failure_and_retried(store: Store) -> None:
    calls: list[str] = []
    done = asyncio.Event()

    async def slow_first(event: TurnCompleted | JobCompleted) -> None:
        calls.append(event.event_id)
        if len(calls) == 1:
            await asyncio.Event().wait()  # never returns: the attempt times out
        done.set()

    durable = hooks(store, attempt_timeout=0.1)
    durable.register("h", slow_first)
    await durable.start()
    try:
        await durable.emit(turn("e1"))
        async with asyncio.timeout(WAIT):
            await done.wait()
    finally:
        await durable.stop()
    assert calls == ["e1", "e1"]


async def test_stopping_mid_delivery_redelivers_after_restart(backend: Backend) -> None:
    store = backend.make()
    await store.open()
    entered = asyncio.Event()

    async def stuck(event: TurnCompleted | JobCompleted) -> None:
        entered.set()
        await asyncio.Event().wait()  # "crashes" before returning: no ACK

    first = hooks(store)
    first.register("audit", stuck)
    await first.start()
    await first.emit(turn("e1"))
    async with asyncio.timeout(WAIT):
        await entered.wait()
    await first.stop()
    await store.close()

    store = backend.make()  # a new process on the same data
    await store.open()
    try:
        handler = Recorder()
        second = hooks(store)
        second.register("audit", handler)
        await second.start()
        try:
            await handler.wait(lambda calls: calls == ["e1"])
        finally:
            await second.stop()
    finally:
        await store.close()


async def test_a_worker_that_died_holding_a_lease_is_redelivered(store: Store) -> None:
    durable = hooks(store, attempt_timeout=0.2, lease_grace=0.0)
    handler = Recorder()
    durable.register("audit", handler)
    await durable.emit(turn("e1"))
    # Another worker claimed it and died (no ack, no release): only the lease remains.
    now = utcnow()
    [claimed] = await store.claim_hook_deliveries(
        "app", ["audit"], now=now, lease_until=now + timedelta(seconds=0.2), limit=1
    )
    await durable.start()
    try:
        await handler.wait(lambda calls: calls == ["e1"])
    finally:
        await durable.stop()
    assert claimed.event_id == "e1"


async def test_the_queue_survives_a_restart(backend: Backend) -> None:
    store = backend.make()
    await store.open()
    before = hooks(store)
    before.register("h", Recorder())
    await before.emit(turn("e1"))
    await before.emit(turn("e2"))
    await store.close()  # the bridge went down before delivering anything

    store = backend.make()
    await store.open()
    try:
        handler = Recorder()
        after = hooks(store)
        after.register("h", handler)
        await after.start()
        try:
            await handler.wait(lambda calls: len(calls) == 2)
        finally:
            await after.stop()
        assert handler.calls == ["e1", "e2"]
    finally:
        await store.close()


async def test_retention_drops_events_older_than_seven_days(store: Store) -> None:
    clock = [utcnow()]
    durable = hooks(store, clock=lambda: clock[0])
    handler = Recorder()
    durable.register("h", handler)
    await durable.emit(turn("old"))
    clock[0] += timedelta(days=7, seconds=1)
    await durable.emit(turn("fresh"))  # same conversation: would wait behind "old"
    await durable.start()
    try:
        await handler.wait(lambda calls: "fresh" in calls)
    finally:
        await durable.stop()
    assert handler.calls == ["fresh"]


async def test_at_most_a_thousand_undelivered_events_per_app(store: Store) -> None:
    durable = hooks(store)
    durable.register("h", Recorder())
    for i in range(CAPACITY + 5):
        await durable.emit(turn(f"e{i}", conversation=f"c{i % 7}"))
    backlog = await store.hook_backlog(app_id="app", limit=2000)
    assert len(backlog) == CAPACITY == 1000
    assert [d.event_id for d in backlog[:2]] == ["e5", "e6"]
    assert backlog[-1].event_id == f"e{CAPACITY + 4}"


async def test_disabling_clears_and_reenabling_does_not_backfill(store: Store) -> None:
    durable = hooks(store)
    handler = Recorder()
    durable.register("h", handler)
    await durable.emit(turn("before"))
    assert await durable.disable() == 1
    assert not await durable.emit(turn("while-disabled"))
    durable.enable()
    await durable.emit(turn("after"))
    await durable.start()
    try:
        await handler.wait(lambda calls: "after" in calls)
    finally:
        await durable.stop()
    assert handler.calls == ["after"]


async def test_registration_rules(store: Store) -> None:
    durable = hooks(store)
    handler = Recorder()
    registration = durable.register("h", handler)
    with pytest.raises(ValueError, match="already registered"):
        durable.register("h", Recorder())

    def not_async(event: object) -> None: ...

    with pytest.raises(TypeError, match="async function"):
        durable.register("sync", not_async)  # type: ignore[arg-type]
    registration.dispose()
    assert durable.names == []
    assert not await durable.emit(turn("nobody-listens"))
    assert list(await store.hook_backlog()) == []
    with durable.register("h", handler):
        assert durable.names == ["h"]
    assert durable.names == []
    durable.register("late-ok-before-start", handler)
    await durable.start()
    try:
        with pytest.raises(RuntimeError, match="at startup"):
            durable.register("too-late", handler)
    finally:
        await durable.stop()
    with pytest.raises(ValueError, match="not 'app'"):
        bad = turn("x").model_copy(update={"app_id": "other"})
        await durable.emit(bad)


def test_events_round_trip_as_json() -> None:
    event = JobCompleted(
        app_id="app", job_id="j9", status="failed", conversation_id="c", detail={"n": 1}
    )
    assert parse_event(event.model_dump_json()) == event
    assert event.conversation == "c"
    assert JobCompleted(app_id="a", job_id="j", status="ok").conversation == "job:j"
    assert isinstance(turn("x").occurred_at, datetime)
    assert turn("x").type == "conversation.turn.completed"


async def test_the_bridge_emits_turn_completed_after_the_reply(tmp_path: Path) -> None:
    from talkbridge.bridge import Bridge
    from talkbridge.config import BridgeConfig, ConnectionConfig
    from tests.support.talk_connector import TalkConnector, make_message

    config = BridgeConfig.model_validate({"store": f"sqlite:///{tmp_path / 'b.db'}"})
    bridge = Bridge(config, with_webchat=False, app_id="app")
    conn = TalkConnector("test")
    bridge.registry.add(conn, ConnectionConfig(id="test", channel="telegram", trusted=["alice"]))
    got: list[TurnCompleted | JobCompleted] = []
    arrived = asyncio.Event()
    sent_before: list[int] = []

    async def audit(event: TurnCompleted | JobCompleted) -> None:
        sent_before.append(len(conn.sent))
        got.append(event)
        arrived.set()

    bridge.durable.register("audit", audit)
    await bridge.start()
    try:
        msg = make_message("hello", thread_id="chat-1")
        await conn.inject(msg)
        async with asyncio.timeout(WAIT):
            await arrived.wait()
    finally:
        await bridge.stop()
    [event] = got
    assert isinstance(event, TurnCompleted)
    assert (event.app_id, event.status, event.turn.session_id) == (
        "app",
        "completed",
        msg.thread_key,
    )
    assert (event.turn.connection_id, event.turn.thread_id) == ("test", "chat-1")
    assert sent_before == [1]  # the reply went out first


async def test_an_edit_answered_again_emits_its_own_turn_completed(tmp_path: Path) -> None:
    """An edited message is a turn of its own: its answer (the earlier reply edited in place)
    is reported like any other, with an event id of its own."""
    from talkbridge.bridge import Bridge
    from talkbridge.config import BridgeConfig, ConnectionConfig
    from tests.support.talk_connector import TalkConnector, make_message

    config = BridgeConfig.model_validate({"store": f"sqlite:///{tmp_path / 'b.db'}"})
    bridge = Bridge(config, with_webchat=False, app_id="app")
    conn = TalkConnector("test")
    edited: asyncio.Queue[str] = asyncio.Queue()

    class Editor:
        async def edit(self, thread_id: str, message_id: str, text: str) -> None:
            await edited.put(text)

    conn.features["edit"] = Editor()
    bridge.registry.add(conn, ConnectionConfig(id="test", channel="telegram", trusted=["alice"]))
    got: asyncio.Queue[TurnCompleted | JobCompleted] = asyncio.Queue()
    bridge.durable.register("audit", got.put)
    await bridge.start()
    try:
        first = make_message("helo", thread_id="chat-1")
        await conn.inject(first)
        async with asyncio.timeout(WAIT):
            answered = await got.get()
            await conn.inject(make_message("hello", thread_id="chat-1", edit_of=first.id))
            assert await edited.get() == "hello"
            re_answered = await got.get()
    finally:
        await bridge.stop()
    assert isinstance(re_answered, TurnCompleted)
    assert re_answered.status == "completed"
    assert re_answered.turn.thread_id == "chat-1"
    assert re_answered.event_id != answered.event_id


async def _crash_test_bridge(
    tmp_path: Path, got: list[TurnCompleted], arrived: asyncio.Event
) -> tuple[Any, Any]:
    """A bridge on `tmp_path`'s SQLite file whose durable hook `audit` collects the events."""
    from talkbridge.bridge import Bridge
    from talkbridge.config import BridgeConfig, ConnectionConfig
    from tests.support.talk_connector import TalkConnector

    config = BridgeConfig.model_validate({"store": f"sqlite:///{tmp_path / 'b.db'}"})

    async def audit(event: TurnCompleted | JobCompleted) -> None:
        assert isinstance(event, TurnCompleted)
        got.append(event)
        arrived.set()

    bridge = Bridge(config, with_webchat=False, app_id="app")
    conn = TalkConnector("test")
    bridge.registry.add(conn, ConnectionConfig(id="test", channel="telegram", trusted=["alice"]))
    bridge.durable.register("audit", audit)
    await bridge.start()
    return bridge, conn


async def _restarted_until_an_event(
    tmp_path: Path, got: list[TurnCompleted], arrived: asyncio.Event
) -> Any:
    """The next start after a crash, run until its first event arrived and its messages were
    handled; returns its connection."""
    bridge, conn = await _crash_test_bridge(tmp_path, got, arrived)
    try:
        async with asyncio.timeout(WAIT):
            await arrived.wait()
        await bridge.router.join()
    finally:
        await bridge.stop()
    return conn


async def test_a_turn_answered_before_a_crash_has_its_event_queued_again_not_its_turn(
    tmp_path: Path,
) -> None:
    """The bridge dies after it queued a turn's event, before the message was marked done: the
    next start finds the reply sent and does not run the turn again, but queues its event
    again, for all it knows, with the same `event_id`: a handler deduping on it, as the docs
    say, counts the turn once. (The second event had a new random id, so a CRM or a bill
    counted the turn twice.)"""
    from talkbridge.message import NormalizedMessage
    from tests.support.talk_connector import make_message

    got: list[TurnCompleted] = []
    arrived = asyncio.Event()
    bridge, conn = await _crash_test_bridge(tmp_path, got, arrived)
    never = asyncio.Event()

    async def stuck(message: NormalizedMessage) -> None:
        await never.wait()  # the crash comes after the turn, before the message is done

    bridge.router.subscribe_all(stuck)
    await conn.inject(make_message("bill me", message_id="n1"))
    async with asyncio.timeout(WAIT):
        await arrived.wait()
    await bridge.stop(drain_timeout=0.01)
    (reply,) = conn.sent

    arrived.clear()
    conn = await _restarted_until_an_event(tmp_path, got, arrived)
    assert conn.sent == []  # the reply went out once
    first, again = got
    assert again.event_id == first.event_id
    assert again.turn == first.turn and again.turn.turn_id == reply.message.meta["stream_id"]


async def test_a_turn_answered_just_before_a_crash_still_has_its_event_queued(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bridge dies after the reply went out, before the turn's event was queued. The next
    start does not run the turn again (its reply is on record), and must not lose the event:
    it queues the one that turn would have queued, naming that turn."""
    from tests.support.talk_connector import make_message

    got: list[TurnCompleted] = []
    arrived = asyncio.Event()
    bridge, conn = await _crash_test_bridge(tmp_path, got, arrived)
    queueing = asyncio.Event()

    async def crash_while_queueing(*_: object, **__: object) -> int:
        queueing.set()
        await asyncio.Event().wait()  # the process dies here
        return 0

    monkeypatch.setattr(bridge.store, "enqueue_hook_event", crash_while_queueing)
    await conn.inject(make_message("bill me", message_id="n1"))
    async with asyncio.timeout(WAIT):
        await queueing.wait()
    await bridge.stop(drain_timeout=0.01)
    (reply,) = conn.sent
    assert got == []

    conn = await _restarted_until_an_event(tmp_path, got, arrived)
    assert conn.sent == []
    (event,) = got
    assert event.status == "completed"
    assert event.turn.turn_id == reply.message.meta["stream_id"]  # the turn that answered


async def test_a_turns_remembered_event_is_kept_as_long_as_events_are_not_for_ever(
    store: Store,
) -> None:
    """The event a turn keeps before its reply goes out (for a message handled again after a
    crash) lasts the events' `retention`, in both stores. It was kept for good: one entry per
    conversation the bridge ever answered, never freed."""
    from types import SimpleNamespace

    durable = hooks(store)
    durable.register("audit", Recorder())
    session = SimpleNamespace(
        session_id="web\x1ft1",
        turn_id="turn-1",
        agent_name="echo",
        connection_id="web",
        thread_id="t1",
    )
    now = store.wall_clock
    store.wall_clock = lambda: now() - durable.retention.total_seconds() - 1  # kept that long ago
    try:
        await durable.remember_turn_completed(session, "completed", message_id="m1")
    finally:
        store.wall_clock = now
    await durable.emit_remembered_turn_completed("web", "web\x1ft1", "m1")
    assert list(await store.hook_backlog(app_id="app")) == []  # it had run out: nothing queued


async def test_cli_lists_and_replays_dead_letters(tmp_path: Path) -> None:
    from talkbridge.store import SqliteStore
    from tests.test_cli import finish, talkbridge

    store = SqliteStore(tmp_path / "talkbridge.db")  # the embedded default's file
    await store.open()
    now = utcnow()
    for event_id in ("ev-1", "ev-2"):
        await store.enqueue_hook_event("shop", ["billing"], "c", event_id, "{}", now, capacity=9)
    for d in await store.hook_backlog():
        await store.fail_hook_delivery(d.id, f"402 for {d.event_id}", retry_at=None)
    first, _ = await store.hook_backlog()
    await store.close()

    code, out, _ = await finish(await talkbridge("hooks", "dead-letters", "list", cwd=tmp_path))
    assert code == 0
    assert f"{first.id}  shop  billing  ev-1" in out and "402 for ev-2" in out
    code, _, err = await finish(await talkbridge("hooks", "dead-letters", "replay", cwd=tmp_path))
    assert code == 2 and "ID(s) or --all" in err
    args = ("hooks", "dead-letters", "replay", str(first.id))
    code, out, _ = await finish(await talkbridge(*args, cwd=tmp_path))
    assert code == 0 and "replayed 1 dead letter" in out
    code, _, err = await finish(await talkbridge(*args, cwd=tmp_path))  # no longer dead
    assert code == 1 and f"no dead letter has the id {first.id};" in err
    code, out, _ = await finish(
        await talkbridge("hooks", "dead-letters", "replay", "--all", cwd=tmp_path)
    )
    assert code == 0 and "replayed 1 dead letter" in out
    code, out, _ = await finish(await talkbridge("hooks", "dead-letters", "list", cwd=tmp_path))
    assert "no dead letters" in out
    store = SqliteStore(tmp_path / "talkbridge.db")
    await store.open()
    try:
        assert [(d.event_id, d.dead, d.attempts) for d in await store.hook_backlog()] == [
            ("ev-1", False, 0),
            ("ev-2", False, 0),
        ]
    finally:
        await store.close()


async def test_a_durable_hook_folder_gets_every_completed_turn(tmp_path: Path) -> None:
    # What users write: a folder under hooks/, no Python wiring of their own.
    from talkbridge.bridge import Bridge
    from talkbridge.config import BridgeConfig, ConnectionConfig
    from tests.support.talk_connector import TalkConnector, make_message

    folder = tmp_path / "hooks" / "durable" / "audit"
    folder.mkdir(parents=True)
    (folder / "hook.py").write_text(
        "import asyncio\n"
        "def create_hook(deps):\n"
        "    bridge = deps.context['bridge']\n"
        "    bridge.audited, bridge.audit_arrived = [], asyncio.Event()\n"
        "    async def on_event(event):\n"
        "        bridge.audited.append(event.turn.thread_id)\n"
        "        bridge.audit_arrived.set()\n"
        "    return on_event\n",
        encoding="utf-8",
    )
    config = BridgeConfig.model_validate(
        {"store": f"sqlite:///{tmp_path / 'b.db'}", "hooks": [str(tmp_path / "hooks" / "durable")]}
    )
    bridge = Bridge(config, with_webchat=False, app_id="app")
    conn = TalkConnector("test")
    bridge.registry.add(conn, ConnectionConfig(id="test", channel="telegram", trusted=["alice"]))
    await bridge.start()
    try:
        assert bridge.durable.names == ["audit"]
        await conn.inject(make_message("hello", thread_id="chat-1"))
        async with asyncio.timeout(WAIT):
            await bridge.audit_arrived.wait()  # type: ignore[attr-defined]
        assert bridge.audited == ["chat-1"]  # type: ignore[attr-defined]
    finally:
        await bridge.stop()


async def test_replaying_ids_that_are_no_dead_letters_names_them_and_how_to_list_ids(
    tmp_path: Path,
) -> None:
    """It said "replayed 0 of 1: the others are not dead letters": which others, of one?"""
    from talkbridge.store import SqliteStore
    from tests.test_cli import finish, talkbridge

    store = SqliteStore(tmp_path / "talkbridge.db")
    await store.open()
    await store.enqueue_hook_event("shop", ["billing"], "c", "ev-1", "{}", utcnow(), capacity=9)
    (dead,) = await store.hook_backlog()
    await store.fail_hook_delivery(dead.id, "402", retry_at=None)
    await store.close()
    unknown = dead.id + 41

    replay = ("hooks", "dead-letters", "replay")
    code, out, err = await finish(await talkbridge(*replay, str(unknown), cwd=tmp_path))
    assert (code, out) == (1, "")
    assert err == (
        f"talkbridge hooks dead-letters replay: no dead letter has the id {unknown}; "
        "`talkbridge hooks dead-letters list` shows their ids\n"
    )
    # One known among unknown ones: it is replayed, and only the others are named.
    (tmp_path / "talkbridge.yaml").write_text("store: sqlite:///talkbridge.db\n")
    args = (*replay, str(unknown), str(dead.id), str(unknown + 1), "--app", "shop")
    code, out, err = await finish(
        await talkbridge(*args, "--config", "talkbridge.yaml", cwd=tmp_path)
    )
    assert code == 1
    assert out == "replayed 1 dead letter(s); a running bridge delivers them now\n"
    assert err == (
        f"talkbridge hooks dead-letters replay: no dead letter of app 'shop' has the ids "
        f"{unknown}, {unknown + 1}; `talkbridge hooks dead-letters list --app shop --config "
        "talkbridge.yaml` shows their ids\n"
    )


async def test_a_dead_letters_error_keeps_no_secret_for_the_cli_to_print(tmp_path: Path) -> None:
    """`hooks dead-letters list` loads only the store's keys, so it has no connection's secret
    to scrub with: the bridge scrubs the error before the store keeps it."""
    from talkbridge.bridge import Bridge
    from talkbridge.config import parse_config
    from tests.test_cli import finish, talkbridge

    class Leaky(Recorder):
        async def __call__(self, event: TurnCompleted | JobCompleted) -> None:
            await super().__call__(event)
            if event.event_id == "bad":
                raise RuntimeError("the CRM refused key dead-letter-secret-99")

    data = {
        "store": f"sqlite:///{tmp_path}/talkbridge.db",
        "webchat": {"tokens": ["dead-letter-secret-99"]},
    }
    config, secrets = parse_config(data, tmp_path)
    bridge = Bridge(config, secrets, with_webchat=False, app_id="app")
    bridge.durable.retries, bridge.durable.backoff = 0, lambda retry: 0.0
    handler = Leaky()
    bridge.durable.register("crm", handler)
    await bridge.store.open()
    try:
        await bridge.durable.emit(turn("bad"))
        await bridge.durable.emit(turn("next"))  # delivered once "bad" is a dead letter
        await bridge.durable.start()
        await handler.wait(lambda calls: "next" in calls)
        await bridge.durable.stop()
        [dead] = await bridge.durable.dead_letters()
    finally:
        await bridge.store.close()
    assert dead.last_error.startswith("RuntimeError: the CRM refused key *** (at tests/hooks/")
    code, out, err = await finish(await talkbridge("hooks", "dead-letters", "list", cwd=tmp_path))
    assert code == 0 and "the CRM refused key ***" in out, err
    assert "dead-letter-secret-99" not in out + err


async def test_a_store_outage_is_said_once_and_its_end_too(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The worker reads the queue every poll: an error line each time buried the log while
    # Redis was down (once a second on every node).
    from talkbridge.store.redis import RedisStore
    from tests.cluster.conftest import wait_until
    from tests.peers.redis import outage_redis

    def said(level: int) -> list[str]:
        return [r.getMessage() for r in caplog.records if r.levelno == level]

    caplog.set_level(logging.DEBUG, logger="talkbridge.hooks.durable")
    async with outage_redis() as server:
        store = RedisStore(server.url, prefix="tbtest-durable-outage")
        await store.open()
        durable = hooks(store, poll_interval=0.01)
        recorder = Recorder()
        durable.register("audit", recorder)
        try:
            await durable.start()
            server.stop()
            await wait_until(lambda: len(said(logging.DEBUG)) >= 3)  # it keeps polling
            await server.start()
            await wait_until(lambda: bool(said(logging.INFO)))
            await durable.emit(turn("e1"))
            await recorder.wait(lambda calls: calls == ["e1"])
        finally:
            await durable.stop()
            await store.close()
    assert len(said(logging.WARNING)) == 1 and not said(logging.ERROR)
    assert said(logging.WARNING)[0].startswith("durable hooks: reading the queue failed: ")
    assert said(logging.INFO)[0].startswith("durable hooks: reading the queue works again")


async def test_a_dead_letter_says_the_line_that_raised_and_the_list_shows_it(
    tmp_path: Path,
) -> None:
    """A dead letter kept only `RuntimeError: message`: where the hook raised was in the log
    of the attempt, not in `hooks dead-letters list`. Kept now in the same text as the log's
    (`(at FILE line N)` at its end), which the list shows even for a long message."""
    from tests.support.talk_connector import make_message
    from tests.test_cli import finish, talkbridge

    def prepare(bridge: Any) -> None:
        bridge.durable.retries, bridge.durable.backoff = 0, lambda retry: 0.0
        bridge.next_delivered = asyncio.Event()

    folder = tmp_path / "hooks" / "durable" / "crm"
    code = (
        "def create_hook(deps):\n"
        "    bridge, calls = deps.context['bridge'], []\n"
        "    async def on_event(event):\n"
        "        calls.append(event)\n"
        "        if len(calls) == 1:\n"
        "            raise RuntimeError('the CRM said: ' + 'no ' * 100)\n"
        "        bridge.next_delivered.set()\n"
        "    return on_event\n"
    )
    async with hook_folder_bridge(tmp_path, folder, code, prepare=prepare, app_id="app") as (
        bridge,
        conn,
    ):
        await conn.inject(make_message("one", thread_id="chat-1"))
        await conn.wait_sent(1)
        await conn.inject(make_message("two", thread_id="chat-1"))  # after "one" is dead
        async with asyncio.timeout(WAIT):
            await bridge.next_delivered.wait()
        [dead] = await bridge.durable.dead_letters()
    where = f" (at {shown_path(str(folder / 'hook.py'))} line 6)"
    assert dead.last_error == "RuntimeError: the CRM said: " + "no " * 99 + "no" + where
    code, out, err = await finish(await talkbridge("hooks", "dead-letters", "list", cwd=tmp_path))
    assert code == 0, err
    [line] = out.splitlines()
    assert "RuntimeError: the CRM said: no no" in line and line.endswith("…" + where)


async def test_a_handlers_own_timeout_error_is_not_taken_for_the_attempt_limit(
    store: Store,
) -> None:
    """A TimeoutError the handler's own client raised was kept as "timed out after 30 s": the
    limit of the attempt, which had not run out."""
    durable = hooks(store)
    durable.retries = 0
    second = asyncio.Event()

    async def crm(event: TurnCompleted | JobCompleted) -> None:
        if event.event_id == "e2":
            second.set()
            return
        raise TimeoutError("the CRM did not answer in 2 s")

    durable.register("crm", crm)
    await first_dead_then_second(durable, second)
    [dead] = await durable.dead_letters()
    raised_at = crm.__code__.co_firstlineno + 4
    assert (
        dead.last_error
        == f"TimeoutError: the CRM did not answer in 2 s (at {HERE} line {raised_at})"
    )
