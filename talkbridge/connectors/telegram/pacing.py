"""Proactive send pacing, so the bot stays under Telegram's limits instead of collecting 429s.

Telegram allows about 30 messages a second per bot and 20 a minute into one group. `reserve()` is
pure bookkeeping (testable with a fake clock); `acquire()` waits out the reservation.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable


class TokenBucket:
    """`capacity` sends at once, refilled at `rate` per second."""

    def __init__(
        self, rate: float, capacity: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate = rate
        self.capacity = capacity
        self._clock = clock
        self._tokens = capacity
        self._stamp = clock()

    def reserve(self) -> float:
        """Take one token (possibly on credit) and return how long to wait before using it."""
        now = self._clock()
        self._tokens = min(self.capacity, self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now
        self._tokens -= 1
        return 0.0 if self._tokens >= 0 else -self._tokens / self.rate

    async def acquire(self) -> None:
        delay = self.reserve()
        if delay > 0:
            await asyncio.sleep(delay)


class Pacer:
    """One bucket for the whole bot, one per group chat (kept for the most recent chats)."""

    def __init__(
        self,
        per_second: float,
        group_per_minute: float,
        clock: Callable[[], float] = time.monotonic,
        max_chats: int = 4096,
    ) -> None:
        self._clock = clock
        self._global = TokenBucket(per_second, max(1.0, per_second), clock)
        self._group_rate = group_per_minute / 60.0
        self._group_capacity = max(1.0, group_per_minute)
        self._groups: OrderedDict[int | str, TokenBucket] = OrderedDict()
        self._max_chats = max_chats

    def reserve(self, chat_id: int | str) -> float:
        delay = self._global.reserve()
        if _is_group(chat_id):
            bucket = self._groups.get(chat_id)
            if bucket is None:
                bucket = TokenBucket(self._group_rate, self._group_capacity, self._clock)
                self._groups[chat_id] = bucket
                while len(self._groups) > self._max_chats:
                    self._groups.popitem(last=False)
            self._groups.move_to_end(chat_id)
            delay = max(delay, bucket.reserve())
        return delay

    async def acquire(self, chat_id: int | str) -> None:
        delay = self.reserve(chat_id)
        if delay > 0:
            await asyncio.sleep(delay)


def _is_group(chat_id: int | str) -> bool:
    # Group and supergroup ids are negative; private chats are positive user ids. Channels
    # (also negative) share the group budget, which is the safe side.
    return isinstance(chat_id, str) or chat_id < 0
