"""What `conversations.info` said of each conversation, kept so a message costs no call.

The method is tier 3 (about 50 calls a minute), shared with history and edits. An answer is kept
`keep_for` seconds (`channel_cache_seconds`). "Not found" (a channel the bot cannot see) is kept
too, for at most `NOT_FOUND_SECONDS` and `NOT_FOUND_LIMIT` channels: anyone can write `<#C…>`
mentions of such channels, and asking again on every one would get the bot rate limited.

A rename, or the bot joining the channel, forgets what was known of it at once (the bot invited
to a channel sees it from then on), and an answer asked for before that is not kept: it may
name the channel as it was, or not see it yet.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

NOT_FOUND_SECONDS = 300.0
"""How long "not found" is believed (never longer than `channel_cache_seconds`)."""
NOT_FOUND_LIMIT = 1024
"""Channels whose "not found" is kept at once, the oldest forgotten first."""
_CHANGES_KEPT = 4096
"""Channels whose last change is remembered, to tell a lookup that started before it."""


@dataclass(frozen=True, slots=True)
class Known:
    """A `conversations.info` answer, when it was asked for and, for a group DM, its members'
    names."""

    at: float
    info: Mapping[str, Any]
    members: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Asking:
    """A lookup under way: when it started, and how many changes had been seen then."""

    at: float
    changes: int


class Conversations:
    def __init__(self, keep_for: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._keep_for = keep_for
        self._not_found_for = min(NOT_FOUND_SECONDS, keep_for)
        self._clock = clock
        self._known: dict[str, Known] = {}
        self._not_found: OrderedDict[str, float] = OrderedDict()
        self._changes = 0
        self._changed: OrderedDict[str, int] = OrderedDict()
        """The number of the last change (rename, join) of each channel that changed lately."""

    def cached(self, channel: str) -> tuple[Known | None] | None:
        """`(known,)` while an answer is fresh (None: not found lately), else None: ask Slack."""
        now = self._clock()
        known = self._known.get(channel)
        if known is not None and now - known.at < self._keep_for:
            return (known,)
        missing = self._not_found.get(channel)
        if missing is not None:
            if now - missing < self._not_found_for:
                return (None,)
            del self._not_found[channel]
        return None

    def asking(self) -> Asking:
        """Taken before asking Slack, handed back with its answer."""
        return Asking(self._clock(), self._changes)

    def found(
        self, channel: str, asking: Asking, info: Mapping[str, Any], members: tuple[str, ...] = ()
    ) -> Known:
        known = Known(asking.at, info, members)
        if self._current(channel, asking):
            self._known[channel] = known
            self._not_found.pop(channel, None)
        return known

    def not_found(self, channel: str, asking: Asking) -> None:
        if not self._current(channel, asking):
            return
        self._known.pop(channel, None)
        if self._not_found_for > 0:
            self._not_found[channel] = asking.at
            self._not_found.move_to_end(channel)
            while len(self._not_found) > NOT_FOUND_LIMIT:
                self._not_found.popitem(last=False)

    def changed(self, channel: str) -> None:
        """Slack said the channel was renamed, or the bot joined it: ask afresh."""
        self._known.pop(channel, None)
        self._not_found.pop(channel, None)
        self._changes += 1
        self._changed[channel] = self._changes
        self._changed.move_to_end(channel)
        while len(self._changed) > _CHANGES_KEPT:
            self._changed.popitem(last=False)

    def _current(self, channel: str, asking: Asking) -> bool:
        """Whether the channel has not changed since `asking` started."""
        return self._changed.get(channel, 0) <= asking.changes
