"""Resuming a send that goes out in several platform calls and failed part of the way.

A long message is split into chunks (and attachments follow), so one `send` is several calls. If
call three of five fails, the router retries the send with the same idempotency key; the steps
already done must not be repeated, or the user sees the first chunks twice.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

K = TypeVar("K")
V = TypeVar("V")


def keep_latest(cache: OrderedDict[K, V], key: K, value: V, limit: int) -> None:
    """Put `key` last in `cache` and forget the least recently put keys beyond `limit`: state
    kept for a retry that may never come costs nothing for long."""
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > limit:
        cache.popitem(last=False)


class PartialSends:
    """The steps done and ids sent so far per idempotency key, for the sends that failed mid-way.

    Bounded: the least recently touched keys are forgotten first, so a retry that never comes
    costs nothing for long.
    """

    def __init__(self, limit: int = 1024) -> None:
        self.limit = limit
        self._done: OrderedDict[str, tuple[int, list[str]]] = OrderedDict()

    async def run(
        self, key: str | None, count: int, step: Callable[[int], Awaitable[Sequence[str]]]
    ) -> list[str]:
        """Await `step(0)` … `step(count - 1)` and return the ids they sent, in order.

        With a `key`, steps that an earlier failed run with the same key completed are skipped
        and their ids reused; without one, every step runs.
        """
        done, earlier = self._done.get(key, (0, [])) if key else (0, [])
        sent = list(earlier)
        for index in range(done, count):
            sent.extend(await step(index))
            if key:  # a retry after a failure mid-way resumes after this step
                keep_latest(self._done, key, (index + 1, list(sent)), self.limit)
        if key:
            self._done.pop(key, None)
        return sent
