"""Where each Discord channel was read up to, for catching up after a new gateway session; pure.

Discord replays missed events only to a resumed session. A new one (a restart, a refused resume,
an event discord.py's parser failed on) starts from now, so the transport remembers, per channel
it delivered messages from, the newest message id it took there, and asks the REST API for what
came after it. Ids are snowflakes: they grow with time and carry their creation time, which says
how old a cursor is without storing a clock.

Stored as one JSON object per connection: `{"<channel id>": ["<message id>", "<guild id>" | null]}`
(the guild id, because a message fetched over REST does not carry it and the codec tells a
server channel from a DM by it).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

DISCORD_EPOCH_MS = 1420070400000
DAY_MS = 86_400_000
_KEPT = 500
"""At most this many channels are stored (the most recently active)."""


def snowflake_ms(ident: int) -> int:
    """The Unix time in milliseconds a snowflake was made at."""
    return (ident >> 22) + DISCORD_EPOCH_MS


@dataclass(frozen=True, slots=True)
class Cursor:
    message_id: int
    guild_id: str | None


class Cursors:
    """The newest message id taken per channel; `dirty` until the transport has stored it."""

    def __init__(self, by_channel: Mapping[str, Cursor] | None = None) -> None:
        self._by_channel: dict[str, Cursor] = dict(by_channel or {})
        self.dirty = False

    @classmethod
    def load(cls, text: str | None) -> Cursors:
        """From what `dump` wrote; what cannot be read is left out (a fetch too few, no more)."""
        found: dict[str, Cursor] = {}
        try:
            data: Any = json.loads(text) if text else {}
        except ValueError:
            data = {}
        if isinstance(data, dict):
            for channel, value in data.items():
                if (
                    isinstance(channel, str)
                    and channel.isdigit()
                    and isinstance(value, list)
                    and len(value) == 2
                    and isinstance(value[0], str)
                    and value[0].isdigit()
                    and (value[1] is None or isinstance(value[1], str))
                ):
                    found[channel] = Cursor(int(value[0]), value[1])
        return cls(found)

    def dump(self) -> str:
        newest = sorted(self._by_channel.items(), key=lambda kv: kv[1].message_id, reverse=True)
        return json.dumps(
            {channel: [str(c.message_id), c.guild_id] for channel, c in newest[:_KEPT]},
            separators=(",", ":"),
        )

    def __contains__(self, channel: object) -> bool:
        return channel in self._by_channel

    def get(self, channel: str) -> Cursor | None:
        return self._by_channel.get(channel)

    def is_new(self, channel: str, message_id: int) -> bool:
        """Whether `message_id` is after the channel's cursor (True when there is none)."""
        cursor = self._by_channel.get(channel)
        return cursor is None or message_id > cursor.message_id

    def advance(self, channel: str, message_id: int, guild_id: str | None) -> None:
        """Move the channel's cursor to `message_id` if that is newer (adding the channel)."""
        cursor = self._by_channel.get(channel)
        if cursor is None or message_id > cursor.message_id:
            self._by_channel[channel] = Cursor(
                message_id, guild_id if guild_id is not None or cursor is None else cursor.guild_id
            )
            self.dirty = True

    def forget(self, channel: str) -> None:
        if self._by_channel.pop(channel, None) is not None:
            self.dirty = True

    def due(self, now_ms: int, *, max_age_days: float, limit: int) -> list[tuple[str, Cursor]]:
        """The channels to catch up on: active within `max_age_days`, the `limit` most recent."""
        oldest = now_ms - int(max_age_days * DAY_MS)
        recent = [
            (channel, cursor)
            for channel, cursor in self._by_channel.items()
            if snowflake_ms(cursor.message_id) >= oldest
        ]
        recent.sort(key=lambda kv: kv[1].message_id, reverse=True)
        return recent[:limit]


def after_cursor(
    pages: list[list[Mapping[str, Any]]], cursor: Cursor, channel: str
) -> list[dict[str, Any]]:
    """Messages fetched after `cursor` (pages newest first, as Discord answers), oldest first,
    each once, with the channel's guild id filled in as a gateway MESSAGE_CREATE carries it."""
    seen: dict[int, dict[str, Any]] = {}
    for page in pages:
        for payload in page:
            ident = str(payload.get("id", ""))
            if not ident.isdigit() or int(ident) <= cursor.message_id:
                continue
            message = {**payload, "channel_id": str(payload.get("channel_id") or channel)}
            if cursor.guild_id and not message.get("guild_id"):
                message["guild_id"] = cursor.guild_id
            seen[int(ident)] = message
    return [seen[key] for key in sorted(seen)]
