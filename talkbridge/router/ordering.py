"""Strict order within a key, concurrency across keys, bounded both ways.

Inbound messages are keyed by thread; outbound sends by destination thread. A pool of long-lived
worker tasks (at most `max_active`) takes keys that have work from a ready queue and drains each
key's items in order, so one key is never handled by two workers at once and no task is created
per message. A worker goes from one ready key to the next without returning to the event loop,
and only one more is woken at a time, to take over should a handler suspend: a burst of
messages that need no waiting costs one wake-up, not one per thread. At most `max_pending`
items wait in all, so a flood applies back-pressure to whoever submits.

An item may come with a gate, a future that must be done before the item is handled (an inbound
message's place in its thread is taken before the store has accepted it). A key whose first item
is still gated holds no worker: it is parked, and becomes ready when the gate opens. So a worker
never waits on one thread's store round trip while other threads have work, and takes a message
up once, when it can be handled (not once to find it waiting and again when the store answers).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Hashable
from functools import partial
from typing import Any, Generic, TypeVar

from talkbridge.cancellation import cancel_and_wait

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")

log = logging.getLogger("talkbridge.router")


class KeyedSerialExecutor(Generic[K, T]):
    def __init__(
        self,
        handler: Callable[[K, T], Awaitable[None]],
        *,
        max_active: int = 256,
        max_pending: int = 10_000,
        name: str = "executor",
    ) -> None:
        self._handler = handler
        self._max_active = max_active
        self._queues: dict[K, deque[tuple[T, asyncio.Future[Any] | None]]] = {}
        """Keys with work, queued, parked or in hand (a worker's or a claimer's): (item, gate)."""
        self._ready: deque[K] = deque()
        """Keys with work that no worker has taken yet."""
        self._busy = 0
        """Workers draining a key, plus callers holding a claim."""
        self._none_busy = asyncio.Event()
        self._none_busy.set()
        self._starting = True
        """False once `stop_starting`: what is in hand finishes, nothing new begins."""
        self._workers: set[asyncio.Task[None]] = set()
        self._sleepers: deque[asyncio.Future[None]] = deque()
        self._waking = 0
        """Workers woken (or started) that have not run yet: each takes every ready key it can."""
        self._max_pending = max_pending
        self._queued = 0
        self._space_waiters: deque[asyncio.Future[None]] = deque()
        self._idle = asyncio.Event()
        self._idle.set()
        self._name = name
        self._closed = False
        self._parked: dict[K, tuple[asyncio.Future[Any], Callable[..., None]]] = {}
        """Keys waiting for the gate of their first item, with that gate."""

    @property
    def has_room(self) -> bool:
        """`submit` would queue at once, not wait for space."""
        return self._queued < self._max_pending and not self._space_waiters

    @property
    def pending(self) -> int:
        return sum(len(q) for q in self._queues.values())

    async def submit(self, key: K, item: T, gate: asyncio.Future[Any] | None = None) -> None:
        """Queue `item` behind everything already queued for `key`; waits only when full.
        With a `gate`, the item is handled only once the gate is done (whatever its outcome)."""
        if not self.has_room:
            # In line behind earlier waiters: a slot freed is handed to the first of them, so
            # a submit that comes later never takes it (and one key's items keep their order).
            waiter = asyncio.get_running_loop().create_future()
            self._space_waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._release(1)  # handed a slot, then cancelled: pass it on
                else:
                    self._space_waiters.remove(waiter)  # out of line: later ones move up
                raise
            self._place(key, item, gate)
            return
        self.put(key, item, gate)

    def put(self, key: K, item: T, gate: asyncio.Future[Any] | None = None) -> None:
        """`submit` for a caller that saw `has_room`: queued at once, no coroutine."""
        if not self.has_room:
            raise RuntimeError(f"{self._name}: no room; submit() waits for it")
        self._queued += 1
        self._place(key, item, gate)

    def _place(self, key: K, item: T, gate: asyncio.Future[Any] | None) -> None:
        queue = self._queues.get(key)
        if queue is not None:
            queue.append((item, gate))
            return
        self._queues[key] = deque(((item, gate),))
        self._idle.clear()
        self._make_ready_or_park(key, gate)

    def _make_ready_or_park(self, key: K, gate: asyncio.Future[Any] | None) -> None:
        """`key` has no worker: queue it for one, or park it until its first item's gate opens."""
        if gate is None or gate.done():
            self._make_ready(key)
        else:
            self._park(key, gate)

    def _park(self, key: K, gate: asyncio.Future[Any]) -> None:
        callback = partial(self.opened, key)
        self._parked[key] = (gate, callback)
        gate.add_done_callback(callback)

    def opened(self, key: K, gate: asyncio.Future[Any]) -> None:
        """A key parked on `gate` can go on. The gate's own callback calls this a loop turn after
        it is resolved; the submitter may call it sooner, even just before resolving it in the
        same step (no worker runs in between, and one that found it unresolved would park the
        key again)."""
        parked = self._parked.get(key)
        if parked is not None and parked[0] is gate:
            del self._parked[key]
            gate.remove_done_callback(parked[1])  # not scheduled yet: then it never runs
            if not self._closed:
                self._make_ready(key)

    def _make_ready(self, key: K) -> None:
        self._ready.append(key)
        self._kick()

    def _kick(self) -> None:
        """Get a worker onto the ready keys: wake a sleeping one, or start one. One on its way
        is enough: it takes the ready keys one after another, and wakes the next worker as it
        starts on one, so a handler that suspends never holds up the keys behind it."""
        if (
            not self._ready
            or self._busy >= self._max_active
            or self._waking
            or not self._starting
            or self._closed  # cancelled: what is left is not handled (a claim let go of late)
        ):
            return
        while self._sleepers:
            sleeper = self._sleepers.popleft()
            if not sleeper.done():
                sleeper.set_result(None)
                self._waking += 1
                return
        if len(self._workers) < self._max_active:
            task = asyncio.create_task(self._work(), name=f"{self._name}-worker")
            self._workers.add(task)
            task.add_done_callback(self._workers.discard)
            self._waking += 1

    async def _work(self) -> None:
        loop = asyncio.get_running_loop()
        self._waking -= 1
        while True:
            if not self._ready or self._busy >= self._max_active or not self._starting:
                sleeper = loop.create_future()
                self._sleepers.append(sleeper)
                try:
                    await sleeper
                finally:
                    if sleeper.done() and not sleeper.cancelled():
                        self._waking -= 1  # woken (even if cancelled before it ran)
                continue
            key = self._ready.popleft()
            self._took()
            self._kick()  # someone for the keys still ready, should this handler suspend
            parked = False
            try:
                parked = await self._drain(key)
            finally:
                self._gave_back()
                if not parked:
                    self._done_with(key)

    async def _drain(self, key: K) -> bool:
        """Handle `key`'s items in order; True when it stopped at a gated item (parked)."""
        queue = self._queues[key]
        while queue and self._starting:
            item, gate = queue[0]
            if gate is not None and not gate.done():
                self._park(key, gate)
                return True
            try:
                await self._handler(key, item)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("%s: handler failed for %r", self._name, key)
            finally:
                queue.popleft()
                self._release(1)
        return False

    def _done_with(self, key: K) -> None:
        queue = self._queues.get(key)
        if queue:  # cancelled with work left (shutdown): drop it, it is still in the store
            self._release(len(queue))
        self._queues.pop(key, None)
        if not self._queues:
            self._idle.set()

    def try_claim(self, key: K) -> bool:
        """Claim an idle `key` so the caller handles one item in its own task (no hand-off to a
        worker); items submitted meanwhile wait behind it. Pair with `release_claim`."""
        if key in self._queues or self._busy >= self._max_active:
            return False
        self._queues[key] = deque()
        self._took()
        self._idle.clear()
        return True

    def release_claim(self, key: K) -> None:
        self._gave_back()
        queue = self._queues[key]
        if queue:  # items arrived while the caller worked: a worker takes them over
            self._make_ready_or_park(key, queue[0][1])
        else:
            del self._queues[key]
            if not self._queues:
                self._idle.set()
            self._kick()  # the slot we held may be what a ready key was waiting for

    def _release(self, count: int) -> None:
        self._queued -= count
        while self._space_waiters and self._queued < self._max_pending:
            waiter = self._space_waiters.popleft()
            if not waiter.done():  # (a cancelled waiter is skipped)
                self._queued += 1  # the slot is the waiter's now
                waiter.set_result(None)

    def _took(self) -> None:
        self._busy += 1
        self._none_busy.clear()

    def _gave_back(self) -> None:
        self._busy -= 1
        if not self._busy:
            self._none_busy.set()

    async def join(self) -> None:
        """Wait until every queued item has been handled."""
        await self._idle.wait()

    def stop_starting(self) -> int:
        """Shutdown: handle no item that has not begun; returns how many are left waiting
        (they are in the store, and an inbound message's turn runs at the next start)."""
        self._starting = False
        return self.pending - self._busy

    async def finish_running(self) -> None:
        """After `stop_starting`: wait for the items in hand (and claims held) to be done."""
        await self._none_busy.wait()

    @property
    def running(self) -> int:
        return self._busy

    async def cancel(self, grace: float = 5.0) -> int:
        """Cancel the workers and wait up to `grace` seconds for them to end, cancelling again
        meanwhile (a cancel can be lost in a client library). Returns how many still run then:
        a handler that swallows every cancellation (a user's agent catching `BaseException`)
        is left behind rather than hanging the stop for ever."""
        self._closed = True  # parked keys stay parked: what they hold is still in the store
        self._waking = 0  # a worker cancelled before it ran never counts itself off
        return await cancel_and_wait(*self._workers, within=grace)
