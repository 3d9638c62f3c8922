"""Which inbound messages the store may already hold, as the router asks it on every arrival.

The store builds a `SeenFilter` of the keys it holds (in its writer, in steps); this keeps the
one in use complete: every key that arrives goes in, and the keys that arrive while a filter is
being built are added to it when it comes, since the store may have read past them. When the
filter fills, a larger one is asked for; until one is there, nothing is called new, and every
message waits for the store's own verdict.
"""

from __future__ import annotations

import asyncio
import logging

from talkbridge.store.base import Store
from talkbridge.store.seen import MIN_CAPACITY, SeenFilter

log = logging.getLogger("talkbridge.router")

Key = tuple[str, str]
"""(connection id, native message id)"""

RETRY_AFTER = 30.0
"""Seconds before asking again when the store could not build the first filter (its writer
was being replaced, say)."""


class SeenKeys:
    def __init__(self, store: Store, *, retry_after: float = RETRY_AFTER) -> None:
        self._store = store
        self._retry_after = retry_after
        self._retry_at: float | None = None
        self._filter: SeenFilter | None = None
        self._meanwhile: list[Key] | None = None
        """Keys that arrived while the store builds a filter: added to it when it comes."""
        self._loading: asyncio.Task[None] | None = None
        self._rebuild_at = 0
        """How many keys the filter may hold before the store is asked for a larger one."""

    def start(self) -> None:
        self._load(MIN_CAPACITY)

    def add(self, key: Key) -> bool:
        """Note an arriving key; True when the store certainly does not hold it."""
        seen = self._filter
        retry_at = self._retry_at
        if retry_at is not None and asyncio.get_running_loop().time() >= retry_at:
            self._retry_at = None  # (only set while there is no filter)
            self._load(MIN_CAPACITY)
        if self._meanwhile is not None:
            self._meanwhile.append(key)
        if seen is None:
            return False
        new = seen.add(*key)
        if seen.count >= self._rebuild_at:  # "maybe" grows common: a larger one
            self._load(2 * seen.count)
        return new

    async def current(self) -> SeenFilter | None:
        """The filter in use once the one being built (if any) is in place."""
        if self._loading is not None:
            await asyncio.shield(self._loading)
        return self._filter

    def close(self) -> None:
        if self._loading is not None:
            self._loading.cancel()

    def _load(self, capacity: int) -> None:
        if self._meanwhile is not None:
            return  # one is on its way
        self._meanwhile = []
        self._loading = asyncio.create_task(self._take(capacity), name="inbound filter")

    async def _take(self, capacity: int) -> None:
        try:
            seen = await self._store.seen_inbound(capacity)
        except Exception as exc:
            log.warning("no filter of seen messages: %s", exc)
            seen = None
        meanwhile, self._meanwhile = self._meanwhile or [], None
        if seen is None:
            if self._filter is None:  # none at all: every message waits for the store; later
                self._retry_at = asyncio.get_running_loop().time() + self._retry_after
            else:  # the one in use goes on answering, "maybe" more often; ask again later
                self._rebuild_at = 2 * max(self._rebuild_at, capacity)
            return
        for key in meanwhile:
            seen.add(*key)
        self._filter = seen
        self._rebuild_at = seen.capacity
