"""Discord's global rate limit: a 429 that pauses every request of the bot, not one route's.

Discord limits each route (a bucket per route and channel) and, across all of them, the bot as
a whole. A 429 of the global limit says so in its body (`"global": true`) and its headers
(`X-RateLimit-Global: true`, `X-RateLimit-Scope: global`). discord.py waits out a global 429
of up to `max_ratelimit_timeout` itself, holding every request of its client meanwhile. A
longer one it raises as `RateLimited`, which does not say it was global, and then forgets it:
the next request of any other route goes out and gets a 429 of its own. Each of those counts
toward the invalid requests for which Cloudflare bans the bot's IP address (10,000 in 10
minutes).

`GlobalLimit` reads the global 429s off the client's request trace (`answers.py`) and keeps
until when the bot must not ask; meanwhile the transport fails its REST calls at once with a
`RateLimitedError` for the whole connection (`errors.translated`), so the router pauses all of
the connection's sends instead of each thread finding the limit by itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping


def is_global(headers: Mapping[str, str]) -> bool:
    """Whether a 429's headers say it is the global limit."""
    flag = str(headers.get("X-RateLimit-Global", "")).strip().lower()
    scope = str(headers.get("X-RateLimit-Scope", "")).strip().lower()
    return flag == "true" or scope == "global"


def _seconds(headers: Mapping[str, str]) -> float | None:
    """The wait a 429's headers give: `X-RateLimit-Reset-After` (fractional) when there, else
    `Retry-After` (whole seconds, rounded up)."""
    for name in ("X-RateLimit-Reset-After", "Retry-After"):
        try:
            return max(0.0, float(headers[name]))
        except (KeyError, TypeError, ValueError):
            continue
    return None


class GlobalLimit:
    """Until when the bot is globally rate limited, for waits discord.py hands back."""

    def __init__(self, longer_than: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._longer_than = longer_than
        """discord.py's `max_ratelimit_timeout`: shorter global waits it holds its client for."""
        self._clock = clock
        self._until = 0.0

    def answered(self, status: int, headers: Mapping[str, str]) -> None:
        """One REST answer, as the request trace sees it (before discord.py reads it)."""
        if status != 429 or not is_global(headers):
            return
        wait = _seconds(headers)
        if wait is not None and wait > self._longer_than:
            self.hit(wait)

    def hit(self, seconds: float) -> None:
        until = self._clock() + max(0.0, seconds)
        self._until = max(self._until, until)

    def left(self) -> float:
        """Seconds the bot must still not call Discord's REST API (0: go ahead)."""
        return max(0.0, self._until - self._clock())
