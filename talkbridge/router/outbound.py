"""One send queue per destination connection.

Sends to one connection never wait for another: each connection has its own executor (ordered
per thread, a few threads at once) and its own rate-limit gate. A connector raising
`RateLimitedError` closes the gate of its connection (or delays just that thread) for
`retry_after` seconds; retryable errors are retried with backoff; a send that finally fails is
recorded in the store and raised to the caller as `SendFailedError`, never dropped silently.
Trouble that is the connection's, not one message's, is reported through `on_trouble`, so the
connection's health says so: credentials refused on a send (a token revoked while the
connection's socket stays open), and a send failing again and again (the platform or the mail
server down); a send that works clears it.

Deleting one of our messages (the reply to a message its sender deleted, one an edit
replaced) goes through the same queue and retries (`delete`): a platform answering 5xx or 429
to a delete no longer leaves the answer up for good, and one that finally fails is logged
naming the connection and the message.

In distributed mode several nodes may send with one idempotency key (a turn run again by a
shard's new holder while the old one still sends): `claims` makes each keyed platform call
under a claim in Redis, so only one of them goes out. A delete is made under one too, so two
nodes taking back the same reply delete it once. A send without a key has no claim: `fence`
checks, right before its platform call, that this node still runs the connection, and one
queued on a node that lost it raises `ConnectionMovedError`, nothing sent, for the
connection's new owner to send (which the new owner does, having taken over the request).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import NoReturn, Protocol, TypeVar

from talkbridge.backoff import Backoff
from talkbridge.errors import (
    ConnectionMovedError,
    ConnectorError,
    NotFoundError,
    RateLimitedError,
    SendFailedError,
    UnauthorizedError,
)
from talkbridge.message import OutboundMessage, SendResult, utcnow
from talkbridge.router.ordering import KeyedSerialExecutor
from talkbridge.store.base import FailedSend, Store
from talkbridge.talk import KEYLESS_SEND

log = logging.getLogger("talkbridge.router.outbound")

SendFn = Callable[[OutboundMessage], Awaitable[SendResult]]
Redact = Callable[[str], str]
TroubleListener = Callable[[str, str | None], None]
"""`(connection_id, what)`: sends are in trouble (`sends are …: reason`); None: they work."""

SendFence = Callable[[str], Awaitable[None]]
"""Distributed mode: raises `ConnectionMovedError` unless this node still runs the connection."""

MAX_RATE_LIMIT_WAITS = 20
_R = TypeVar("_R")


class SendClaims(Protocol):
    """Distributed mode: one platform call per idempotency key across nodes
    (`talkbridge.cluster.claims`)."""

    async def claimed_send(
        self, connection_id: str, key: str, call: Callable[[], Awaitable[SendResult]]
    ) -> tuple[SendResult, bool]:
        """The send, or its earlier result; and whether it is on record already."""
        ...


@dataclass(slots=True, eq=False)
class _Job:
    message: OutboundMessage
    check_sent: bool = True
    future: asyncio.Future[SendResult] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    under_way: bool = False
    """Cut off while being sent (at shutdown): it may have reached the platform."""


@dataclass(slots=True, eq=False)
class _Deletion:
    """One of our messages to delete; `call` deletes it, `why` says what it was (for the log)."""

    thread_id: str
    message_id: str
    call: Callable[[], Awaitable[None]]
    why: str
    future: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    under_way: bool = False


class _GiveUp(Exception):
    """`_retried` gave up: `reason` says why; `stopped` when the bridge stopped meanwhile."""

    def __init__(self, reason: str, *, stopped: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.stopped = stopped


STOPPED = "the bridge stopped before it was sent"


class _Gate:
    """Open unless the platform told this connection to wait."""

    def __init__(self) -> None:
        self._open = asyncio.Event()
        self._open.set()
        self._until = 0.0
        self._timer: asyncio.TimerHandle | None = None

    async def wait(self) -> None:
        if not self._open.is_set():
            await self._open.wait()

    def close_for(self, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        until = loop.time() + seconds
        if until <= self._until:
            return
        self._until = until
        self._open.clear()
        if self._timer is not None:
            self._timer.cancel()
        self._timer = loop.call_at(until, self._open.set)

    @property
    def closed(self) -> bool:
        return not self._open.is_set()


class OutboundQueue:
    def __init__(
        self,
        connection_id: str,
        send: SendFn,
        store: Store,
        *,
        attempts: int = 5,
        retry_for: float = 0.0,
        concurrency: int = 8,
        redact: Redact = str,
        backoff: Callable[[], Backoff] = lambda: Backoff(base=0.5, cap=30.0),
        on_trouble: TroubleListener | None = None,
        claims: SendClaims | None = None,
        fence: SendFence | None = None,
    ) -> None:
        self.connection_id = connection_id
        self.claims = claims
        self.fence = fence
        self._send = send
        self._store = store
        self._attempts = attempts
        self._retry_for = retry_for
        self._redact = redact
        self._new_backoff = backoff
        self._gate = _Gate()
        self._on_trouble = on_trouble
        self._troubled = False
        self._executor: KeyedSerialExecutor[str, _Job | _Deletion] = KeyedSerialExecutor(
            self._deliver, max_active=concurrency, name=f"send:{connection_id}"
        )
        self._keyless = itertools.count()
        self._jobs: set[_Job | _Deletion] = set()
        """Queued sends and deletions not done yet: `cancel` fails each on record (a deletion
        in the log), none is dropped."""
        self._closed = False
        self.under_way = 0
        """Sends accepted and not done yet (in flight, retried or queued)."""
        self.sent = 0
        self.failed = 0

    @property
    def rate_limited(self) -> bool:
        return self._gate.closed

    async def send(self, message: OutboundMessage, *, check_sent: bool = True) -> SendResult:
        """Queue a send; `check_sent=False` skips the idempotency lookup for a key the caller
        knows is new (it is still recorded, so a later retry of the same key finds it)."""
        thread_id = message.thread_id
        if self._closed:
            raise SendFailedError(self.connection_id, thread_id, f"{STOPPED}: it is not running")
        self.under_way += 1
        try:
            return await self._through_queue(message, check_sent)
        finally:
            self.under_way -= 1

    async def _through_queue(self, message: OutboundMessage, check_sent: bool) -> SendResult:
        thread_id = message.thread_id
        if self._executor.try_claim(thread_id):  # nothing ahead of us: send from this task
            try:
                result = await self._attempt(message, check_sent)
            except SendFailedError:
                self.failed += 1
                raise
            finally:
                self._executor.release_claim(thread_id)
            self.sent += 1
            return result
        job = _Job(message, check_sent)
        self._jobs.add(job)
        await self._executor.submit(thread_id, job)
        return await job.future

    async def delete(
        self, thread_id: str, message_id: str, call: Callable[[], Awaitable[None]], *, why: str
    ) -> asyncio.Future[None]:
        """Queue the deletion of our message `message_id` (`call` deletes it; `why` says what
        it is, for the log), behind the sends queued for its thread, and retried as they are
        (rate limits, passing failures, backoff). Returns once queued, so that a connector
        taking back a reply never holds up its inbound events for the retries: the future is
        done once the message is deleted (or was gone already), or fails with
        `SendFailedError` once given up, which the log says, naming the connection and the
        message, whether anyone awaits the future or not."""
        job = _Deletion(thread_id, message_id, call, why)
        job.future.add_done_callback(_retrieved)
        if self._closed:
            self._not_deleted(job, f"{_stopped_deleting(False)}: it is not running")
            return job.future
        self._jobs.add(job)
        await self._executor.submit(thread_id, job)
        return job.future

    async def join(self) -> None:
        await self._executor.join()

    async def cancel(self) -> None:
        """Shutdown: stop sending. Every queued send not done yet (cut off on its way, or not
        begun) fails to its caller and on the failed-send record, as a send that gives up
        does; none goes out later. One whose caller was cut off already (a turn the stop
        cancelled, which runs again at the next start, sending it again) is no failure."""
        self._closed = True
        await self._executor.cancel()
        jobs, self._jobs = self._jobs, set()
        for job in jobs:
            if isinstance(job, _Deletion):
                self._not_deleted(job, _stopped_deleting(job.under_way))
                continue
            if job.future.cancelled():  # its caller stopped waiting for it
                continue
            reason = "the bridge stopped while it was being sent" if job.under_way else STOPPED
            await self._give_up(job, reason)

    async def _give_up(self, job: _Job, reason: str) -> None:
        self.failed += 1
        thread_id = job.message.thread_id
        if not job.future.done():
            job.future.set_exception(SendFailedError(self.connection_id, thread_id, reason))
        await self._record_stopped(job.message, reason)

    async def _stopped(self, message: OutboundMessage) -> NoReturn:
        await self._record_stopped(message, STOPPED)
        raise SendFailedError(self.connection_id, message.thread_id, STOPPED)

    async def _record_stopped(self, message: OutboundMessage, reason: str) -> None:
        try:
            await self._record_failure(message, reason)
        except Exception as exc:  # the store may be closing too: the log is the record
            log.error("%s: could not record the failed send: %s", self.connection_id, exc)

    async def _deliver(self, thread_id: str, job: _Job | _Deletion) -> None:
        if isinstance(job, _Deletion):
            await self._delete(job)
            return
        job.under_way = True  # cancelled from here on (shutdown), `cancel` fails it on record
        try:
            result = await self._attempt(job.message, job.check_sent)
        except SendFailedError as exc:
            self._jobs.discard(job)
            self.failed += 1
            if not job.future.done():
                job.future.set_exception(exc)
            return
        except Exception as exc:  # the store's: its caller gets it, as one sent from its task
            self._jobs.discard(job)
            if not job.future.done():
                job.future.set_exception(exc)
            return
        self._jobs.discard(job)
        self.sent += 1
        if not job.future.done():
            job.future.set_result(result)

    async def _attempt(self, message: OutboundMessage, check_sent: bool) -> SendResult:
        if message.idempotency_key is not None:
            return await self._tries(message, check_sent)
        # Its tries are one send all the same: one split into parts resumes after the last
        # part that went out (`talkbridge.connectors.sending`).
        token = KEYLESS_SEND.set(f"{self.connection_id}:{next(self._keyless)}")
        try:
            return await self._tries(message, check_sent)
        finally:
            KEYLESS_SEND.reset(token)

    async def _tries(self, message: OutboundMessage, check_sent: bool) -> SendResult:
        key = message.idempotency_key
        if key is not None and check_sent and self.claims is None:  # (a claim looks itself)
            earlier = await self._store.sent_result(self.connection_id, key)
            if earlier:
                return SendResult(message_ids=tuple(earlier))
        try:
            result, recorded = await self._retried(functools.partial(self._call, message))
        except _GiveUp as exc:
            if exc.stopped:  # a send retried in its caller's task while the bridge stopped
                await self._stopped(message)
            await self._fail(message, exc.reason)
        if key is not None and not recorded:  # (retried, unlike a claim's own record)
            await self._store.record_sent(self.connection_id, key, result.message_ids)
        return result

    async def _delete(self, job: _Deletion) -> None:
        job.under_way = True  # cancelled from here on (shutdown), `cancel` logs it
        try:
            await self._retried(functools.partial(self._delete_once, job))
        except _GiveUp as exc:
            self._jobs.discard(job)
            self._not_deleted(job, _stopped_deleting(True) if exc.stopped else exc.reason)
            return
        self._jobs.discard(job)
        if not job.future.done():
            job.future.set_result(None)

    async def _delete_once(self, job: _Deletion) -> None:
        """In distributed mode, under a claim (`claims`, as a keyed send): nodes that both
        take back the same reply (the connection's owner hearing the deletion, the node
        recording the reply as it comes) delete it once."""
        if self.claims is None:
            await self._gone(job)
            return

        async def call() -> SendResult:
            await self._gone(job)
            return SendResult(message_ids=(job.message_id,))

        key = f"delete:{job.message_id}"
        await self.claims.claimed_send(self.connection_id, key, call)

    async def _gone(self, job: _Deletion) -> None:
        """Delete the message; one already gone (deleted by hand, or by another try whose
        answer was lost) is what was wanted."""
        try:
            await job.call()
        except NotFoundError as exc:
            log.info(
                "%s: message %s (%s) was gone already: %s",
                self.connection_id,
                job.message_id,
                job.why,
                self._redact(str(exc)),
            )

    def _not_deleted(self, job: _Deletion, reason: str) -> None:
        log.error(
            "%s: giving up deleting message %s in %s (%s): %s; it stays up",
            self.connection_id,
            job.message_id,
            job.thread_id,
            job.why,
            reason,
        )
        if not job.future.done():
            job.future.set_exception(
                SendFailedError(
                    self.connection_id,
                    job.thread_id,
                    f"message {job.message_id} was not deleted: {reason}",
                )
            )

    async def _retried(self, call: Callable[[], Awaitable[_R]]) -> _R:
        """`call` (a send, or a delete) through the connection's rate-limit gate, retried on
        rate limits and passing failures with backoff; `_GiveUp` once it should not be tried
        again (a failure that would fail again, retried enough, the bridge stopping)."""
        backoff: Backoff | None = None  # made on the first failure: most sends never need one
        failures = 0
        first_failure = 0.0
        waits = 0
        while True:
            if self._closed:
                raise _GiveUp(STOPPED, stopped=True)
            if self._gate.closed:
                await self._gate.wait()
            try:
                result = await call()
            except RateLimitedError as exc:
                waits += 1
                if waits > MAX_RATE_LIMIT_WAITS:
                    raise _GiveUp(f"still rate limited after {waits - 1} waits") from None
                if exc.scope == "connection":
                    self._gate.close_for(exc.retry_after)
                    log.warning(
                        "%s: rate limited, pausing sends for %.1fs",
                        self.connection_id,
                        exc.retry_after,
                    )
                else:
                    await asyncio.sleep(exc.retry_after)
                continue
            except ConnectorError as exc:
                reason = self._redact(str(exc) or type(exc).__name__)
                failures += 1
                if isinstance(exc, UnauthorizedError):
                    self._trouble(f"sends are refused: {reason}")
                elif exc.retryable and failures >= 2:  # not a blip: say so while retrying
                    self._trouble(f"sends are failing: {reason}")
                now = asyncio.get_running_loop().time()
                first_failure = first_failure or now
                retried_enough = (
                    failures >= self._attempts and now - first_failure >= self._retry_for
                )
                if not exc.retryable or retried_enough:
                    tries = f" after {failures} attempts" if failures > 1 else ""
                    raise _GiveUp(f"{reason}{tries}") from None
                log.info("%s: send failed (%s), retrying", self.connection_id, reason)
                backoff = backoff or self._new_backoff()
                await asyncio.sleep(backoff.next())
                continue
            except (asyncio.CancelledError, ConnectionMovedError):
                raise
            except Exception as exc:  # untranslated: a connector bug, never retried blindly
                reason = self._redact(f"{type(exc).__name__}: {exc}")
                raise _GiveUp(f"unexpected connector error: {reason}") from None
            if self._troubled:
                self._trouble(None)
            return result

    async def _call(self, message: OutboundMessage) -> tuple[SendResult, bool]:
        """The platform call, and whether its result is on record already: in distributed
        mode it is made under the claim of its idempotency key, which records it."""
        key = message.idempotency_key
        if key is not None and self.claims is not None:  # (its claim keeps it from a double)
            return await self.claims.claimed_send(
                self.connection_id, key, functools.partial(self._send, message)
            )
        if self.fence is not None:  # nothing awaited between it and the call
            await self.fence(self.connection_id)
        return await self._send(message), False

    def _trouble(self, what: str | None) -> None:
        self._troubled = what is not None
        if self._on_trouble is not None:
            self._on_trouble(self.connection_id, what)

    async def _fail(self, message: OutboundMessage, reason: str) -> NoReturn:
        await self._record_failure(message, reason)
        raise SendFailedError(self.connection_id, message.thread_id, reason)

    async def _record_failure(self, message: OutboundMessage, reason: str) -> None:
        log.error(
            "%s: giving up on a send to %s: %s", self.connection_id, message.thread_id, reason
        )
        await self._store.record_failed_send(
            FailedSend(
                connection_id=self.connection_id,
                thread_id=message.thread_id,
                text=message.text,
                reason=reason,
                failed_at=utcnow(),
            )
        )


def _retrieved(future: asyncio.Future[None]) -> None:
    """A deletion given up that nobody awaits is said in the log, not as "exception never
    retrieved"."""
    if not future.cancelled():
        future.exception()


def _stopped_deleting(under_way: bool) -> str:
    return f"the bridge stopped {'while it was being' if under_way else 'before it was'} deleted"
