"""TalkRouter: dedupe, per-thread order, per-connection send queues, failures on record."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

from talkbridge.cancellation import cancel_and_wait
from talkbridge.config import RouterConfig
from talkbridge.errors import (
    ConnectionNotStartedError,
    ConnectionStartFailedError,
    FeatureUnavailableError,
    NotFoundError,
    PermanentError,
    RateLimitedError,
    SendFailedError,
    StoreError,
    TalkbridgeError,
    TransientError,
    UnknownConnectionError,
)
from talkbridge.message import NormalizedMessage, OutboundMessage, SendResult
from talkbridge.router import TalkRouter
from talkbridge.store import SqliteStore
from talkbridge.store.seen import SeenFilter
from talkbridge.talk import MessageHandler, Subscription
from tests.support.talk_connector import TalkConnector, make_message

FAST = RouterConfig(retry_base_delay=0.001, max_concurrent_threads=64, send_retry_seconds=0)


@pytest.fixture
async def router(sqlite_store: SqliteStore) -> TalkRouter:
    return TalkRouter(sqlite_store, FAST)


async def test_unknown_connection_names_it_and_the_known_ones(router: TalkRouter) -> None:
    router.attach(TalkConnector("alpha"))
    router.attach(TalkConnector("beta"))
    with pytest.raises(UnknownConnectionError, match=r"'gamma'.*alpha, beta"):
        await router.send("gamma", OutboundMessage(thread_id="t", text="x"))
    with pytest.raises(UnknownConnectionError):
        router.talk("gamma")
    with pytest.raises(UnknownConnectionError):
        router.subscribe("gamma", lambda m: asyncio.sleep(0))


async def test_talk_facade_sends_through_the_queue_and_subscribes(router: TalkRouter) -> None:
    conn = TalkConnector("alpha")
    router.attach(conn)
    talk = router.talk("alpha")
    seen: list[str] = []

    async def handler(m: NormalizedMessage) -> None:
        seen.append(m.text)

    with talk.subscribe(handler):
        await conn.inject(make_message("one", connection_id="alpha"))
        await router.join()
    await conn.inject(make_message("two", connection_id="alpha"))  # unsubscribed by now
    await router.join()
    assert seen == ["one"]
    result = await talk.send(OutboundMessage(thread_id="t", text="out"))
    assert result.message_ids == ("alpha-out-1",)
    assert talk.feature("history") is None


async def test_a_feature_name_that_is_none_is_an_error_not_a_missing_feature(
    router: TalkRouter,
) -> None:
    """`feature("histroy")` answered None, as for a connection without history: the app took
    the typo for a platform that lacks the feature."""
    conn = TalkConnector("alpha")
    conn.features["history"] = object()
    conn.features["pins"] = pins = object()  # a plug-in connector's own feature
    router.attach(conn)
    with pytest.raises(ValueError, match=r"'histroy' is not a feature; features: history, "):
        router.feature("alpha", "histroy")
    with pytest.raises(ValueError, match="'histroy' is not a feature"):
        router.talk("alpha").feature("histroy")
    assert router.feature("alpha", "edit") is None  # a feature it lacks
    assert router.feature("alpha", "pins") is pins


async def test_buttons_to_a_connection_without_interactions_are_refused_not_dropped(
    router: TalkRouter,
) -> None:
    """An email or webchat connection has no buttons: sent there, the choices vanished and the
    reader got a question without its answers."""
    mail, chat = TalkConnector("mail", channel="email"), TalkConnector("chat")
    chat.features["interactions"] = object()
    router.attach(mail)
    router.attach(chat)
    question = OutboundMessage(thread_id="t", text="Refund or replace?", buttons=(("Refund", "r"),))
    with pytest.raises(FeatureUnavailableError, match=r"'mail' \(email\) cannot show buttons"):
        await router.send("mail", question)
    assert mail.attempts == 0
    assert (await router.send("chat", question)).message_ids == ("chat-out-1",)


async def test_duplicates_are_dropped_even_across_a_restart(tmp_path: Path) -> None:
    seen: list[str] = []

    async def handler(m: NormalizedMessage) -> None:
        seen.append(m.id)

    for _ in range(2):  # the second pass is a restarted process on the same database
        store = SqliteStore(tmp_path / "db.sqlite")
        await store.open()
        router = TalkRouter(store, FAST)
        conn = TalkConnector("alpha")
        router.attach(conn)
        router.subscribe_all(handler)
        await conn.inject(make_message("x", connection_id="alpha", message_id="native-1"))
        await conn.inject(make_message("x", connection_id="alpha", message_id="native-1"))
        await router.join()
        await router.close()
        await store.close()
    assert seen == ["native-1"]


async def test_same_native_id_on_two_connections_is_two_messages(router: TalkRouter) -> None:
    a, b = TalkConnector("a"), TalkConnector("b")
    router.attach(a)
    router.attach(b)
    seen: list[str] = []

    async def handler(m: NormalizedMessage) -> None:
        seen.append(m.connection_id)

    router.subscribe_all(handler)
    await a.inject(make_message(connection_id="a", message_id="1"))
    await b.inject(make_message(connection_id="b", message_id="1"))
    await router.join()
    assert sorted(seen) == ["a", "b"]


async def left_unfinished(tmp_path: Path, text: str) -> None:
    """A store in `tmp_path` holding a message of connection alpha accepted but never
    finished: the process "died" while handling it (`close` cancels the handler)."""
    store = SqliteStore(tmp_path / "db.sqlite")
    await store.open()
    router = TalkRouter(store, FAST)
    conn = TalkConnector("alpha")
    router.attach(conn)
    gate = asyncio.Event()

    async def stuck(m: NormalizedMessage) -> None:
        await gate.wait()

    router.subscribe_all(stuck)
    await conn.inject(make_message(text, connection_id="alpha", message_id="n1"))
    await router.close()
    await store.close()


async def test_accepted_but_unfinished_messages_are_recovered(tmp_path: Path) -> None:
    await left_unfinished(tmp_path, "lost?")

    store = SqliteStore(tmp_path / "db.sqlite")
    await store.open()
    router = TalkRouter(store, FAST)
    router.attach(TalkConnector("alpha"))
    seen: list[str] = []

    async def handler(m: NormalizedMessage) -> None:
        seen.append(m.text)

    router.subscribe_all(handler)
    assert await router.recover() == 1
    await router.join()
    assert seen == ["lost?"]
    assert await router.recover() == 0  # completed now
    await router.close()
    await store.close()


async def test_thread_order_is_strict_while_threads_run_in_parallel(router: TalkRouter) -> None:
    conn = TalkConnector("alpha")
    router.attach(conn)
    order: dict[str, list[int]] = {}
    b_started = asyncio.Event()

    async def handler(m: NormalizedMessage) -> None:
        thread, n = m.thread_id, int(m.text)
        if thread == "A" and n == 0:
            # Thread A's first message cannot finish until thread B has run: only true parallelism
            # across threads lets this complete.
            await asyncio.wait_for(b_started.wait(), 5)
        if thread == "B":
            b_started.set()
        for _ in range(n % 3):
            await asyncio.sleep(0)  # interleave
        order.setdefault(thread, []).append(n)

    router.subscribe_all(handler)
    for n in range(30):
        for thread in ("A", "B", "C"):
            await conn.inject(make_message(str(n), connection_id="alpha", thread_id=thread))
    await router.join()
    assert order == {t: list(range(30)) for t in ("A", "B", "C")}


async def test_a_failing_subscriber_does_not_stop_the_others(router: TalkRouter) -> None:
    conn = TalkConnector("alpha")
    router.attach(conn)
    seen: list[str] = []

    async def broken(m: NormalizedMessage) -> None:
        raise RuntimeError("boom")

    async def fine(m: NormalizedMessage) -> None:
        seen.append(m.text)

    router.subscribe("alpha", broken)
    router.subscribe_all(fine)
    await conn.inject(make_message("still here", connection_id="alpha"))
    await router.join()
    assert seen == ["still here"]


async def test_a_subscriber_that_unsubscribes_itself_hides_the_message_from_no_other(
    router: TalkRouter,
) -> None:
    """A one-shot subscriber closing its subscription from inside its handler: the subscriber
    after it (the Bridge's own, which answers) still gets that message."""
    conn = TalkConnector("alpha")
    router.attach(conn)
    seen: list[tuple[str, str]] = []
    subscriptions: dict[str, Subscription] = {}

    def once(name: str) -> MessageHandler:
        async def handler(m: NormalizedMessage) -> None:
            seen.append((name, m.text))
            subscriptions[name].close()

        return handler

    def always(name: str) -> MessageHandler:
        async def handler(m: NormalizedMessage) -> None:
            seen.append((name, m.text))

        return handler

    subscriptions["once"] = router.subscribe("alpha", once("once"))
    router.subscribe("alpha", always("always"))
    subscriptions["all-once"] = router.subscribe_all(once("all-once"))
    router.subscribe_all(always("all-always"))
    for text in ("first", "second"):
        await conn.inject(make_message(text, connection_id="alpha"))
        await router.join()
    assert seen == [
        ("once", "first"),
        ("always", "first"),
        ("all-once", "first"),
        ("all-always", "first"),
        ("always", "second"),
        ("all-always", "second"),
    ]


async def test_a_rate_limited_connection_does_not_delay_another(router: TalkRouter) -> None:
    slow, fast = TalkConnector("slow"), TalkConnector("fast")
    router.attach(slow)
    router.attach(fast)
    slow.script.append(RateLimitedError("429 from the platform", retry_after=0.3))
    pending = asyncio.create_task(router.send("slow", OutboundMessage(thread_id="t", text="a")))
    await asyncio.wait_for(slow.attempted.wait(), 10)
    assert router.outbound("slow").rate_limited
    for i in range(20):
        await router.send("fast", OutboundMessage(thread_id=f"t{i}", text="b"))
    # All twenty went out while the slow connection was still told to wait.
    assert router.outbound("slow").rate_limited and not pending.done()
    assert len(fast.sent) == 20
    result = await pending
    assert result.message_ids == ("slow-out-1",) and slow.attempts == 2


async def test_thread_scoped_rate_limit_delays_only_that_thread(router: TalkRouter) -> None:
    conn = TalkConnector("alpha")
    router.attach(conn)
    conn.script.append(RateLimitedError("group limit", retry_after=0.3, scope="thread"))
    limited = asyncio.create_task(router.send("alpha", OutboundMessage(thread_id="g", text="1")))
    await asyncio.wait_for(conn.attempted.wait(), 10)
    await router.send("alpha", OutboundMessage(thread_id="other", text="2"))
    assert conn.texts() == ["2"] and not limited.done()
    await limited
    assert conn.texts() == ["2", "1"]


async def test_transient_failures_are_retried(router: TalkRouter) -> None:
    conn = TalkConnector("alpha")
    router.attach(conn)
    conn.script.extend([TransientError("502 bad gateway"), TransientError("connection reset")])
    result = await router.send("alpha", OutboundMessage(thread_id="t", text="hi"))
    assert result.message_ids == ("alpha-out-1",) and conn.attempts == 3


async def test_a_send_is_retried_through_an_outage_longer_than_its_attempts(
    sqlite_store: SqliteStore,
) -> None:
    # A mail server down for a while: five quick tries (about 7 s) would lose the reply.
    config = RouterConfig(retry_base_delay=0.001, send_attempts=2, send_retry_seconds=60)
    router = TalkRouter(sqlite_store, config)
    conn = TalkConnector("alpha")
    router.attach(conn)
    conn.script.extend([TransientError("connection refused")] * 8)
    result = await router.send("alpha", OutboundMessage(thread_id="t", text="kept"))
    assert result.message_ids == ("alpha-out-1",) and conn.attempts == 9
    assert await sqlite_store.failed_sends() == []


async def test_a_send_that_finally_fails_is_recorded_and_raised(
    router: TalkRouter, sqlite_store: SqliteStore
) -> None:
    conn = TalkConnector("alpha")
    router.attach(conn)
    conn.script.extend([TransientError("502")] * FAST.send_attempts)
    with pytest.raises(SendFailedError, match="502 after 5 attempts"):
        await router.send("alpha", OutboundMessage(thread_id="t", text="lost?"))
    conn.script.append(PermanentError("chat not found"))
    with pytest.raises(SendFailedError, match="chat not found"):
        await router.send("alpha", OutboundMessage(thread_id="t", text="also"))
    assert conn.attempts == FAST.send_attempts + 1  # a permanent error is not retried
    failures = await sqlite_store.failed_sends()
    assert sorted(f.text for f in failures) == ["also", "lost?"]


async def test_sends_still_queued_when_the_router_closes_fail_on_record_and_never_go_out(
    router: TalkRouter, sqlite_store: SqliteStore
) -> None:
    """An app's sends queued behind one that the platform holds up when the bridge stops (a
    long 429, past the drain): each caller is told, each send is on the failed-send record,
    and none goes out afterwards; a send asked for later is refused at once. The last queued
    caller waited for ever, and nothing was recorded."""
    conn = TalkConnector("alpha")
    router.attach(conn)
    release_first, never = asyncio.Event(), asyncio.Event()
    conn.script.extend([release_first.wait, never.wait])

    def send(text: str) -> asyncio.Task[SendResult]:
        return asyncio.create_task(router.send("alpha", OutboundMessage(thread_id="t", text=text)))

    first = send("one")  # sent from its caller's task, held up at the platform
    await asyncio.wait_for(conn.attempted.wait(), 10)
    second, third = send("two"), send("three")  # queued behind it, for the thread's order
    conn.attempted.clear()
    release_first.set()
    await asyncio.wait_for(conn.attempted.wait(), 10)  # "two" is on its way, held up
    assert (await first).message_ids == ("alpha-out-1",)
    await router.close()
    for task in (third, second):  # the last in line first: it waited for ever
        with pytest.raises(SendFailedError, match="the bridge stopped"):
            await asyncio.wait_for(task, 10)
    with pytest.raises(SendFailedError, match="the bridge stopped"):
        await router.send("alpha", OutboundMessage(thread_id="t", text="four"))
    assert conn.texts() == ["one"] and conn.attempts == 2
    failures = await sqlite_store.failed_sends()
    assert sorted(f.text for f in failures) == ["three", "two"]  # "four" was never taken


class _Deleter:
    """The `delete` feature: each call takes the next step of `script` (an error to raise,
    or an awaitable to wait for) before it deletes."""

    def __init__(self) -> None:
        self.script: list[Any] = []
        self.deleted: list[str] = []
        self.tries = 0

    async def delete(self, thread_id: str, message_id: str) -> None:
        self.tries += 1
        if self.script:
            step = self.script.pop(0)
            if isinstance(step, BaseException):
                raise step
            await step()
        self.deleted.append(message_id)


async def test_deletes_are_retried_as_sends_are_and_a_final_failure_names_the_message(
    router: TalkRouter, caplog: pytest.LogCaptureFixture
) -> None:
    """The reply to a deleted message: a delete that fails for a while (5xx, 429) is retried
    through the connection's queue; one gone already is done; one given up, or cut off by a
    stop, is an error in the log naming the connection and the message (it stays up)."""
    conn = TalkConnector("alpha")
    deleter = _Deleter()
    conn.features["delete"] = deleter
    router.attach(conn)
    deleter.script = [TransientError("503"), RateLimitedError("429", retry_after=0.001)]
    done = await router.delete("alpha", "t", "r1", why="our reply to q1")
    await asyncio.wait_for(done, 10)
    assert deleter.deleted == ["r1"] and deleter.tries == 3
    deleter.script = [NotFoundError("message_not_found")]
    await asyncio.wait_for(await router.delete("alpha", "t", "r2", why="our reply to q2"), 10)
    deleter.script = [TransientError("503")] * FAST.send_attempts
    failed = await router.delete("alpha", "t", "r3", why="our reply to q3")
    with pytest.raises(SendFailedError, match="r3 was not deleted: 503 after 5 attempts"):
        await asyncio.wait_for(failed, 10)
    begun, never = asyncio.Event(), asyncio.Event()

    async def held_up() -> None:
        begun.set()
        await never.wait()

    deleter.script = [held_up]
    await router.delete("alpha", "t", "r4", why="our reply to q4")
    await router.delete("alpha", "t", "r5", why="our reply to q5")  # queued behind it
    await asyncio.wait_for(begun.wait(), 10)
    await router.close()
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    gave_up = "alpha: giving up deleting message {} in t (our reply to {}): {}; it stays up"
    assert errors[0] == gave_up.format("r3", "q3", "503 after 5 attempts")
    assert sorted(errors[1:]) == [
        gave_up.format("r4", "q4", "the bridge stopped while it was being deleted"),
        gave_up.format("r5", "q5", "the bridge stopped before it was deleted"),
    ]
    assert deleter.deleted == ["r1"]


class _UnrecordingStore:
    """A SqliteStore that cannot record a send's idempotency key (a full disk)."""

    def __init__(self, inner: SqliteStore) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def record_sent(self, *args: Any) -> None:
        raise StoreError("database or disk is full")


async def test_a_queued_send_the_store_fails_fails_to_its_caller_instead_of_hanging(
    sqlite_store: SqliteStore,
) -> None:
    """A send queued behind another whose store step raises (recording its key) fails to its
    caller with that error, as one sent from its caller's task does. Its caller (a turn, and
    its thread behind it) waited for ever: the queue's worker logged the error, the future
    was never resolved."""
    router = TalkRouter(_UnrecordingStore(sqlite_store), FAST)  # type: ignore[arg-type]
    conn = TalkConnector("alpha")
    router.attach(conn)
    release_first = asyncio.Event()
    conn.script.append(release_first.wait)

    def send(text: str) -> asyncio.Task[SendResult]:
        message = OutboundMessage(thread_id="t", text=text, idempotency_key=text)
        return asyncio.create_task(router.send("alpha", message))

    first = send("one")  # sent from its caller's task, held up at the platform
    await asyncio.wait_for(conn.attempted.wait(), 10)
    second = send("two")  # queued behind it (its task runs before "one" is woken)
    release_first.set()
    await router.join()  # the queue's worker is done with "two"
    for task in (first, second):
        assert task.done(), "the caller of a queued send still waits"
        with pytest.raises(StoreError, match="disk is full"):
            task.result()
    assert conn.texts() == ["one", "two"]


async def test_a_send_retried_in_its_callers_task_stops_when_the_router_closes(
    router: TalkRouter, sqlite_store: SqliteStore
) -> None:
    """A send failing with a passing error while the bridge stops is not retried against the
    connection being closed (for up to `send_retry_seconds`): it fails, on record."""
    conn = TalkConnector("alpha")
    router.attach(conn)

    async def stop_then_fail() -> None:
        await router.close()
        raise TransientError("502 bad gateway")

    conn.script.append(stop_then_fail)
    with pytest.raises(SendFailedError, match="the bridge stopped before it was sent"):
        await router.send("alpha", OutboundMessage(thread_id="t", text="late"))
    assert conn.attempts == 1 and conn.texts() == []
    assert [f.text for f in await sqlite_store.failed_sends()] == ["late"]


async def test_a_stop_fails_a_queued_send_its_caller_awaits_but_not_one_of_a_turn_cut_off(
    sqlite_store: SqliteStore,
) -> None:
    """A send queued when the bridge stops fails to its caller, on record. One whose caller
    was cut off first (a turn the stop cancelled: its message runs again at the next start,
    and sends it again) was also logged "giving up on a send" and put on the failed-send
    record, as if lost."""
    router = TalkRouter(sqlite_store, FAST.model_copy(update={"send_concurrency": 1}))
    conn = TalkConnector("alpha")
    router.attach(conn)
    release = asyncio.Event()

    async def held() -> None:
        await release.wait()

    conn.script.append(held)

    def send(text: str, thread: str) -> asyncio.Task[SendResult]:
        return asyncio.create_task(
            router.send("alpha", OutboundMessage(thread_id=thread, text=text))
        )

    in_flight = send("in flight", "t1")
    await asyncio.wait_for(conn.attempted.wait(), 10)
    of_a_turn, of_an_app = send("reply", "t2"), send("app", "t3")  # both wait for the slot
    await asyncio.sleep(0)  # one loop turn (no time): both are queued
    assert router.sends_under_way() == {"alpha": 3}
    await cancel_and_wait(of_a_turn)  # the stop cancels the turns first
    await router.close()
    with pytest.raises(SendFailedError, match="the bridge stopped before it was sent"):
        await of_an_app
    assert [f.text for f in await sqlite_store.failed_sends()] == ["app"]
    release.set()  # the send in flight, in its caller's task, ends as the platform answers
    await in_flight
    assert conn.texts() == ["in flight"]


async def test_an_untranslated_connector_error_fails_without_retrying(router: TalkRouter) -> None:
    conn = TalkConnector("alpha")
    router.attach(conn)
    conn.script.append(ValueError("bug in connector"))
    with pytest.raises(SendFailedError, match="unexpected connector error: ValueError"):
        await router.send("alpha", OutboundMessage(thread_id="t", text="x"))
    assert conn.attempts == 1


async def test_idempotency_key_sends_once(router: TalkRouter) -> None:
    conn = TalkConnector("alpha")
    router.attach(conn)
    first = await router.send(
        "alpha", OutboundMessage(thread_id="t", text="x", idempotency_key="k")
    )
    again = await router.send(
        "alpha", OutboundMessage(thread_id="t", text="x", idempotency_key="k")
    )
    assert first == again and len(conn.sent) == 1


async def test_sends_to_one_thread_stay_in_order(router: TalkRouter) -> None:
    conn = TalkConnector("alpha")
    router.attach(conn)
    conn.script.append(TransientError("first try fails"))
    await asyncio.gather(
        *(router.send("alpha", OutboundMessage(thread_id="t", text=str(i))) for i in range(10))
    )
    assert conn.texts() == [str(i) for i in range(10)]


async def test_history_records_both_directions(
    router: TalkRouter, sqlite_store: SqliteStore
) -> None:
    conn = TalkConnector("alpha")
    router.attach(conn)
    msg = make_message("question", connection_id="alpha", thread_id="t")
    await conn.inject(msg)
    await router.join()
    await router.send("alpha", OutboundMessage(thread_id="t", text="answer"))
    entries = await sqlite_store.history(msg.thread_key)
    assert [(e.role, e.text) for e in entries] == [("user", "question"), ("assistant", "answer")]


class _Holding(TalkConnector):
    """Sends wait for `release`; `reached` is set once `wanted` of them are in flight."""

    def __init__(self, wanted: int, send_concurrency: int | None = None) -> None:
        super().__init__("local")
        if send_concurrency is not None:
            self.send_concurrency = send_concurrency
        self.wanted = wanted
        self.in_flight = 0
        self.reached = asyncio.Event()
        self.release = asyncio.Event()

    async def send(self, message: OutboundMessage) -> SendResult:
        self.in_flight += 1
        if self.in_flight >= self.wanted:
            self.reached.set()
        await self.release.wait()
        self.in_flight -= 1
        return SendResult(message_ids=(message.thread_id,))


async def _in_flight_at_most(router: TalkRouter, conn: _Holding, sends: int) -> int:
    """Start `sends` sends to different threads at once; how many reach the connector?"""
    router.attach(conn)
    started = asyncio.gather(
        *(router.send("local", OutboundMessage(thread_id=f"t{i}", text="x")) for i in range(sends))
    )
    await asyncio.wait_for(conn.reached.wait(), 10)
    # Every send task took its first step in the same loop turn, before `reached` woke us.
    seen = conn.in_flight
    conn.release.set()
    await asyncio.wait_for(started, 10)
    return seen


async def test_a_connector_may_allow_more_sends_in_flight_than_the_default(
    router: TalkRouter,
) -> None:
    # The webchat's sends are local writes: 8 at a time (the default) capped every user at once.
    assert await _in_flight_at_most(router, _Holding(30, send_concurrency=64), 30) == 30


async def test_by_default_a_connection_has_the_configured_sends_in_flight(
    sqlite_store: SqliteStore,
) -> None:
    router = TalkRouter(sqlite_store, RouterConfig(send_concurrency=3))
    assert await _in_flight_at_most(router, _Holding(3), 9) == 3


# -- the filter of seen messages ----------------------------------------------------------------


class StoreSpy:
    """A SqliteStore whose acceptances and filter builds the test can hold back after the
    store has queued them (as a slow disk would), and whose filter requests it records."""

    def __init__(self, inner: SqliteStore) -> None:
        self.inner = inner
        self.accepting = asyncio.Event()
        self.accepting.set()
        self.building = asyncio.Event()
        self.building.set()
        self.filter_requests: list[int] = []
        self.refuse: Exception | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def accept_inbound(self, message: NormalizedMessage, **kw: Any) -> bool:
        accepted = await self.inner.accept_inbound(message, **kw)
        await self.accepting.wait()
        if self.refuse is not None:
            raise self.refuse
        return accepted

    async def seen_inbound(self, capacity: int) -> SeenFilter:
        self.filter_requests.append(capacity)
        seen = await self.inner.seen_inbound(capacity)  # built now; handed over when released
        await self.building.wait()
        return seen


@pytest.fixture
async def spy(sqlite_store: SqliteStore) -> StoreSpy:
    return StoreSpy(sqlite_store)


def counting_router(store: Any) -> tuple[TalkRouter, TalkConnector, list[str]]:
    router = TalkRouter(store, FAST)
    conn = TalkConnector("alpha")
    router.attach(conn)
    handled: list[str] = []

    async def handler(m: NormalizedMessage) -> None:
        handled.append(m.id)

    router.subscribe_all(handler)
    return router, conn, handled


async def test_a_message_the_filter_calls_new_is_handled_while_its_acceptance_is_written(
    spy: StoreSpy,
) -> None:
    router, conn, _ = counting_router(spy)
    await router.start()
    assert await router.seen_filter() is not None
    handling = asyncio.Event()

    async def handler(m: NormalizedMessage) -> None:
        handling.set()

    router.subscribe_all(handler)
    spy.accepting.clear()  # the store has the write queued but has not confirmed it
    delivery = asyncio.create_task(conn.inject(make_message(connection_id="alpha")))
    await asyncio.wait_for(handling.wait(), 10)
    assert not delivery.done()  # the connector still waits: the platform is not acked yet
    spy.accepting.set()
    await delivery
    await router.join()
    assert await spy.inner.pending_inbound() == []  # completion came after the acceptance
    await router.close()


async def test_duplicates_are_dropped_with_the_filter_in_use_and_after_a_restart(
    tmp_path: Path,
) -> None:
    handled: list[str] = []
    for _ in range(2):
        store = SqliteStore(tmp_path / "db.sqlite")
        await store.open()
        router, conn, handled_now = counting_router(store)
        await router.start()
        assert await router.seen_filter() is not None
        same = make_message(connection_id="alpha", message_id="native-1")
        await asyncio.gather(conn.inject(same), conn.inject(same))  # in flight together
        await conn.inject(same)
        await router.join()
        handled += handled_now
        await router.close()
        await store.close()
    assert handled == ["native-1"]


async def test_messages_accepted_while_the_filter_is_built_are_in_it(spy: StoreSpy) -> None:
    router, conn, handled = counting_router(spy)
    spy.building.clear()
    await router.start()  # the store builds the filter now, before the message arrives
    await conn.inject(make_message(connection_id="alpha", message_id="early"))
    await router.join()
    spy.building.set()
    assert await router.seen_filter() is not None
    await conn.inject(make_message(connection_id="alpha", message_id="early"))
    await router.join()
    assert handled == ["early"]
    await router.close()


async def test_a_filter_at_capacity_is_replaced_by_a_larger_one(spy: StoreSpy) -> None:
    async def small(capacity: int) -> SeenFilter:  # the first one tiny, the next as asked
        spy.filter_requests.append(capacity)
        return await spy.inner.seen_inbound(16 if len(spy.filter_requests) == 1 else capacity)

    spy.seen_inbound = small  # type: ignore[method-assign]
    router, conn, handled = counting_router(spy)
    await router.start()
    first = await router.seen_filter()
    assert first is not None and first.capacity < 60
    ids = [f"m{i}" for i in range(60)]
    for mid in ids:
        await conn.inject(make_message(connection_id="alpha", message_id=mid))
    larger = await router.seen_filter()
    assert larger is not None and larger is not first and larger.capacity >= 2 * first.capacity
    assert len(spy.filter_requests) == 2
    for mid in ids:  # every key, from before and during the rebuild, is in the new filter
        await conn.inject(make_message(connection_id="alpha", message_id=mid))
    await router.join()
    assert handled == ids
    await router.close()


async def test_a_store_that_refuses_a_fast_path_acceptance_fails_the_delivery(
    spy: StoreSpy, caplog: pytest.LogCaptureFixture
) -> None:
    router, conn, _ = counting_router(spy)
    await router.start()
    assert await router.seen_filter() is not None
    spy.refuse = StoreError("disk full")
    with pytest.raises(StoreError, match="disk full"):
        await conn.inject(make_message(connection_id="alpha", message_id="n-9"))
    assert "the store refused alpha/n-9 while it was being handled: disk full" in caplog.text
    await router.join()
    await router.close()


async def test_a_redelivery_while_deliveries_wait_for_room_is_handled_once(
    sqlite_store: SqliteStore,
) -> None:
    router = TalkRouter(sqlite_store, FAST.model_copy(update={"max_pending_messages": 1}))
    conn = TalkConnector("alpha")
    router.attach(conn)
    release = asyncio.Event()
    handled: list[str] = []

    async def handler(m: NormalizedMessage) -> None:
        handled.append(m.id)
        if m.id == "a":
            await release.wait()

    router.subscribe_all(handler)
    await router.start()
    assert await router.seen_filter() is not None
    await conn.inject(make_message(connection_id="alpha", message_id="a", thread_id="t1"))
    b = make_message(connection_id="alpha", message_id="b", thread_id="t2")
    deliveries = [asyncio.create_task(conn.inject(b)) for _ in range(2)]  # both wait for room
    release.set()
    await asyncio.wait_for(asyncio.gather(*deliveries), 10)
    await router.join()
    assert handled == ["a", "b"]
    await router.close()


async def test_a_send_to_a_connection_still_starting_waits_for_it_or_fails_with_why(
    router: TalkRouter,
) -> None:
    """`talkbridge run` builds the connections while the webchat serves: a hook's Forward to
    one not built yet waits for it, and fails (as to a down connection) if it cannot start."""
    router.expect(["ops", "mail"])
    router.attaching("ops", "telegram")
    router.attaching("mail", "email")
    to_ops = asyncio.create_task(router.send("ops", OutboundMessage(thread_id="t", text="fwd")))
    ops_talk = router.talk("ops")  # as docs/hooks.md shows: it raised "not started yet"
    assert (ops_talk.connection_id, ops_talk.channel) == ("ops", "telegram")
    by_talk = asyncio.create_task(ops_talk.send(OutboundMessage(thread_id="t", text="talk")))
    to_mail = asyncio.create_task(router.send("mail", OutboundMessage(thread_id="t", text="x")))
    await asyncio.sleep(0)  # one turn of the loop (no time): the sends reach their wait
    assert not to_ops.done() and not by_talk.done() and not to_mail.done()
    with pytest.raises(ConnectionNotStartedError, match="'ops' is still starting") as starting:
        router.feature("ops", "edit")  # cannot wait: says why, not "bridge.start()"
    assert "bridge.start()" not in str(starting.value) and starting.value.starting
    ops = TalkConnector("ops")
    router.attach(ops)
    await to_ops
    await by_talk
    assert sorted(s.message.text for s in ops.sent) == ["fwd", "talk"]
    assert router.feature("ops", "edit") is None  # attached: its features answer
    router.not_attaching("mail", "aiosmtplib is missing")
    with pytest.raises(SendFailedError, match="aiosmtplib is missing"):
        await to_mail
    with pytest.raises(SendFailedError, match="aiosmtplib is missing"):
        await router.talk("mail").send(OutboundMessage(thread_id="t", text="later"))
    with pytest.raises(ConnectionNotStartedError, match="'mail' could not start: aiosmtplib"):
        router.feature("mail", "edit")


def test_the_start_failure_is_a_core_error_still_importable_from_the_router() -> None:
    from talkbridge.router.talk_router import ConnectionStartFailedError as from_router

    assert from_router is ConnectionStartFailedError
    assert issubclass(ConnectionStartFailedError, TalkbridgeError)
    failure = ConnectionStartFailedError("mail", "aiosmtplib is missing")
    assert failure.reason == "aiosmtplib is missing"
    assert str(failure) == "connection 'mail' could not start: aiosmtplib is missing"


async def test_a_message_left_on_a_connection_still_starting_is_handled_once_it_is(
    tmp_path: Path,
) -> None:
    """Recovered at the start, before its connection is built: its handling (which answers
    through that connection) waits for it, and the message is not lost."""
    await left_unfinished(tmp_path, "left over")

    store = SqliteStore(tmp_path / "db.sqlite")
    await store.open()
    router = TalkRouter(store, FAST)
    router.attaching("alpha", "telegram")
    beta = TalkConnector("beta")
    router.attach(beta)
    seen: list[tuple[str, list[str]]] = []
    beta_seen = asyncio.Event()

    async def handler(m: NormalizedMessage) -> None:
        seen.append((m.text, router.connection_ids()))
        if m.connection_id == "beta":
            beta_seen.set()

    router.subscribe_all(handler)
    assert await router.recover() == 1
    # A message handled after the left-over one began (tasks run in the order they were
    # made): by then, that one is as far as it goes before its connection is there.
    await beta.inject(make_message("later", connection_id="beta", message_id="b1"))
    await beta_seen.wait()
    router.attach(TalkConnector("alpha"))
    await router.join()
    assert seen == [("later", ["beta"]), ("left over", ["alpha", "beta"])]
    await router.close()
    await store.close()
