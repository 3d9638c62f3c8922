"""The reply limits against mail loops, kept in the store so that a restart does not reset them.

A responder that marks nothing (no `Auto-Submitted`, no vendor header) and answers each of our
replies is only stopped by counting replies (`safety.ReplyLimiter`). Counted in memory alone, a
restart (a deploy, a crash, a bridge restarted by its supervisor) would allow another
`max_replies_per_thread` at once, and a bridge restarting every few minutes would keep the loop
going for ever. So each thread's and address's reply times are kept in the store for the
window (`reply_window`, by the store's wall clock), read when the key is first met.
"""

from __future__ import annotations

import json
import logging
from datetime import timedelta

from talkbridge.connectors.email.safety import ReplyLimiter
from talkbridge.errors import StoreError, TransientError
from talkbridge.store.base import Store


class KeptLimiter:
    """At most `limit` replies per key in `window` seconds, across restarts."""

    def __init__(
        self, store: Store, prefix: str, limit: int, window: float, log: logging.Logger
    ) -> None:
        self._store = store
        self._prefix = prefix
        self._memory = ReplyLimiter(limit, window)
        self._window = window
        self._log = log

    @property
    def limit(self) -> int:
        return self._memory.limit

    def now(self) -> float:
        return self._store.wall_clock()

    async def allowed(self, key: str, now: float) -> bool:
        if not self._memory.tracked(key):  # met first in this process: what came before
            try:
                raw = await self._store.get_state(self._prefix + key)
            except StoreError as exc:  # unknown, a loop could go on: not sent for now
                raise TransientError(f"cannot read the reply limit's count: {exc}") from exc
            if raw:
                self._memory.seed(key, [float(t) for t in json.loads(raw)])
        return self._memory.allowed(key, now)

    async def record(self, key: str, now: float) -> None:
        self._memory.record(key, now)
        times = [t for t in self._memory.times(key) if now - t < self._window]
        try:
            await self._store.set_state(
                self._prefix + key, json.dumps(times), keep_for=timedelta(seconds=self._window)
            )
        except StoreError as exc:  # this process still counts it
            self._log.warning("could not keep the reply limit's count for %s: %s", key, exc)
