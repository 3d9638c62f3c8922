"""Slack's rate limits are per method tier and workspace: a 429 on one tier pauses that tier.

chat.postMessage is the exception (its "special" tier): Slack allows about one message per
second per channel, with short bursts, besides a workspace-wide limit
(https://docs.slack.dev/apis/web-api/rate-limits). A 429 does not say which of the two it is.
The one a bot meets is nearly always the channel's (an agent answering in parts, or a busy
channel), so a first 429 pauses posting to that channel only; a 429 in a second channel while
the first is still paused is the workspace's limit, and pauses posting everywhere. At most two
calls meet the workspace-wide limit, and one slow conversation never stalls the others.

`TierGate` is bookkeeping only (a fake clock tests it): `blocked(method)` says how long calls of
that method's tier must still wait, `channel_blocked(method, channel)` how long that channel's,
`hit(method, seconds, channel)` records a `Retry-After` and says which it paused. The connector
raises `RateLimitedError` instead of calling while blocked, so nothing sleeps here and other
tiers, channels and workspaces carry on.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Literal

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
    "conversations.members": "tier4",
    "users.info": "tier4",
    "auth.test": "special:auth.test",
    "files.getUploadURLExternal": "tier4",
    "files.completeUploadExternal": "tier4",
    "files.info": "tier4",
    "files.upload_v2": "tier4",
    "assistant.threads.setStatus": "tier3",
}
PER_CHANNEL = frozenset({"chat.postMessage"})
"""Methods limited per channel first (and per workspace besides)."""

Scope = Literal["connection", "thread"]


def tier(method: str) -> str:
    return TIERS.get(method, "tier3")


class TierGate:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._until: dict[str, float] = {}
        self._channels: dict[tuple[str, str], float] = {}
        """(tier, channel) -> until: the per-channel pauses of `PER_CHANNEL` methods."""

    def blocked(self, method: str) -> float:
        """Seconds calls of `method`'s tier must still wait, in every channel (0: go ahead)."""
        until = self._until.get(tier(method), 0.0)
        return max(0.0, until - self._clock())

    def channel_blocked(self, method: str, channel: str | None) -> float:
        """Seconds calls of `method` to `channel` must still wait besides (0: go ahead)."""
        if channel is None or method not in PER_CHANNEL:
            return 0.0
        until = self._channels.get((tier(method), channel), 0.0)
        return max(0.0, until - self._clock())

    def hit(self, method: str, retry_after: float, channel: str | None = None) -> Scope:
        """Record a 429; which it paused: the channel (`thread`) or the tier (`connection`)."""
        key = tier(method)
        now = self._clock()
        until = now + max(0.0, retry_after)
        if channel is not None and method in PER_CHANNEL:
            for paused in [k for k, t in self._channels.items() if t <= now]:
                del self._channels[paused]  # over: forget them
            elsewhere = any(k[0] == key and k[1] != channel for k in self._channels)
            if not elsewhere:
                if until > self._channels.get((key, channel), 0.0):
                    self._channels[(key, channel)] = until
                return "thread"
        if until > self._until.get(key, 0.0):
            self._until[key] = until
        return "connection"
