"""Slack's rate limits are per method tier and workspace: a 429 on one tier pauses that tier.

`TierGate` is bookkeeping only (a fake clock tests it): `blocked(method)` says how long calls of
that method's tier must still wait, `hit(method, seconds)` records a `Retry-After`. The
connector raises `RateLimitedError` instead of calling while blocked, so nothing sleeps here
and other tiers (and other workspaces) carry on.
"""

from __future__ import annotations

import time
from collections.abc import Callable

# https://docs.slack.dev/apis/web-api/rate-limits ; methods not listed share "tier3".
TIERS: dict[str, str] = {
    "apps.connections.open": "tier1",
    "chat.postMessage": "special:chat.postMessage",
    "chat.update": "tier3",
    "chat.delete": "tier3",
    "reactions.add": "tier3",
    "conversations.history": "tier3",
    "conversations.replies": "tier3",
    "conversations.info": "tier3",
    "users.info": "tier4",
    "auth.test": "special:auth.test",
    "files.getUploadURLExternal": "tier4",
    "files.completeUploadExternal": "tier4",
    "files.info": "tier4",
    "files.upload_v2": "tier4",
    "assistant.threads.setStatus": "tier3",
}


def tier(method: str) -> str:
    return TIERS.get(method, "tier3")


class TierGate:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._until: dict[str, float] = {}

    def blocked(self, method: str) -> float:
        """Seconds calls of `method`'s tier must still wait (0: go ahead)."""
        until = self._until.get(tier(method), 0.0)
        return max(0.0, until - self._clock())

    def hit(self, method: str, retry_after: float) -> None:
        key = tier(method)
        until = self._clock() + max(0.0, retry_after)
        if until > self._until.get(key, 0.0):
            self._until[key] = until
