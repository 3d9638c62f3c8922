"""Names an inbound event shows (its sender's, its channel's), looked up without holding it up.

Slack wants an event acknowledged within 3 s, and an event is acknowledged only once it is
stored: a lookup (`users.info`, `conversations.info`) is waited for a bounded time, then the
event goes on without the name while the lookup finishes in the background and fills the
cache. One lookup per id runs at a time, so a burst of events in one channel asks Slack once.
A failed lookup is a missing name, said at debug level: a name is a nicety, never a reason to
delay or lose a message.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Iterable

Cached = Callable[[str], tuple[str | None] | None]
"""`(name,)` while the cache's answer is fresh (the name None: there is none), else None."""


class NameLookups:
    def __init__(
        self,
        method: str,
        cached: Cached,
        fetch: Callable[[str], Awaitable[str | None]],
        log: logging.Logger,
    ) -> None:
        self._method = method
        """The Slack method asked, as the log names it."""
        self._cached = cached
        self._fetch = fetch
        self._log = log
        self._under_way: dict[str, asyncio.Future[str | None]] = {}
        self._forgotten: set[asyncio.Future[str | None]] = set()
        """Lookups no event waits for any more (`forget`), still stopped on close."""

    async def names(self, ids: Iterable[str], *, wait: float | None = None) -> dict[str, str]:
        """The names of `ids` that are known or found: looked up together; after `wait`
        seconds those still under way are left out. A lookup already under way was slow once:
        it is not waited for again."""
        names: dict[str, str] = {}
        lookups: dict[str, asyncio.Future[str | None]] = {}
        fresh: list[asyncio.Future[str | None]] = []
        for key in set(ids):
            cached = self._cached(key)
            if cached is not None:  # most events: no task, no wait
                if cached[0] is not None:
                    names[key] = cached[0]
                continue
            lookup = self._under_way.get(key)
            if lookup is None:
                lookup = self._under_way[key] = asyncio.ensure_future(self._name(key))
                lookup.add_done_callback(functools.partial(self._done, key))
                fresh.append(lookup)
            lookups[key] = lookup
        awaited = fresh if wait is not None else list(lookups.values())
        if awaited:
            await asyncio.wait(awaited, timeout=wait)
        for key, lookup in lookups.items():
            if not lookup.done():
                if lookup in fresh:
                    self._log.info("%s %s is slow: going on without its name", self._method, key)
            elif (name := lookup.result()) is not None:
                names[key] = name
        return names

    def forget(self, key: str) -> None:
        """The next event asks afresh instead of joining the lookup under way (whose answer
        may be out of date: the channel was renamed meanwhile)."""
        lookup = self._under_way.pop(key, None)
        if lookup is not None and not lookup.done():
            self._forgotten.add(lookup)
            lookup.add_done_callback(self._forgotten.discard)

    def cancel(self) -> None:
        """Stop the lookups under way (the connection closes)."""
        for lookup in [*self._under_way.values(), *self._forgotten]:
            lookup.cancel()

    def _done(self, key: str, lookup: asyncio.Future[str | None]) -> None:
        if self._under_way.get(key) is lookup:
            del self._under_way[key]

    async def _name(self, key: str) -> str | None:
        try:
            return await self._fetch(key)
        except Exception as exc:  # a name is a nicety: the message goes on without it
            self._log.debug("%s %s failed: %s", self._method, key, exc)
            return None
