"""Durable hooks: effects that must happen even across crashes (billing, CRM sync, audit).

    durable = DurableHooks(store, app_id="shop")

    async def bill(event: DurableEvent) -> None:   # returning normally is the ACK
        await billing.charge(event.event_id, ...)    # at least once: dedupe on event_id

    durable.register("billing", bill)                # at startup; names are unique
    await durable.start()                            # the Bridge does this
    await durable.emit(TurnCompleted(app_id="shop", turn=..., status="completed"))

Each emitted event becomes one delivery per registered handler, queued in the store (SQLite or
Redis), so it survives a restart. The worker claims the oldest undelivered event of each
(handler, conversation) with a lease: events of one conversation go one at a time in order, other
conversations go concurrently. An attempt has `attempt_timeout` (30 s); a failure is retried up to
`retries` (5) times with backoff, then the delivery becomes a dead letter, which no longer holds
back its conversation (`talkbridge hooks dead-letters replay` puts it back). A worker that dies
mid-attempt leaves the lease to expire, and the event is delivered again. Undelivered events are
kept `retention` (7 days), at most `capacity` (1,000) per handler of an app, oldest dropped first.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import random
import uuid
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from talkbridge.cancellation import cancelling
from talkbridge.errors import TalkbridgeError
from talkbridge.hooks.calls import describe_hook_error
from talkbridge.hooks.steps import run_hook, say_held
from talkbridge.message import utcnow
from talkbridge.outage import Outage
from talkbridge.store.base import HookDelivery, Store

log = logging.getLogger("talkbridge.hooks.durable")

TURN_COMPLETED: Final = "conversation.turn.completed"
JOB_COMPLETED: Final = "background.job.completed"

ATTEMPT_TIMEOUT: Final = 30.0
RETRIES: Final = 5
RETENTION: Final = timedelta(days=7)
CAPACITY: Final = 1000


def new_event_id() -> str:
    return uuid.uuid4().hex


_TURN_EVENTS: Final = uuid.UUID("5d0c8f4e-8a0b-4a53-9a8e-2f7c2b1d6e41")


def turn_event_id(app_id: str, connection_id: str, message_id: str) -> str:
    """The `event_id` of the turn answering one inbound message: the same each time that turn
    runs. A bridge that dies after queueing the event, before the message is marked done,
    runs the turn again at the next start (its reply is not sent twice), and a handler that
    dedupes on `event_id`, as it is told to, must see the same id again."""
    return uuid.uuid5(_TURN_EVENTS, f"{app_id}\x1f{connection_id}\x1f{message_id}").hex


class TurnRef(BaseModel):
    """Which turn completed: `session_id` is the conversation (the thread key)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    session_id: str
    turn_id: str
    agent_name: str
    connection_id: str
    thread_id: str


class TurnCompleted(BaseModel):
    """After the whole tool loop and the final reply of a turn."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    type: Literal["conversation.turn.completed"] = TURN_COMPLETED
    event_id: str = Field(default_factory=new_event_id)
    app_id: str
    occurred_at: datetime = Field(default_factory=utcnow)
    turn: TurnRef
    status: str
    """The turn's status: completed or stopped (a middleware answered without the agent)."""

    @property
    def conversation(self) -> str:
        return self.turn.session_id


class JobCompleted(BaseModel):
    """A background job reached a terminal outcome (not necessarily success)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    type: Literal["background.job.completed"] = JOB_COMPLETED
    event_id: str = Field(default_factory=new_event_id)
    app_id: str
    occurred_at: datetime = Field(default_factory=utcnow)
    job_id: str
    status: str
    conversation_id: str | None = None
    """Orders this event with that conversation's turns; None: the job is its own sequence."""
    detail: dict[str, Any] = Field(default_factory=dict)

    @property
    def conversation(self) -> str:
        return self.conversation_id if self.conversation_id is not None else f"job:{self.job_id}"


DurableEvent = Annotated[TurnCompleted | JobCompleted, Field(discriminator="type")]
_EVENTS: TypeAdapter[TurnCompleted | JobCompleted] = TypeAdapter(DurableEvent)
Handler = Callable[[TurnCompleted | JobCompleted], Awaitable[object]]


_REMEMBERED: Final = "durable:turn-completed:"
"""State key prefix (then app id and conversation) of a turn's event kept before its reply
went out (`DurableHooks.remember_turn_completed`)."""


def _remembered_key(app_id: str, conversation: str) -> str:
    return _REMEMBERED + f"{app_id}\x1f{conversation}"


def parse_event(body: str | bytes) -> TurnCompleted | JobCompleted:
    return _EVENTS.validate_json(body)


