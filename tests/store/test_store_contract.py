"""The `Store` contract, run against every backend through the `store` fixture (see conftest)."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from talkbridge.errors import PairingExpiredError
from talkbridge.message import Attachment, MessageRouting, NormalizedMessage, ReplyTo
from talkbridge.store import FailedSend, Pairing, Retention, Store
from talkbridge.store.base import EXPIRED_PAIRINGS_KEPT

from .conftest import Reopen

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
DAY = 86_400.0


def msg(message_id: str, *, connection_id: str = "web", thread_id: str = "t1") -> NormalizedMessage:
    return NormalizedMessage(
        id=message_id,
        connection_id=connection_id,
        channel="webchat",
        channel_user_id="u1",
        display_name="Ada",
        thread_id=thread_id,
        timestamp=T0,
        text=f"text of {message_id}",
    )


def pairing(
    code: str,
    user: str = "u1",
    connection_id: str = "tg",
    *,
    at: datetime = T0,
    lasts: timedelta | None = None,
) -> Pairing:
    """A pending pairing asked for `at`, expiring `lasts` later (never when None)."""
    return Pairing(
        code=code,
        connection_id=connection_id,
        channel_user_id=user,
        display_name=f"name of {user}",
        created_at=at,
        approved=False,
        expires_at=None if lasts is None else at + lasts,
    )


HOUR = timedelta(hours=1)


# -- inbound inbox ---------------------------------------------------------------------------


async def test_accept_inbound_dedupes_per_connection(store: Store) -> None:
    assert await store.accept_inbound(msg("m1")) is True
    assert await store.accept_inbound(msg("m1")) is False
    assert await store.accept_inbound(msg("m1", connection_id="other")) is True


async def test_concurrent_duplicates_are_accepted_once(store: Store) -> None:
    results = await asyncio.gather(*(store.accept_inbound(msg("same")) for _ in range(50)))
    assert results.count(True) == 1


async def test_pending_inbound_in_arrival_order_until_completed(store: Store) -> None:
    rich = NormalizedMessage(
        id="rich",
        connection_id="tg",
        channel="telegram",
        channel_user_id="42",
        display_name="Grace",
        thread_id="-100",
        thread_name="Ops",
        thread_type="group",
        timestamp=datetime(2024, 5, 1, 14, 0, tzinfo=timezone(timedelta(hours=2))),
        text="see attached",
        attachments=(Attachment(kind="image", name="a.png", size=3, ref="file-1", meta={"w": 1}),),
        reply_to=ReplyTo(message_id="7", content="earlier", sender_name="Bob"),
        routing=MessageRouting(agent="echo", trust="trusted", flags=("x",)),
        edit_of="6",
        raw_event={"not": "stored"},
    )
    for m in (msg("a"), rich, msg("c")):
        assert await store.accept_inbound(m)
    pending = await store.pending_inbound()
    assert [m.id for m in pending] == ["a", "rich", "c"]
    assert pending[1] == rich.model_copy(update={"raw_event": None})
    assert pending[1].timestamp.utcoffset() == timedelta(0)

    await store.complete_inbound("tg", "rich")
    await store.complete_inbound("web", "unknown")  # completing what was never accepted: no-op
    assert [m.id for m in await store.pending_inbound()] == ["a", "c"]
    # A completed message is still known: a redelivery must not be processed again.
    assert await store.accept_inbound(rich) is False


async def test_pending_and_dedupe_survive_restart(store: Store, reopen: Reopen) -> None:
    for m in (msg("a"), msg("b"), msg("c")):
        await store.accept_inbound(m)
    await store.complete_inbound("web", "b")

    store = await reopen()

    assert [m for m in await store.pending_inbound()] == [msg("a"), msg("c")]
    assert await store.accept_inbound(msg("a")) is False
    assert await store.accept_inbound(msg("b")) is False
    assert await store.accept_inbound(msg("d")) is True
    assert [m.id for m in await store.pending_inbound()] == ["a", "c", "d"]


async def test_the_seen_filter_holds_every_accepted_message(store: Store, reopen: Reopen) -> None:
    """The router handles a message the filter calls new before its acceptance is written: a
    filter missing an accepted key would let a redelivery through twice."""
    accepted = [msg(f"m{i}", connection_id=f"c{i % 3}") for i in range(300)]
    for m in accepted:
        await store.accept_inbound(m)
    await store.complete_inbound("c0", "m0")  # completed ones still count: they were seen
    store = await reopen()
    seen = await store.seen_inbound(10)
    if seen is None:  # a store with several writers cannot promise this (Redis: the bus dedupes)
        return
    assert seen.capacity >= 2 * len(accepted)  # sized for what it holds, not only what was asked
    assert [seen.add(m.connection_id, m.id) for m in accepted] == [False] * len(accepted)
    assert seen.add("c0", "never-sent")


# -- history ---------------------------------------------------------------------------------


async def test_append_history_returns_the_stored_entry(store: Store) -> None:
    before = datetime.now(UTC)
    entry = await store.append_history(
        "web\x1ft1", "assistant", "out-1", "echo", "hello", {"turn": "x1", "n": [1, 2]}
    )
    assert (entry.seq, entry.thread_key, entry.role) == (1, "web\x1ft1", "assistant")
    assert (entry.message_id, entry.sender, entry.text) == ("out-1", "echo", "hello")
    assert entry.data == {"turn": "x1", "n": [1, 2]}
    assert entry.created_at.utcoffset() == timedelta(0)
    assert entry.created_at >= before - timedelta(seconds=1)
    assert list(await store.history("web\x1ft1")) == [entry]


async def test_history_order_limit_and_after_seq(store: Store) -> None:
    for i in range(1, 6):
        await store.append_history("k", "user" if i % 2 else "assistant", f"m{i}", "s", f"t{i}")
    assert [e.seq for e in await store.history("k")] == [1, 2, 3, 4, 5]
    latest = await store.history("k", limit=3)
    assert [(e.seq, e.text) for e in latest] == [(3, "t3"), (4, "t4"), (5, "t5")]
    assert [e.seq for e in await store.history("k", after_seq=1, limit=2)] == [2, 3]
    assert [e.seq for e in await store.history("k", after_seq=3)] == [4, 5]
    assert list(await store.history("k", after_seq=5)) == []
    assert list(await store.history("other")) == []
    assert all(e.data == {} for e in await store.history("k"))


async def test_history_pages_back_with_before_seq(store: Store) -> None:
    for i in range(1, 8):
        await store.append_history("k", "user", f"m{i}", "s", f"t{i}")

    async def seqs(**window: int) -> list[int]:
        return [e.seq for e in await store.history("k", **window)]

    assert await seqs(before_seq=6, limit=3) == [3, 4, 5]
    assert await seqs(before_seq=3, limit=3) == [1, 2]  # entry 1 is reachable going back
    assert await seqs(before_seq=1, limit=3) == []
    assert await seqs(before_seq=100, limit=2) == [6, 7]
    with pytest.raises(ValueError, match="not both"):
        await store.history("k", after_seq=2, before_seq=5)


async def test_seq_is_per_thread(store: Store) -> None:
    seqs = []
    for key in ("a", "b", "a", "a", "b"):
        seqs.append((key, (await store.append_history(key, "user", "m", "s", "x")).seq))
    assert seqs == [("a", 1), ("b", 1), ("a", 2), ("a", 3), ("b", 2)]


async def test_seq_continues_after_restart(store: Store, reopen: Reopen) -> None:
    for _ in range(3):
        await store.append_history("k", "user", "m", "s", "x")
    store = await reopen()
    assert (await store.append_history("k", "user", "m", "s", "after")).seq == 4
    assert [e.seq for e in await store.history("k")] == [1, 2, 3, 4]


async def test_concurrent_appends_get_gapless_unique_seqs(store: Store) -> None:
    entries = await asyncio.gather(
        *(store.append_history("busy", "user", f"m{i}", "s", str(i)) for i in range(200))
    )
    assert sorted(e.seq for e in entries) == list(range(1, 201))
    stored = await store.history("busy", limit=200)
    assert [e.seq for e in stored] == list(range(1, 201))
    by_id = {e.message_id: e.seq for e in entries}
    assert all(by_id[e.message_id] == e.seq for e in stored)


async def test_append_history_once_records_a_native_id_one_time(
    store: Store, reopen: Reopen
) -> None:
    key = "web\x1fs.c"
    first = await store.append_history_once("web", "s.c:a", key, "user", "s", "hi", {"n": 1})
    assert first.entry is not None and first.seq == first.entry.seq == 1
    assert (first.entry.message_id, first.entry.text, first.entry.data) == ("s.c:a", "hi", {"n": 1})
    # Concurrent resends and a different text under the same id: never a second entry.
    again = await asyncio.gather(
        *(store.append_history_once("web", "s.c:a", key, "user", "s", "edited") for _ in range(3))
    )
    assert [(a.seq, a.entry) for a in again] == [(1, None)] * 3
    # Another id, or the same id on another connection, is a new entry.
    other = await store.append_history_once("web", "s.c:b", key, "user", "s", "there")
    elsewhere = await store.append_history_once("tg", "s.c:a", key, "user", "s", "x")
    assert (other.seq, elsewhere.seq) == (2, 3)
    assert await store.history_seq("web", "s.c:b") == 2
    assert await store.history_seq("web", "s.c:zzz") is None
    # The bridge maps the same native id to its reply: the record of the entry is not touched.
    await store.map_id("web", "s.c:a", "reply-1")
    assert await store.lookup_id("web", "s.c:a") == "reply-1"
    store = await reopen()
    assert await store.append_history_once("web", "s.c:a", key, "user", "s", "hi") == (1, None)
    assert await store.history_seq("web", "s.c:a") == 1
    assert await store.lookup_id("web", "s.c:a") == "reply-1"
    assert [e.text for e in await store.history(key)] == ["hi", "there", "x"]


async def test_append_history_once_dedupes_within_one_batch(store: Store) -> None:
    key = "web\x1fs.d"
    results = await asyncio.gather(
        *(store.append_history_once("web", f"s.d:{i % 2}", key, "user", "s", "t") for i in range(6))
    )
    assert [r.seq for r in results] == [1, 2, 1, 2, 1, 2]
    assert [r.entry is not None for r in results] == [True, True] + [False] * 4
    assert len(await store.history(key)) == 2


async def test_forget_history_erases_deleted_messages_their_edits_and_replies(
    store: Store, reopen: Reopen
) -> None:
    """A message deleted on its platform (and our reply taken back with it) is forgotten: its
    entries keep their places, so seqs and paging stay true, but say nothing any more."""
    key = "sl\x1fD1"
    await store.append_history(key, "user", "D1:1", "Ada", "kept")
    await store.append_history(key, "assistant", "D1:2", "echo", "answer to kept")
    assert await store.accept_inbound(
        msg("D1:3").model_copy(
            update={"connection_id": "sl", "thread_id": "D1", "text": "my password is hunter2"}
        ),
        record_history=True,
    )
    await store.append_history(key, "assistant", "D1:4", "echo", "noted: hunter2", {"n": 1})
    edit = msg("D1:3:edit:9").model_copy(
        update={"connection_id": "sl", "thread_id": "D1", "text": "hunter3", "edit_of": "D1:3"}
    )
    assert await store.accept_inbound(edit, record_history=True)
    await store.append_history("sl\x1fD2", "user", "D1:3", "Ada", "another thread, same id")
    assert await store.forget_history(key, ["D1:3", "D1:4", "never-seen"]) == 3
    entries = await store.history(key)
    assert [e.seq for e in entries] == [1, 2, 3, 4, 5]
    assert [(e.message_id, e.sender, e.text, e.deleted) for e in entries] == [
        ("D1:1", "Ada", "kept", False),
        ("D1:2", "echo", "answer to kept", False),
        ("D1:3", "", "", True),
        ("D1:4", "", "", True),
        ("D1:3:edit:9", "", "", True),
    ]
    assert [e.role for e in entries] == ["user", "assistant", "user", "assistant", "user"]
    assert all(e.data == {"deleted": True} for e in entries[2:])
    assert [e.text for e in await store.history("sl\x1fD2")] == ["another thread, same id"]
    assert await store.forget_history(key, ["D1:3", "D1:4"]) == 0  # the same deletion again
    assert await store.forget_history(key, []) == 0
    assert await store.forget_history("sl\x1fnowhere", ["D1:1"]) == 0
    store = await reopen()
    assert [e.text for e in await store.history(key)] == ["kept", "answer to kept", "", "", ""]
    assert (await store.append_history(key, "user", "D1:6", "Ada", "next")).seq == 6


# -- retention -------------------------------------------------------------------------------

WEEK = Retention(dedupe=timedelta(days=7), sent=timedelta(days=7), failed_sends=timedelta(days=30))


def failure(text: str, failed_at: datetime) -> FailedSend:
    return FailedSend(
        connection_id="tg", thread_id="t", text=text, reason="boom", failed_at=failed_at
    )


async def test_prune_forgets_what_only_guards_against_repeats(store: Store, reopen: Reopen) -> None:
    now = datetime.now(UTC)
    for mid in ("done", "pending"):
        assert await store.accept_inbound(msg(mid))
    await store.complete_inbound("web", "done")
    await store.record_sent("tg", "reply:1", ["out-1"])
    await store.record_failed_send(failure("old", now - timedelta(days=31)))
    await store.record_failed_send(failure("recent", now - timedelta(days=29)))
    # Nothing is a week old yet; only the failure past 30 days goes.
    first = await store.prune(now=now, keep=WEEK)
    assert (first.dedupe, first.sent, first.failed_sends, first.more) == (0, 0, 1, False)
    assert await store.sent_result("tg", "reply:1") == ["out-1"]
    assert not await store.accept_inbound(msg("done"))
    assert [f.text for f in await store.failed_sends()] == ["recent"]

    store = await reopen()
    later = await store.prune(now=now + timedelta(days=7, seconds=1), keep=WEEK)
    assert (later.dedupe, later.sent, later.more) == (1, 1, False)
    assert await store.sent_result("tg", "reply:1") is None
    assert await store.accept_inbound(msg("done"))  # forgotten: a redelivery is new now
    assert not await store.accept_inbound(msg("pending"))  # unfinished work is never forgotten
    assert [m.id for m in await store.pending_inbound()] == ["pending", "done"]


async def test_prune_works_in_bounded_steps(store: Store) -> None:
    now = datetime.now(UTC)
    for i in range(7):
        assert await store.accept_inbound(msg(f"m{i}"))
        await store.complete_inbound("web", f"m{i}")
    await store.prune(now=now, keep=WEEK)
    later = now + timedelta(days=8)
    steps = []
    while True:
        step = await store.prune(now=later, keep=WEEK, limit=3)
        steps.append(step.dedupe)
        if not step.more:
            break
    assert sum(steps) == 7 and max(steps) <= 3
    assert all([await store.accept_inbound(msg(f"m{i}")) for i in range(7)])


async def test_prune_refuses_a_naive_now(store: Store) -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        await store.prune(now=datetime(2026, 1, 1), keep=WEEK)


# -- id map ----------------------------------------------------------------------------------


async def test_id_map_both_ways(store: Store, reopen: Reopen) -> None:
    await store.map_id("tg", "native-1", "msg-1")
    await store.map_id("tg", "native-2", "msg-2")
    assert await store.lookup_id("tg", "native-1") == "msg-1"
    assert await store.lookup_native("tg", "msg-2") == "native-2"
    assert await store.lookup_id("slack", "native-1") is None
    assert await store.lookup_native("slack", "msg-1") is None
    assert await store.lookup_id("tg", "nope") is None

    await store.map_id("tg", "native-1", "msg-1b")  # a remap wins
    assert await store.lookup_id("tg", "native-1") == "msg-1b"

    store = await reopen()
    assert await store.lookup_id("tg", "native-2") == "msg-2"
    assert await store.lookup_native("tg", "msg-1b") == "native-1"


# -- outbound --------------------------------------------------------------------------------


async def test_sent_results_make_sends_idempotent(store: Store, reopen: Reopen) -> None:
    assert await store.sent_result("tg", "key-1") is None
    await store.record_sent("tg", "key-1", ["10", "11"])
    assert await store.sent_result("tg", "key-1") == ["10", "11"]
    assert await store.sent_result("slack", "key-1") is None
    store = await reopen()
    assert await store.sent_result("tg", "key-1") == ["10", "11"]


async def test_failed_sends_newest_first(store: Store) -> None:
    assert list(await store.failed_sends()) == []
    failures = [
        FailedSend("tg", f"chat{i}", f"text {i}", "429 forever", T0 + timedelta(minutes=i))
        for i in range(3)
    ]
    for f in failures:
        await store.record_failed_send(f)
    assert list(await store.failed_sends()) == failures[::-1]
    assert list(await store.failed_sends(limit=2)) == [failures[2], failures[1]]


# -- trust and pairing -----------------------------------------------------------------------


async def test_trust(store: Store, reopen: Reopen) -> None:
    assert await store.is_trusted("tg", "u1") is False
    await store.set_trusted("tg", "u1", True)
    assert await store.is_trusted("tg", "u1") is True
    assert await store.is_trusted("slack", "u1") is False
    await store.set_trusted("tg", "u1", True)  # idempotent
    await store.set_trusted("tg", "u2", True)
    await store.set_trusted("tg", "u2", False)
    assert await store.is_trusted("tg", "u2") is False
    store = await reopen()
    assert await store.is_trusted("tg", "u1") is True
    assert await store.is_trusted("tg", "u2") is False


async def test_trust_read_racing_a_write_is_not_kept(store: Store) -> None:
    # The read is issued before the write, so it may answer False, but that stale answer must
    # not stick in any cache.
    await asyncio.gather(store.is_trusted("tg", "u1"), store.set_trusted("tg", "u1", True))
    assert await store.is_trusted("tg", "u1") is True
    await asyncio.gather(store.is_trusted("tg", "u1"), store.set_trusted("tg", "u1", False))
    assert await store.is_trusted("tg", "u1") is False


async def test_pending_pairing_is_reused_per_sender(store: Store) -> None:
    first = await store.create_pairing(pairing("ABC123"))
    assert first == pairing("ABC123")
    again = await store.create_pairing(pairing("ZZZ999"))
    assert again == pairing("ABC123")
    other = await store.create_pairing(pairing("QQQ111", user="u2"))
    assert other.code == "QQQ111"
    assert [p.code for p in await store.pairings()] == ["ABC123", "QQQ111"]


async def test_approve_pairing_trusts_the_sender(store: Store, reopen: Reopen) -> None:
    await store.create_pairing(pairing("ABC123"))
    assert await store.is_trusted("tg", "u1") is False  # may now be cached: approval must win
    assert await store.approve_pairing("nope") is None

    approved = await store.approve_pairing("abc123")  # codes match case-insensitively
    assert approved is not None
    assert approved.approved is True
    assert (approved.code, approved.channel_user_id) == ("ABC123", "u1")
    assert approved.created_at == T0
    assert await store.is_trusted("tg", "u1") is True
    assert list(await store.pairings()) == []
    assert list(await store.pairings(include_approved=True)) == [approved]

    # Once approved, a new pairing for the same sender is a new pending one.
    fresh = await store.create_pairing(pairing("NEW777"))
    assert fresh.code == "NEW777"
    store = await reopen()
    assert [p.code for p in await store.pairings()] == ["NEW777"]
    assert await store.is_trusted("tg", "u1") is True


async def test_revoke_pairing_forgets_it_and_the_trust_it_gave(
    store: Store, reopen: Reopen
) -> None:
    await store.create_pairing(pairing("ABC123"))
    await store.approve_pairing("ABC123")
    assert await store.is_trusted("tg", "u1") is True  # may now be cached: revocation must win
    assert await store.revoke_pairing("nope") is None

    revoked = await store.revoke_pairing("abc123")
    assert revoked is not None and revoked.approved is True  # as it was
    assert (revoked.code, revoked.channel_user_id) == ("ABC123", "u1")
    assert await store.is_trusted("tg", "u1") is False
    assert list(await store.pairings(include_approved=True)) == []

    # The sender meets the sentinel again and gets a new code; a pending one can be dropped.
    fresh = await store.create_pairing(pairing("NEW777"))
    assert fresh.code == "NEW777"
    dropped = await store.revoke_pairing("NEW777")
    assert dropped is not None and dropped.approved is False
    assert (await store.create_pairing(pairing("THIRD3"))).code == "THIRD3"
    store = await reopen()
    assert [p.code for p in await store.pairings()] == ["THIRD3"]
    assert await store.is_trusted("tg", "u1") is False


async def test_a_pending_pairing_expires_and_its_sender_gets_a_fresh_code(
    store: Store, reopen: Reopen
) -> None:
    given = await store.create_pairing(pairing("ABC123", lasts=HOUR))
    assert given.expires_at == T0 + HOUR
    minute = timedelta(minutes=1)
    assert list(await store.pairings(now=T0 + HOUR - minute)) == [given]
    assert list(await store.pairings(now=T0 + HOUR)) == []  # `pair list` no longer shows it
    assert list(await store.pairings(include_approved=True, now=T0 + HOUR)) == [given]

    with pytest.raises(PairingExpiredError, match="ABC123 expired at 2024-05-01 13:00 UTC") as info:
        await store.approve_pairing("abc123", now=T0 + HOUR)
    assert info.value.pairing == given
    assert "writing again" in str(info.value)
    assert await store.is_trusted("tg", "u1") is False
    store = await reopen()
    with pytest.raises(PairingExpiredError):  # still refused, not taken for approved
        await store.approve_pairing("ABC123", now=T0 + HOUR)

    # The sender writes again: a fresh code, and the expired one is gone, not piled up.
    fresh = await store.create_pairing(pairing("NEW777", at=T0 + 2 * HOUR, lasts=HOUR))
    assert fresh.code == "NEW777"
    assert list(await store.pairings(include_approved=True, now=T0 + 2 * HOUR)) == [fresh]
    assert await store.approve_pairing("ABC123", now=T0 + 2 * HOUR) is None
    approved = await store.approve_pairing("NEW777", now=T0 + 2 * HOUR + minute)
    assert approved is not None and approved.approved
    assert await store.is_trusted("tg", "u1") is True
    # An approval does not expire: listed and approvable (again) long after the code's time.
    later = T0 + 1000 * HOUR
    assert list(await store.pairings(include_approved=True, now=later)) == [approved]
    assert await store.approve_pairing("NEW777", now=later) == approved


async def test_a_sender_writing_while_pending_keeps_one_code(store: Store) -> None:
    first = await store.create_pairing(pairing("ABC123", lasts=HOUR))
    for n in range(5):
        again = pairing(f"XYZ{n}", at=T0 + n * timedelta(minutes=10), lasts=HOUR)
        assert await store.create_pairing(again) == first
    assert list(await store.pairings(include_approved=True, now=T0)) == [first]
    approved = await store.approve_pairing("ABC123", now=T0 + HOUR - timedelta(seconds=1))
    assert approved is not None and approved.approved


async def test_pairings_expired_long_ago_are_forgotten_when_a_code_is_given(
    store: Store,
) -> None:
    """Senders who never write again do not grow the store for ever; one whose code expired
    lately is kept a while, so `pair approve` can say it expired. Approvals stay, and so does
    a pairing given without a lifetime."""
    for n in range(3):
        await store.create_pairing(pairing(f"OLD{n}", user=f"gone{n}", lasts=HOUR))
    week = 7 * 24 * HOUR
    await store.create_pairing(pairing("FOREVER", user="u2", at=T0 + week))
    await store.create_pairing(pairing("KEPT1", user="u3", at=T0 + week, lasts=HOUR))
    await store.create_pairing(pairing("TOAPPROVE", user="u4", lasts=HOUR))
    assert await store.approve_pairing("TOAPPROVE", now=T0) is not None
    now = T0 + HOUR + EXPIRED_PAIRINGS_KEPT + timedelta(minutes=1)
    await store.create_pairing(pairing("NEW777", user="u5", at=now, lasts=HOUR))
    kept = [p.code for p in await store.pairings(include_approved=True, now=now)]
    assert kept == ["FOREVER", "KEPT1", "TOAPPROVE", "NEW777"]
    assert [p.code for p in await store.pairings(now=now)] == ["FOREVER", "NEW777"]


async def test_pairing_times_must_be_timezone_aware(store: Store) -> None:
    naive = datetime(2024, 5, 1, 12, 0)
    with pytest.raises(ValueError, match="timezone-aware"):
        await store.create_pairing(pairing("ABC123", at=naive))
    with pytest.raises(ValueError, match="timezone-aware"):
        await store.pairings(now=naive)
    with pytest.raises(ValueError, match="timezone-aware"):
        await store.approve_pairing("ABC123", now=naive)


async def test_dropping_a_pending_code_keeps_the_trust_of_the_senders_approval(
    store: Store,
) -> None:
    """A pending code never trusted anyone: dropping one that an approved sender was given
    (as the sentinel did for a trusted sender's mail Cc'ing a stranger) took their trust."""
    await store.create_pairing(pairing("ABC123"))
    await store.approve_pairing("ABC123")
    await store.create_pairing(pairing("NEW777"))
    assert await store.is_trusted("tg", "u1") is True  # may now be cached: a drop must not win
    dropped = await store.revoke_pairing("NEW777")
    assert dropped is not None and not dropped.approved
    assert await store.is_trusted("tg", "u1") is True
    assert [p.code for p in await store.pairings(include_approved=True)] == ["ABC123"]


# -- state -----------------------------------------------------------------------------------


async def test_state_get_set_overwrite(store: Store, reopen: Reopen) -> None:
    assert await store.get_state("tg:offset") is None
    await store.set_state("tg:offset", "100")
    await store.set_state("tg:offset", "101")
    await store.set_state("imap:uid", "7")
    assert await store.get_state("tg:offset") == "101"
    store = await reopen()
    assert await store.get_state("tg:offset") == "101"
    assert await store.get_state("imap:uid") == "7"


async def test_delete_state_forgets_the_entry_kept_for_good_or_for_a_while(
    store: Store, reopen: Reopen
) -> None:
    await store.set_state("offset", "for good")
    await store.set_state("progress", "for a day", keep_for=timedelta(days=1))
    await store.set_state("other", "stays")
    await store.delete_state("offset")
    await store.delete_state("progress")
    await store.delete_state("never-set")  # nothing to forget: no error
    store = await reopen()
    assert await store.get_state("offset") is None
    assert await store.get_state("progress") is None
    assert await store.get_state("other") == "stays"


def written_at(store: Store, moment: float) -> None:
    """Set the clock `keep_for` deadlines are measured by (Redis then expires on its own)."""
    store.wall_clock = lambda: moment


async def test_state_kept_for_a_while_reads_as_gone_once_that_ran_out(
    store: Store, reopen: Reopen
) -> None:
    now = time.time()
    written_at(store, now - 2 * DAY)  # two days ago
    await store.set_state("album:1", "ran out a day ago", keep_for=timedelta(days=1))
    await store.set_state("album:2", "a day left", keep_for=timedelta(days=3))
    await store.set_state("offset", "for good")
    written_at(store, now)
    assert await store.get_state("album:1") is None  # at once: no sweep needed
    assert await store.get_state("album:2") == "a day left"
    assert await store.get_state("offset") == "for good"
    await store.prune(now=datetime.fromtimestamp(now, UTC), keep=WEEK)
    store = await reopen()  # deadlines are kept with the data
    assert await store.get_state("album:1") is None
    assert await store.get_state("album:2") == "a day left"
    assert await store.get_state("offset") == "for good"


async def test_set_state_replaces_the_deadline_with_the_value(store: Store) -> None:
    now = time.time()
    written_at(store, now - 2 * DAY)
    await store.set_state("k", "for good")
    await store.set_state("k", "for a day", keep_for=timedelta(days=1))  # ran out a day ago
    await store.set_state("j", "for three days", keep_for=timedelta(days=3))
    await store.set_state("j", "for good")
    written_at(store, now + 2 * DAY)  # past j's first deadline
    assert await store.get_state("k") is None  # the value kept for good does not come back
    assert await store.get_state("j") == "for good"


@pytest.mark.parametrize(
    ("keep_for", "error", "says"),
    [
        (timedelta(0), ValueError, "keep_for must be positive, got 0:00:00"),
        (timedelta(seconds=-1), ValueError, "keep_for must be positive"),
        (3600, TypeError, "keep_for must be a timedelta or None, got int"),
    ],
)
async def test_keep_for_is_a_positive_timedelta(
    store: Store, keep_for: Any, error: type[Exception], says: str
) -> None:
    with pytest.raises(error, match=re.escape(says)):
        await store.set_state("k", "v", keep_for=keep_for)
    assert await store.get_state("k") is None


# -- failure isolation -----------------------------------------------------------------------


async def test_a_failing_operation_does_not_fail_its_neighbours(store: Store) -> None:
    # A lone surrogate cannot be encoded for storage, so this one call fails inside the store.
    calls: list[Awaitable[object]] = [store.set_state(f"k{i}", str(i)) for i in range(20)]
    calls.insert(10, store.set_state("bad\ud800", "x"))
    calls.append(store.append_history("k", "user", "m", "s", "after"))
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert isinstance(results[10], Exception)
    assert not any(isinstance(r, BaseException) for i, r in enumerate(results) if i != 10)
    assert [await store.get_state(f"k{i}") for i in range(20)] == [str(i) for i in range(20)]
    assert [e.text for e in await store.history("k")] == ["after"]


async def test_naive_datetimes_are_refused(store: Store) -> None:
    naive = FailedSend("tg", "c", "t", "r", datetime(2024, 1, 1))
    with pytest.raises(ValueError, match="timezone"):
        await store.record_failed_send(naive)
    assert list(await store.failed_sends()) == []


async def test_queued_history_is_seen_by_later_reads_in_order(store: Store) -> None:
    await store.append_history("q", "user", "n1", "ann", "question")
    store.queue_history("q", "assistant", "n2", "bridge", "answer")
    store.queue_history("q", "user", "n3", "ann", "thanks")
    entries = await store.history("q")
    assert [(e.seq, e.role, e.text) for e in entries] == [
        (1, "user", "question"),
        (2, "assistant", "answer"),
        (3, "user", "thanks"),
    ]


# -- durable hook queue ----------------------------------------------------------------------


async def enqueue(
    store: Store,
    event_id: str,
    *,
    conversation: str = "c1",
    handlers: tuple[str, ...] = ("h",),
    app_id: str = "app",
    at: datetime = T0,
    capacity: int = 1000,
) -> int:
    return await store.enqueue_hook_event(
        app_id, handlers, conversation, event_id, f'{{"id": "{event_id}"}}', at, capacity=capacity
    )


async def claim(
    store: Store, now: datetime = T0, *, handlers: tuple[str, ...] = ("h",), app_id: str = "app"
) -> list[tuple[str, str]]:
    found = await store.claim_hook_deliveries(
        app_id, handlers, now=now, lease_until=now + timedelta(seconds=30), limit=100
    )
    return [(d.handler, d.event_id) for d in found]


async def test_hook_queue_delivers_the_head_of_each_conversation(store: Store) -> None:
    for event_id, conversation in (("a1", "a"), ("b1", "b"), ("a2", "a")):
        await enqueue(store, event_id, conversation=conversation)
    [first, second] = await store.claim_hook_deliveries(
        "app", ["h"], now=T0, lease_until=T0 + timedelta(seconds=30), limit=10
    )
    assert (first.event_id, first.conversation, first.attempts) == ("a1", "a", 0)
    assert first.body == '{"id": "a1"}' and first.app_id == "app" and first.created_at == T0
    assert second.event_id == "b1"
    # Leased: hidden until the lease ends, and "a2" waits behind "a1".
    assert await claim(store, T0 + timedelta(seconds=29)) == []
    await store.ack_hook_delivery(first.id)
    assert await claim(store, T0 + timedelta(seconds=1)) == [("h", "a2")]
    # A worker that died without ack or fail: the lease expires and "b1" comes again.
    assert await claim(store, T0 + timedelta(seconds=30.5)) == [("h", "b1")]


async def test_hook_queue_one_delivery_per_handler_and_app(store: Store) -> None:
    await enqueue(store, "e1", handlers=("billing", "crm"))
    await enqueue(store, "e2", app_id="other")
    assert await claim(store, handlers=("billing", "crm")) == [("billing", "e1"), ("crm", "e1")]
    assert await claim(store, handlers=("h",), app_id="other") == [("h", "e2")]
    assert await claim(store, handlers=("nobody",)) == []


async def test_hook_queue_retry_dead_letter_and_replay(store: Store, reopen: Reopen) -> None:
    await enqueue(store, "e1")
    await enqueue(store, "e2")
    [d] = await store.claim_hook_deliveries(
        "app", ["h"], now=T0, lease_until=T0 + timedelta(seconds=30), limit=10
    )
    await store.fail_hook_delivery(d.id, "boom 1", retry_at=T0 + timedelta(seconds=5))
    assert await claim(store, T0 + timedelta(seconds=4)) == []  # backing off; e2 waits
    [d] = await store.claim_hook_deliveries(
        "app", ["h"], now=T0 + timedelta(seconds=5), lease_until=T0 + timedelta(1), limit=10
    )
    assert (d.event_id, d.attempts, d.last_error) == ("e1", 1, "boom 1")
    await store.fail_hook_delivery(d.id, "boom 2", retry_at=None)  # a dead letter
    # ...which no longer holds back its conversation
    assert await claim(store, T0 + timedelta(seconds=5)) == [("h", "e2")]

    store = await reopen()
    [dead] = await store.hook_backlog(app_id="app", dead=True)
    assert (dead.id, dead.event_id, dead.attempts, dead.dead) == (d.id, "e1", 2, True)
    assert dead.last_error == "boom 2"
    assert [x.event_id for x in await store.hook_backlog()] == ["e1", "e2"]
    assert [x.event_id for x in await store.hook_backlog(dead=False)] == ["e2"]
    assert list(await store.hook_backlog(app_id="other")) == []

    assert await store.replay_hook_deliveries([dead.id], now=T0, app_id="other") == 0
    assert await store.replay_hook_deliveries([dead.id], now=T0 + timedelta(1)) == 1
    assert list(await store.hook_backlog(dead=True)) == []
    [again] = await store.claim_hook_deliveries(
        "app", ["h"], now=T0 + timedelta(1), lease_until=T0 + timedelta(2), limit=10
    )
    assert (again.event_id, again.attempts) == ("e1", 0)
    await store.fail_hook_delivery(again.id, "x", retry_at=None)
    assert await store.replay_hook_deliveries(None, now=T0, app_id="app") == 1


async def test_hook_queue_release_gives_the_lease_back(store: Store) -> None:
    await enqueue(store, "e1")
    [d] = await store.claim_hook_deliveries(
        "app", ["h"], now=T0, lease_until=T0 + timedelta(seconds=30), limit=10
    )
    await store.release_hook_delivery(d.id, now=T0)
    [again] = await store.claim_hook_deliveries(
        "app", ["h"], now=T0, lease_until=T0 + timedelta(seconds=30), limit=10
    )
    assert (again.id, again.attempts) == (d.id, 0)
    await store.ack_hook_delivery(d.id)
    await store.ack_hook_delivery(d.id)  # twice: a no-op
    await store.fail_hook_delivery(d.id, "late", retry_at=None)  # after the ack: a no-op
    assert list(await store.hook_backlog()) == []


async def test_hook_queue_capacity_drops_the_oldest_per_handler(store: Store) -> None:
    for i in range(5):
        assert await enqueue(store, f"e{i}", conversation=f"c{i}", capacity=3) == (
            1 if i >= 3 else 0
        )
    await enqueue(store, "x", handlers=("other",), capacity=3)
    assert [d.event_id for d in await store.hook_backlog()] == ["e2", "e3", "e4", "x"]
    assert await claim(store) == [("h", "e2"), ("h", "e3"), ("h", "e4")]


async def test_hook_queue_retention_and_clearing_an_app(store: Store, reopen: Reopen) -> None:
    await enqueue(store, "old", at=T0)
    await enqueue(store, "new", at=T0 + timedelta(days=2))
    await enqueue(store, "elsewhere", app_id="b", at=T0 + timedelta(days=2))
    assert await store.purge_hook_events(older_than=T0 + timedelta(days=1)) == 1
    assert [d.event_id for d in await store.hook_backlog()] == ["new", "elsewhere"]
    assert await store.clear_hook_events("app") == 1
    store = await reopen()
    assert [d.event_id for d in await store.hook_backlog()] == ["elsewhere"]
    assert await claim(store, T0 + timedelta(days=3)) == []
    await enqueue(store, "after", at=T0 + timedelta(days=3))  # the app takes events again
    assert await claim(store, T0 + timedelta(days=3)) == [("h", "after")]
