"""The persistence contract: one interface; SQLite (embedded) and Redis (scale-out) implement it.

Every method returns an awaitable (a coroutine, or for `accept_inbound` possibly a future queued
when called), except the few marked otherwise, and none may block the event loop. Keys that name
a conversation use `thread_key` = `connection_id + "\\x1f" + thread_id` (see
`NormalizedMessage.thread_key`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal, NamedTuple, Protocol

from talkbridge.message import NormalizedMessage
from talkbridge.store.seen import SeenFilter

Role = Literal["user", "assistant", "system"]


DELETED = "deleted"
"""The `data` key `Store.forget_history` leaves (True) in the entries it erases."""


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """One message of a thread as the bridge saw it; `seq` grows by one per thread, from 1."""

    seq: int
    thread_key: str
    role: Role
    message_id: str
    """Native id on the platform (inbound) or the first sent id (outbound)."""
    sender: str
    text: str
    created_at: datetime
    data: dict[str, Any] = field(default_factory=dict)
    """Extra JSON-able fields (client ids, turn ids, attachments) a connector wants back."""

    @property
    def deleted(self) -> bool:
        """Erased by `Store.forget_history`: the message was deleted on its platform (or was
        our reply to one). Its text is gone; what shows a conversation skips it."""
        return self.data.get(DELETED) is True

    def __reduce__(self) -> tuple[Any, ...]:
        # Entries cross from the SQLite writer process by the thousand; a slots dataclass's
        # own pickling goes through `dataclasses.fields()` for each one.
        return (
            HistoryEntry,
            (
                self.seq,
                self.thread_key,
                self.role,
                self.message_id,
                self.sender,
                self.text,
                self.created_at,
                self.data,
            ),
        )


def once_key(native_id: str) -> str:
    """Where a store keeps `append_history_once`'s record of a native id, in its id map's space:
    not under the native id itself, which the bridge maps to the reply it sent."""
    return f"\x1fonce\x1f{native_id}"


class Appended(NamedTuple):
    """What `append_history_once` did: `entry` is None when the native id was recorded before,
    and `seq` is then the earlier entry's."""

    seq: int
    entry: HistoryEntry | None


@dataclass(frozen=True, slots=True)
class Pairing:
    code: str
    connection_id: str
    channel_user_id: str
    display_name: str
    created_at: datetime
    approved: bool
    expires_at: datetime | None = None
    """Until when a pending pairing can be approved (None: until it is approved or revoked).
    A code asked for long ago is no proof the operator still knows who asked for it."""

    def expired(self, now: datetime) -> bool:
        """Pending and past `expires_at`: approving it is refused, and the sender's next
        message gets a fresh code."""
        return not self.approved and self.expires_at is not None and self.expires_at <= now


EXPIRED_PAIRINGS_KEPT = timedelta(days=7)
"""How long a store keeps an expired pending pairing, so `pair approve` of its code can say it
expired rather than that it never existed; after that, `create_pairing` forgets it."""
FORGET_EXPIRED_PER_CALL = 100
"""Long-expired pairings one `create_pairing` forgets at most: more than it adds, so they never
pile up, and few enough that no call takes long."""


@dataclass(frozen=True, slots=True)
class FailedSend:
    connection_id: str
    thread_id: str
    text: str
    reason: str
    failed_at: datetime


@dataclass(frozen=True, slots=True)
class Retention:
    """How long the store keeps what only guards against repeats (see `Store.prune`)."""

    dedupe: timedelta
    """Ids of handled inbound messages: a redelivery after this is taken for a new message."""
    sent: timedelta
    """Idempotency records of sends: a retry with the same key after this sends again."""
    failed_sends: timedelta


class Pruned(NamedTuple):
    dedupe: int
    sent: int
    failed_sends: int
    more: bool
    """A limit was reached: call `prune` again for the rest."""
    expired_state: int = 0
    """State entries past their `keep_for` (SQLite; Redis drops them itself)."""


@dataclass(frozen=True, slots=True)
class HookDelivery:
    """One durable hook event waiting for one handler (see `talkbridge.hooks.durable`).

    `id` grows in enqueue order across the whole store; it is what `talkbridge hooks
    dead-letters replay ID` names.
    """

    id: int
    app_id: str
    handler: str
    conversation: str
    """Ordering key: deliveries of one (handler, conversation) go one at a time, oldest first."""
    event_id: str
    body: str
    """The event as JSON."""
    created_at: datetime
    attempts: int = 0
    """Failed attempts so far."""
    dead: bool = False
    last_error: str | None = None


def state_deadline(now: float, keep_for: timedelta | None) -> float | None:
    """When an entry `set_state` keeps `keep_for` from `now` (epoch seconds) runs out; None:
    never. Raises on a lifetime that is no positive `timedelta`."""
    if keep_for is None:
        return None
    if not isinstance(keep_for, timedelta):
        raise TypeError(f"keep_for must be a timedelta or None, got {type(keep_for).__name__}")
    if keep_for <= timedelta(0):
        raise ValueError(f"keep_for must be positive, got {keep_for}")
    return now + keep_for.total_seconds()