def default_backoff(retry: int) -> float:
    """Seconds before retry `retry` (1-based): 1, 2, 4, 8, 16 with jitter, capped at 5 min."""
    ceiling = min(300.0, 2.0 ** (retry - 1))
    return random.uniform(ceiling / 2, ceiling)


class Disposable:
    """What `register` returns: `dispose()` (or leaving a `with` block) removes the handler."""

    __slots__ = ("_dispose", "disposed")

    def __init__(self, dispose: Callable[[], None]) -> None:
        self._dispose = dispose
        self.disposed = False

    def dispose(self) -> None:
        if not self.disposed:
            self.disposed = True
            self._dispose()

    def __enter__(self) -> Disposable:
        return self

    def __exit__(self, *exc: object) -> None:
        self.dispose()


class DurableHooks:
    """The durable handlers of one app, and the worker that delivers their queued events."""

    def __init__(
        self,
        store: Store,
        app_id: str,
        *,
        attempt_timeout: float = ATTEMPT_TIMEOUT,
        retries: int = RETRIES,
        backoff: Callable[[int], float] = default_backoff,
        retention: timedelta = RETENTION,
        capacity: int = CAPACITY,
        poll_interval: float = 1.0,
        lease_grace: float = 5.0,
        max_concurrency: int = 16,
        clock: Callable[[], datetime] = utcnow,
        redact: Callable[[str], str] = str,
    ) -> None:
        if retries < 0 or capacity < 1 or attempt_timeout <= 0 or max_concurrency < 1:
            raise ValueError(
                "durable hooks need retries >= 0, capacity >= 1, attempt_timeout > 0 and"
                f" max_concurrency >= 1; got {retries=} {capacity=} {attempt_timeout=}"
                f" {max_concurrency=}"
            )
        self.store = store
        self.app_id = app_id
        self.attempt_timeout = attempt_timeout
        self.retries = retries
        self.backoff = backoff
        self.retention = retention
        self.capacity = capacity
        self.poll_interval = poll_interval
        self.lease_grace = lease_grace
        self.max_concurrency = max_concurrency
        self.clock = clock
        self.redact = redact
        """Applied to a failure before the store keeps it: `hooks dead-letters list` prints it,
        and loads no connection's secrets to scrub it with."""
        self._handlers: dict[str, Handler] = {}
        self._enabled = True
        self._task: asyncio.Task[None] | None = None
        self._inflight: dict[int, asyncio.Task[None]] = {}
        """The latest attempt task of each delivery in flight."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._wake = asyncio.Event()
        self._timers: set[asyncio.TimerHandle] = set()
        self._reading = Outage("durable hooks: reading the queue", log)
        """The queue is read every `poll_interval`: a store that is down is said once."""

    # -- registration ---------------------------------------------------------------------------

    def register(self, name: str, handler: Handler) -> Disposable:
        """Add a handler (before `start`); its normal return acknowledges the event."""
        if self._task is not None:
            raise RuntimeError(
                f"cannot register durable hook {name!r}: durable hooks register at startup,"
                " before the bridge starts"
            )
        if not name:
            raise ValueError("a durable hook needs a non-empty name")
        if name in self._handlers:
            raise ValueError(f"a durable hook named {name!r} is already registered")
        call = getattr(handler, "__call__", None)  # noqa: B004 - an instance with async __call__
        if not (inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(call)):
            raise TypeError(f"durable hook {name!r} must be an async function (event) -> None")
        self._handlers[name] = handler

        def remove() -> None:
            if self._handlers.get(name) is handler:
                del self._handlers[name]

        return Disposable(remove)

    @property
    def names(self) -> list[str]:
        return sorted(self._handlers)

    @property
    def enabled(self) -> bool:
        return self._enabled

    async def disable(self) -> int:
        """Stop taking and delivering events and clear the app's queue; returns how many went."""
        self._enabled = False
        return await self.store.clear_hook_events(self.app_id)

    def enable(self) -> None:
        """Take events again; what was emitted while disabled is gone (no backfill)."""
        self._enabled = True
        self._wake.set()

    # -- emitting -------------------------------------------------------------------------------

    async def emit(self, event: TurnCompleted | JobCompleted) -> bool:
        """Queue `event` for every handler; False when nobody listens (nothing is stored)."""
        if not self._handlers or not self._enabled:
            return False
        if event.app_id != self.app_id:
            raise ValueError(
                f"event {event.event_id} is for app {event.app_id!r}, not {self.app_id!r}"
            )
        dropped = await self.store.enqueue_hook_event(
            self.app_id,
            list(self._handlers),
            event.conversation,
            event.event_id,
            event.model_dump_json(),
            self.clock(),
            capacity=self.capacity,
        )
        if dropped:
            log.warning(
                "durable hooks of app %s: the queue is full (%d per handler); dropped the %d"
                " oldest undelivered event(s)",
                self.app_id,
                self.capacity,
                dropped,
            )
        self._wake.set()
        return True

    @property
    def wants_turn_completed(self) -> bool:
        """Whether `emit_turn_completed` would do anything (checked before making the call)."""
        return bool(self._handlers) and self._enabled

    async def emit_turn_completed(
        self, session: Any, status: str, *, message_id: str | None = None
    ) -> None:
        """For the Bridge after a reply was sent: never raises into the message path.
        `message_id`: the inbound message the turn answered, which fixes its `event_id`."""
        if not self.wants_turn_completed:
            return
        try:
            await self.emit(self._turn_completed(session, status, message_id))
        except (TalkbridgeError, ValueError) as exc:
            log.error("could not queue %s for turn %s: %s", TURN_COMPLETED, session.turn_id, exc)

    async def remember_turn_completed(self, session: Any, status: str, *, message_id: str) -> None:
        """For the Bridge before a turn's reply is sent: keep the event that turn will queue
        (the latest one per conversation). A message answered before a crash is not run again
        at the next start (`emit_remembered_turn_completed`): had the bridge died after the
        reply, before queueing the event, only this keeps it from being lost. Kept as long as
        queued events are (`retention`), not for good: one entry per conversation ever."""
        if not self.wants_turn_completed:
            return
        try:
            event = self._turn_completed(session, status, message_id)
            key = _remembered_key(self.app_id, event.conversation)
            await self.store.set_state(key, event.model_dump_json(), keep_for=self.retention)
        except (TalkbridgeError, ValueError) as exc:
            log.error("could not keep %s of turn %s: %s", TURN_COMPLETED, session.turn_id, exc)

    async def emit_remembered_turn_completed(
        self, connection_id: str, conversation: str, message_id: str
    ) -> None:
        """For the Bridge when a message handled again was answered before (its reply is on
        record as sent), so its turn is not run again: queue that turn's event once more, as
        remembered (the same `event_id` and turn); nothing when the turn queued none (it
        ended in error, or no handler listened). Never raises into the message path."""
        if not self.wants_turn_completed:
            return
        event_id = turn_event_id(self.app_id, connection_id, message_id)
        try:
            raw = await self.store.get_state(_remembered_key(self.app_id, conversation))
            event = parse_event(raw) if raw else None
            if isinstance(event, TurnCompleted) and event.event_id == event_id:
                await self.emit(event)
        except (TalkbridgeError, ValueError) as exc:
            log.error("could not queue %s of message %s again: %s", TURN_COMPLETED, message_id, exc)

    def _turn_completed(self, session: Any, status: str, message_id: str | None) -> TurnCompleted:
        ref = TurnRef(
            session_id=session.session_id,
            turn_id=session.turn_id,
            agent_name=session.agent_name,
            connection_id=session.connection_id,
            thread_id=session.thread_id,
        )
        event_id = (
            new_event_id()
            if message_id is None
            else turn_event_id(self.app_id, session.connection_id, message_id)
        )
        return TurnCompleted(event_id=event_id, app_id=self.app_id, turn=ref, status=status)

    # -- dead letters ---------------------------------------------------------------------------

    async def dead_letters(self, limit: int = 1000) -> Sequence[HookDelivery]:
        return await self.store.hook_backlog(app_id=self.app_id, dead=True, limit=limit)

    async def replay(self, delivery_ids: Sequence[int] | None = None) -> int:
        """Put dead letters (these, or all of this app) back in the queue, attempts reset."""
        count = await self.store.replay_hook_deliveries(
            delivery_ids, now=self.clock(), app_id=self.app_id
        )
        self._wake.set()
        return count

    # -- the worker -----------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._task is not None

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"durable-hooks:{self.app_id}")

    async def stop(self) -> None:
        """Stop delivering; attempts in flight are cancelled and their leases given back."""
        task, self._task = self._task, None
        if task is None:
            return
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()
        task.cancel()
        attempts = list(self._tasks)
        for attempt in attempts:
            attempt.cancel()
        await asyncio.gather(task, *attempts, return_exceptions=True)
        self._inflight.clear()
        self._tasks.clear()

    async def _run(self) -> None:
        next_purge: datetime | None = None
        while True:
            self._wake.clear()
            now = self.clock()
            if next_purge is None or now >= next_purge:
                next_purge = now + timedelta(minutes=1)
                with contextlib.suppress(TalkbridgeError):
                    purged = await self.store.purge_hook_events(older_than=now - self.retention)
                    if purged:
                        log.warning("durable hooks: dropped %d event(s) past retention", purged)
            free = self.max_concurrency - len(self._inflight)
            if self._handlers and self._enabled and free > 0:
                await self._claim(now, free)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.poll_interval):
                    await self._wake.wait()

    async def _claim(self, now: datetime, free: int) -> None:
        lease = now + timedelta(seconds=self.attempt_timeout + self.lease_grace)
        try:
            claimed = await self.store.claim_hook_deliveries(
                self.app_id, list(self._handlers), now=now, lease_until=lease, limit=free
            )
        except TalkbridgeError as exc:
            self._reading.failed(exc)
            return
        self._reading.worked()
        for delivery in claimed:
            # Claimed again while its last attempt is still finishing (it failed and was due at
            # once): the new attempt waits for the old one to end.
            previous = self._inflight.get(delivery.id)
            task = asyncio.create_task(self._attempt(delivery, previous))
            self._inflight[delivery.id] = task
            self._tasks.add(task)
            task.add_done_callback(functools.partial(self._done, delivery.id))
        if len(claimed) >= free:
            self._wake.set()  # there may be more due

    def _done(self, delivery_id: int, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if self._inflight.get(delivery_id) is task:
            del self._inflight[delivery_id]
        self._wake.set()

    def _wake_in(self, delay: float) -> None:
        loop = asyncio.get_running_loop()
        timers = self._timers

        def fire() -> None:
            timers.discard(timer)
            self._wake.set()

        timer = loop.call_later(max(0.0, delay), fire)
        timers.add(timer)

    async def _attempt(
        self, delivery: HookDelivery, previous: asyncio.Task[None] | None = None
    ) -> None:
        store = self.store
        if previous is not None:
            try:
                await asyncio.wait([previous])
            except asyncio.CancelledError:
                with contextlib.suppress(Exception):
                    await store.release_hook_delivery(delivery.id, now=self.clock())
                raise
        handler = self._handlers.get(delivery.handler)
        if handler is None:  # disposed since the claim
            await store.release_hook_delivery(delivery.id, now=self.clock())
            return
        try:
            event = parse_event(delivery.body)
        except ValidationError as exc:  # cannot succeed on any retry
            await store.fail_hook_delivery(delivery.id, f"unreadable event: {exc}", retry_at=None)
            return
        deadline = asyncio.timeout(self.attempt_timeout)

        def held(seconds: float) -> None:
            what = f"durable hook {delivery.handler!r}"
            say_held(log, what, f"event {delivery.event_id}", handler, seconds)

        try:
            async with deadline:
                await run_hook(handler, (event,), None, held)
        except asyncio.CancelledError as exc:
            if cancelling():
                # Stopping mid-attempt: not the handler's failure; give the lease back.
                with contextlib.suppress(Exception):
                    await store.release_hook_delivery(delivery.id, now=self.clock())
                raise
            # The handler's own (a task it awaited was cancelled): a failed attempt, or it
            # would be handed back at once, again and again, and never become a dead letter.
            error = describe_hook_error(exc)
        except TimeoutError as exc:  # ours, or one the handler raised (its client's)
            if deadline.expired():
                error = f"timed out after {self.attempt_timeout:g} s"
            else:
                error = describe_hook_error(exc)
        except Exception as exc:
            error = describe_hook_error(exc)  # kept with the line that raised, for the list
        else:
            try:
                await store.ack_hook_delivery(delivery.id)
            except TalkbridgeError as exc:  # the lease expires and it is delivered again
                log.error("durable hooks: cannot acknowledge %s: %s", delivery.event_id, exc)
            return
        await self._failed(delivery, error)

    async def _failed(self, delivery: HookDelivery, error: str) -> None:
        attempts = delivery.attempts + 1
        error = self.redact(error)
        try:
            if attempts > self.retries:
                await self.store.fail_hook_delivery(delivery.id, error, retry_at=None)
                log.warning(
                    "durable hook %s: event %s is a dead letter after %d attempts: %s",
                    delivery.handler,
                    delivery.event_id,
                    attempts,
                    error,
                )
                return
            delay = self.backoff(attempts)
            retry_at = self.clock() + timedelta(seconds=delay)
            await self.store.fail_hook_delivery(delivery.id, error, retry_at=retry_at)
        except TalkbridgeError as exc:
            log.error("durable hooks: cannot record a failure of %s: %s", delivery.event_id, exc)
            return
        log.info(
            "durable hook %s: attempt %d for %s failed (%s); retrying in %.1f s",
            delivery.handler,
            attempts,
            delivery.event_id,
            error,
            delay,
        )
        self._wake_in(delay)
