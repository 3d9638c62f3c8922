"""Strict order within a key, concurrency across keys, bounded both ways.

Inbound messages are keyed by thread; outbound sends by destination thread. One worker task runs
per active key and drains that key's queue; at most `max_active` keys run at once and at most
`max_pending` items wait in all, so a flood applies back-pressure to whoever submits.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

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
        self._queues: dict[K, deque[T]] = {}
        self._waiting: deque[K] = deque()
        self._active = 0
        self._max_pending = max_pending
        self._queued = 0
        self._space_waiters: deque[asyncio.Future[None]] = deque()
        self._tasks: set[asyncio.Task[None]] = set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._name = name

    @property
    def pending(self) -> int:
        return sum(len(q) for q in self._queues.values())

    async def submit(self, key: K, item: T) -> None:
        """Queue `item` behind everything already queued for `key`; waits only when full."""
        while self._queued >= self._max_pending:
            waiter = asyncio.get_running_loop().create_future()
            self._space_waiters.append(waiter)
            await waiter
        self._queued += 1
        queue = self._queues.get(key)
        if queue is not None:
            queue.append(item)
            return
        self._queues[key] = deque((item,))
        self._idle.clear()
        if self._active < self._max_active:
            self._start(key)
        else:
            self._waiting.append(key)

    def _start(self, key: K) -> None:
        self._active += 1
        task = asyncio.create_task(self._drain(key), name=f"{self._name}:{key!r}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _drain(self, key: K) -> None:
        queue = self._queues[key]
        try:
            while queue:
                item = queue[0]
                try:
                    await self._handler(key, item)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("%s: handler failed for %r", self._name, key)
                finally:
                    queue.popleft()
                    self._release(1)
        finally:
            if not queue:
                del self._queues[key]
            else:  # cancelled with work left: drop our claim so join() can still finish
                self._release(len(queue))
                del self._queues[key]
            self._active -= 1
            self._start_waiting()

    def _start_waiting(self) -> None:
        while self._waiting and self._active < self._max_active:
            waiting_key = self._waiting.popleft()
            if waiting_key in self._queues:
                self._start(waiting_key)
        if not self._queues:
            self._idle.set()

    def try_claim(self, key: K) -> bool:
        """Claim an idle `key` so the caller handles one item in its own task (no worker task,
        no hand-off); items submitted meanwhile wait behind it. Pair with `release_claim`."""
        if key in self._queues or self._active >= self._max_active:
            return False
        self._queues[key] = deque()
        self._active += 1
        self._idle.clear()
        return True

    def release_claim(self, key: K) -> None:
        queue = self._queues[key]
        self._active -= 1
        if queue:  # items arrived while the caller worked: a worker takes them over
            self._start(key)
        else:
            del self._queues[key]
            self._start_waiting()

    def _release(self, count: int) -> None:
        self._queued -= count
        while self._space_waiters and self._queued < self._max_pending:
            waiter = self._space_waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                break

    async def join(self) -> None:
        """Wait until every queued item has been handled."""
        await self._idle.wait()

    async def cancel(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