def check_history_window(limit: int, after_seq: int, before_seq: int) -> bool:
    """Whether a `history` read can return anything; raises on a window no store reads."""
    if min(limit, after_seq, before_seq) < 0:
        raise ValueError(f"history needs numbers >= 0, got {limit=} {after_seq=} {before_seq=}")
    if after_seq and before_seq:
        raise ValueError("history reads after a seq or before one, not both")
    return limit > 0 and before_seq != 1


class Store(Protocol):
    async def open(self) -> None: ...
    async def close(self) -> None: ...

    def health(self) -> dict[str, Any]:
        """For `/healthz`: `{"state": "up"}`, or another state with an `error` in plain words."""
        ...

    # -- inbound inbox: dedupe by (connection, native id), at-least-once processing ------------
    def accept_inbound(
        self, message: NormalizedMessage, *, record_history: bool = False
    ) -> Awaitable[bool]:
        """Record an arriving message; False when (connection_id, id) was seen before.

        With `record_history`, a new message is also appended to its thread's history (role
        "user", sender its display name) in the same atomic step.

        An accepted message stays pending until `complete_inbound`, so a crash in between is
        recovered by `pending_inbound` at the next start. Edits (`edit_of` set) are keyed by
        their own id, which connectors make unique per edit.
        """
        ...

    async def complete_inbound(self, connection_id: str, message_id: str) -> None:
        """May return before the write is durable (a crash then only replays the message);
        it is applied before any operation issued after it. Likewise `map_id`, `record_sent`."""
        ...

    async def pending_inbound(self) -> Sequence[NormalizedMessage]:
        """Accepted but not completed messages, in arrival order."""
        ...

    async def seen_inbound(self, capacity: int) -> SeenFilter | None:
        """A filter that holds every (connection_id, id) accepted before this call (at least;
        sized for `capacity` keys or more), so a message it calls new can be handled before its
        acceptance is written. None when this store cannot promise that (several writers).

        A store that returns one must also queue `accept_inbound`'s write when it is called (or
        before the awaitable it returns first suspends), and apply writes in the order they were
        queued: the write then comes before every write the message's handling makes (its
        `complete_inbound` included)."""
        ...

    # -- thread history ------------------------------------------------------------------------
    async def append_history(
        self,
        thread_key: str,
        role: Role,
        message_id: str,
        sender: str,
        text: str,
        data: dict[str, Any] | None = None,
    ) -> HistoryEntry: ...

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
        """Append an entry (message id `native_id`) and record `native_id`'s seq, in one step,
        unless `native_id` was recorded before: a resend can never record a second entry, even
        when it races its original on another node. The record is apart from the id map, where
        the bridge maps the same native id to its reply (`history_seq` reads it)."""
        ...

    async def history_seq(self, connection_id: str, native_id: str) -> int | None:
        """The seq `append_history_once` gave `native_id`; None when it never did."""
        ...

    def queue_history(
        self,
        thread_key: str,
        role: Role,
        message_id: str,
        sender: str,
        text: str,
        data: dict[str, Any] | None = None,
    ) -> None:
        """`append_history` without waiting for the entry: queued now, applied before any
        operation issued later (for callers that do not need the seq)."""
        ...

    async def history(
        self, thread_key: str, *, limit: int = 50, after_seq: int = 0, before_seq: int = 0
    ) -> Sequence[HistoryEntry]:
        """Entries with seq > after_seq, oldest first; with after_seq=0 the *latest* `limit`,
        or with `before_seq` the latest `limit` of those with a smaller seq (paging back)."""
        ...

    async def forget_history(self, thread_key: str, message_ids: Sequence[str]) -> int:
        """Erase the entries of `thread_key` recorded under one of `message_ids`, and those of
        their edits (`data["edit_of"]` one of them): a message its sender deleted on the
        platform, and our reply taken back with it, are forgotten. An erased entry keeps its
        place (seq, role, message id, time), so seqs stay gapless and paging stays true, but
        its sender and text are emptied and its `data` is `{"deleted": True}`
        (`HistoryEntry.deleted`); what shows a conversation (`ctx.history`) skips it. Returns
        how many entries it erased (none the second time)."""
        ...

    # -- native id <-> message id map (replies, edits, deletes survive restarts) ---------------
    async def map_id(self, connection_id: str, native_id: str, message_id: str) -> None: ...
    async def lookup_id(self, connection_id: str, native_id: str) -> str | None: ...
    async def lookup_native(self, connection_id: str, message_id: str) -> str | None: ...

    # -- outbound idempotency and failures -----------------------------------------------------
    async def sent_result(self, connection_id: str, idempotency_key: str) -> list[str] | None: ...
    async def record_sent(
        self, connection_id: str, idempotency_key: str, message_ids: Sequence[str]
    ) -> None: ...
    async def record_failed_send(self, failure: FailedSend) -> None: ...
    async def failed_sends(self, limit: int = 100) -> Sequence[FailedSend]: ...

    async def prune(self, *, now: datetime, keep: Retention, limit: int = 10_000) -> Pruned:
        """Forget the dedupe ids of completed inbound messages, the idempotency records and the
        failed sends older than `keep`, and the state entries whose `keep_for` ran out by `now`,
        at most `limit` of each per call; pending inbound messages are never forgotten. Ages
        (but not state deadlines) are measured from `prune` calls, not per entry: an entry
        goes at the first call at least `keep` after an earlier call that saw it, so it lives
        between `keep` and `keep` plus the interval between calls. Call it regularly."""
        ...

    # -- trust and pairing ---------------------------------------------------------------------
    async def is_trusted(self, connection_id: str, channel_user_id: str) -> bool: ...
    async def set_trusted(
        self, connection_id: str, channel_user_id: str, trusted: bool
    ) -> None: ...
    async def create_pairing(self, pairing: Pairing) -> Pairing:
        """Store a pending pairing; if this sender already has one that has not expired at
        `pairing.created_at`, return that instead (an expired one is replaced). Also forgets
        (some of) the pending pairings expired longer than `EXPIRED_PAIRINGS_KEPT` ago, so
        senders who never come back do not grow the store."""
        ...

    async def pairings(
        self, *, include_approved: bool = False, now: datetime | None = None
    ) -> Sequence[Pairing]:
        """The pending pairings that have not expired at `now` (default: the clock), oldest
        first; with `include_approved`, every pairing kept, approved and expired ones too."""
        ...

    async def approve_pairing(self, code: str, *, now: datetime | None = None) -> Pairing | None:
        """Mark the code approved and trust its sender; None for an unknown code. A pending
        code expired at `now` (default: the clock) raises `PairingExpiredError`, trusting
        nobody."""
        ...

    async def revoke_pairing(self, code: str) -> Pairing | None:
        """Forget the pairing (pending or approved) and, if it was approved, the trust its
        approval gave (a pending code gave none: its sender may be trusted otherwise); the
        pairing as it was, or None for an unknown code."""
        ...

    # -- small durable state for connectors (update offsets, IMAP UIDs, kept records) -----------
    wall_clock: Callable[[], float]
    """Epoch seconds (`time.time`) that `keep_for` deadlines are set and read by: a deadline
    outlives the process, so not the monotonic clock. Tests move it instead of sleeping."""

    async def get_state(self, key: str) -> str | None:
        """The value kept under `key`; None when there is none or its `keep_for` ran out."""
        ...

    async def set_state(self, key: str, value: str, *, keep_for: timedelta | None = None) -> None:
        """Keep `value` under `key`, replacing the value and deadline an earlier call set: for
        good, or until `keep_for` after this call (`wall_clock`), for records that matter only
        for a while, so that one per message does not grow the store for ever. Past its
        deadline an entry reads as None at once; `prune` (or Redis itself) frees its space."""
        ...

    async def delete_state(self, key: str) -> None:
        """Forget the value kept under `key` (a no-op when there is none): a record that is
        done with goes at once rather than at its deadline."""
        ...

    # -- durable hook queue (talkbridge.hooks.durable) -----------------------------------------
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
        """Queue one delivery of the event per handler, due now, in one atomic step.

        Keeps at most `capacity` undelivered deliveries (pending or dead) per (app, handler),
        dropping the oldest; returns how many were dropped.
        """
        ...

    async def claim_hook_deliveries(
        self,
        app_id: str,
        handlers: Sequence[str],
        *,
        now: datetime,
        lease_until: datetime,
        limit: int,
    ) -> Sequence[HookDelivery]:
        """The oldest live (not dead) delivery of each (handler, conversation) when it is due
        (at or before `now`), oldest first, at most `limit`. Each one returned is hidden from
        other claims until `lease_until`: a worker that dies before `ack`/`fail` leaves it to
        be claimed again then. Later deliveries of a conversation wait behind its head."""
        ...

    async def ack_hook_delivery(self, delivery_id: int) -> None:
        """Delivered: forget it (a no-op when it is already gone)."""
        ...

    async def fail_hook_delivery(
        self, delivery_id: int, error: str, *, retry_at: datetime | None
    ) -> None:
        """Count a failed attempt: due again at `retry_at`, or a dead letter when None (which
        no longer holds back the later deliveries of its conversation)."""
        ...

    async def release_hook_delivery(self, delivery_id: int, *, now: datetime) -> None:
        """Give a lease back without counting an attempt (a worker stopping mid-delivery)."""
        ...

    async def hook_backlog(
        self, *, app_id: str | None = None, dead: bool | None = None, limit: int = 1000
    ) -> Sequence[HookDelivery]:
        """Undelivered deliveries (of one app, or all), oldest first; `dead` filters."""
        ...

    async def replay_hook_deliveries(
        self, delivery_ids: Sequence[int] | None, *, now: datetime, app_id: str | None = None
    ) -> int:
        """Make dead letters (the given ids, or all of `app_id`/every app when None) due at
        `now` with their attempts reset; returns how many were dead letters."""
        ...

    async def purge_hook_events(self, *, older_than: datetime) -> int:
        """Drop undelivered deliveries created before `older_than` (retention)."""
        ...

    async def clear_hook_events(self, app_id: str) -> int:
        """Drop every undelivered delivery of an app (the app was disabled or removed)."""
        ...
