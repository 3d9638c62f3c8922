"""Discord gateway payloads <-> talkbridge messages; pure (no I/O, no await, no client).

Ids: a thread is a channel id (a thread or forum post is a channel of its own; its parent is
named in `thread_name` as `#parent / thread`); a message is `"{channel_id}:{message_id}"`. An edit
gets its own id per edit (`"{channel}:{message}:edit:{edited_timestamp}"`) with `edit_of` naming
the original. A button click is a message with id `"ia:{interaction_id}"` whose text is the
button's value (its custom_id).

Names the payload does not carry (channel names, role names) come from a `Names` table the
transport fills from discord.py's cache; the codec itself never looks anything up.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from talkbridge.connectors.discord.render import (
    DISCORD_TEXT_LIMIT,
    escape_markdown,
    render,
    render_chunks,
    split_message,
)
from talkbridge.message import Attachment, AttachmentKind, NormalizedMessage, ReplyTo

__all__ = [
    "DISCORD_TEXT_LIMIT",
    "ChannelInfo",
    "DiscordEvent",
    "Names",
    "addressed_to_bot",
    "decode_bulk_delete",
    "decode_delete",
    "decode_event",
    "decode_interaction",
    "decode_message",
    "escape_markdown",
    "native_id",
    "parse_native_id",
    "parse_thread_id",
    "render",
    "render_chunks",
    "split_message",
]

# Message types a person writes: DEFAULT and REPLY. Joins, pins, thread starters … are skipped.
_USER_MESSAGE_TYPES = {0, 19}
_IS_VOICE_MESSAGE = 1 << 13
_MENTION = re.compile(r"<(@!?|@&|#)(\d+)>")
_CUSTOM_EMOJI = re.compile(r"<a?:(\w+):\d+>")
_TIMESTAMP = re.compile(r"<t:(-?\d+)(?::[tTdDfFR])?>")


@dataclass(frozen=True, slots=True)
class ChannelInfo:
    name: str
    parent_id: str | None = None
    parent_name: str | None = None


@dataclass(frozen=True, slots=True)
class Names:
    """What the client's cache knows: channel and role names by id."""

    channels: Mapping[str, ChannelInfo] = field(default_factory=dict)
    roles: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class DiscordEvent:
    """The `raw_event` of a Discord message: the dispatch name, its payload, and the names of
    the sender's roles in that guild (what role-based trust checks)."""

    kind: str
    payload: Mapping[str, Any]
    role_names: tuple[str, ...] = ()


# ---- ids --------------------------------------------------------------------------------------


def native_id(channel_id: int | str, message_id: int | str) -> str:
    return f"{channel_id}:{message_id}"


def parse_thread_id(thread_id: str) -> int:
    if not thread_id.isdigit():
        raise ValueError(f"not a Discord channel id (a snowflake): {thread_id!r}")
    return int(thread_id)


def parse_native_id(message_id: str) -> tuple[int, int]:
    """`"123:456"` (or an edit id `"123:456:edit:…"`) -> (123, 456)."""
    parts = message_id.split(":")
    if len(parts) < 2 or not parts[0].isdigit() or not parts[1].isdigit():
        raise ValueError(f"not a Discord message id (channel:message): {message_id!r}")
    return int(parts[0]), int(parts[1])


# ---- inbound ----------------------------------------------------------------------------------


def _timestamp(value: Any) -> datetime:
    if isinstance(value, str) and value:
        parsed = datetime.fromisoformat(value)
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    return datetime.now(UTC)


def user_name(user: Mapping[str, Any] | None, member: Mapping[str, Any] | None = None) -> str:
    """Server nickname, else display name, else username."""
    member = member or {}
    user = user or member.get("user") or {}
    return str(
        member.get("nick") or user.get("global_name") or user.get("username") or user.get("id", "")
    )


def readable(content: str, payload: Mapping[str, Any], names: Names) -> str:
    """Mentions, custom emoji and timestamps as a person reads them."""
    users: dict[str, str] = {}
    for mentioned in payload.get("mentions") or ():
        if isinstance(mentioned, Mapping) and "id" in mentioned:
            users[str(mentioned["id"])] = user_name(mentioned, mentioned.get("member"))
    channels = dict(names.channels)
    for mentioned in payload.get("mention_channels") or ():
        if isinstance(mentioned, Mapping) and "id" in mentioned:
            channels.setdefault(str(mentioned["id"]), ChannelInfo(str(mentioned.get("name", ""))))

    def mention(match: re.Match[str]) -> str:
        kind, ident = match.group(1), match.group(2)
        if kind == "#":
            info = channels.get(ident)
            return f"#{info.name}" if info and info.name else "#unknown-channel"
        if kind == "@&":
            return f"@{names.roles.get(ident, 'unknown-role')}"
        return f"@{users.get(ident, 'unknown-user')}"

    text = _MENTION.sub(mention, content)
    text = _CUSTOM_EMOJI.sub(r":\1:", text)
    return _TIMESTAMP.sub(
        lambda m: datetime.fromtimestamp(int(m.group(1)), UTC).strftime("%Y-%m-%d %H:%M UTC"), text
    )


def _embed_text(embeds: Sequence[Any]) -> list[str]:
    parts: list[str] = []
    for embed in embeds:
        if not isinstance(embed, Mapping):
            continue
        for key in ("title", "description"):
            if embed.get(key):
                parts.append(str(embed[key]))
        for item in embed.get("fields") or ():
            if isinstance(item, Mapping):
                parts.append(f"{item.get('name', '')}: {item.get('value', '')}".strip(": "))
        footer = (embed.get("footer") or {}).get("text")
        if footer:
            parts.append(str(footer))
    return parts


def _attachment_kind(item: Mapping[str, Any], voice: bool) -> AttachmentKind:
    mime = str(item.get("content_type") or "")
    if voice and mime.startswith("audio/"):
        return "voice"
    for prefix, kind in (("image/", "image"), ("video/", "video"), ("audio/", "audio")):
        if mime.startswith(prefix):
            return kind  # type: ignore[return-value]
    return "document"


def _attachments(payload: Mapping[str, Any]) -> tuple[Attachment, ...]:
    voice = bool(int(payload.get("flags") or 0) & _IS_VOICE_MESSAGE)
    found: list[Attachment] = []
    for item in payload.get("attachments") or ():
        if not isinstance(item, Mapping):
            continue
        meta = {k: item[k] for k in ("id", "width", "height", "duration_secs") if k in item}
        found.append(
            Attachment(
                kind=_attachment_kind(item, voice),
                name=item.get("filename"),
                mime_type=item.get("content_type"),
                size=item.get("size"),
                ref=item.get("url"),
                meta=meta,
            )
        )
    for sticker in payload.get("sticker_items") or ():
        if isinstance(sticker, Mapping):
            found.append(
                Attachment(kind="sticker", name=sticker.get("name"), meta={"id": sticker.get("id")})
            )
    return tuple(found)


def _thread(payload: Mapping[str, Any], names: Names) -> tuple[str, str | None]:
    channel_id = str(payload.get("channel_id"))
    if not payload.get("guild_id"):
        return channel_id, None
    info = names.channels.get(channel_id)
    if info is None:
        return channel_id, None
    if info.parent_id:
        parent = info.parent_name or names.channels.get(info.parent_id, ChannelInfo("")).name
        return channel_id, f"#{parent} / {info.name}" if parent else info.name
    return channel_id, f"#{info.name}"


def _reply_to(payload: Mapping[str, Any], names: Names) -> ReplyTo | None:
    reference = payload.get("message_reference")
    if not isinstance(reference, Mapping) or reference.get("type", 0) != 0:
        return None  # forwards and crossposts are not replies
    if not reference.get("message_id") or int(payload.get("type") or 0) != 19:
        return None
    referenced = payload.get("referenced_message")
    content = None
    sender = None
    if isinstance(referenced, Mapping):
        content = readable(str(referenced.get("content") or ""), referenced, names) or None
        sender = user_name(referenced.get("author")) or None
    channel = reference.get("channel_id") or payload.get("channel_id")
    return ReplyTo(
        message_id=native_id(str(channel), str(reference["message_id"])),
        content=content,
        sender_name=sender,
    )


def addressed_to_bot(
    payload: Mapping[str, Any], bot_id: int | str | None, bot_role_ids: Sequence[str] = ()
) -> bool:
    """Whether a guild message is for the bot: it mentions the bot (or its managed role) or
    replies to one of the bot's messages. `@everyone` does not count."""
    if bot_id is None:
        return False
    bot = str(bot_id)
    if any(str(u.get("id")) == bot for u in payload.get("mentions") or () if isinstance(u, dict)):
        return True
    if set(map(str, payload.get("mention_roles") or ())) & set(bot_role_ids):
        return True
    referenced = payload.get("referenced_message")
    if isinstance(referenced, Mapping):
        return str((referenced.get("author") or {}).get("id")) == bot
    return False


def _strip_leading_mention(content: str, bot_id: int | str | None) -> str:
    if bot_id is None:
        return content
    return re.sub(rf"^\s*<@!?{bot_id}>\s*", "", content, count=1)


def decode_message(
    payload: Mapping[str, Any],
    *,
    connection_id: str,
    bot_id: int | str | None = None,
    names: Names | None = None,
    kind: str = "MESSAGE_CREATE",
    role_names: Sequence[str] = (),
) -> NormalizedMessage | None:
    """A MESSAGE_CREATE or MESSAGE_UPDATE payload -> message, or None for what is not handled.

    None for: bots and webhooks (our own messages included: no echo loops), system messages
    (joins, pins, thread starters), empty messages, and updates that are not a content edit
    (embed unfurls arrive as MESSAGE_UPDATE without `edited_timestamp`).
    """
    names = names or Names()
    author = payload.get("author") or {}
    if not isinstance(author, Mapping) or "id" not in author or "channel_id" not in payload:
        return None
    if author.get("bot") or payload.get("webhook_id") or author.get("system"):
        return None
    if bot_id is not None and str(author["id"]) == str(bot_id):
        return None
    if int(payload.get("type") or 0) not in _USER_MESSAGE_TYPES:
        return None
    edited = kind == "MESSAGE_UPDATE"
    if edited and not payload.get("edited_timestamp"):
        return None
    content = _strip_leading_mention(str(payload.get("content") or ""), bot_id)
    parts = [readable(content, payload, names)] if content else []
    parts.extend(_embed_text(payload.get("embeds") or ()))
    text = "\n".join(p for p in parts if p)
    attachments = _attachments(payload)
    if not text and not attachments:
        return None
    channel_id = str(payload["channel_id"])
    base_id = native_id(channel_id, str(payload["id"]))
    thread_id, thread_name = _thread(payload, names)
    guild = bool(payload.get("guild_id"))
    return NormalizedMessage(
        id=f"{base_id}:edit:{payload['edited_timestamp']}" if edited else base_id,
        connection_id=connection_id,
        channel="discord",
        channel_user_id=str(author["id"]),
        display_name=user_name(author, payload.get("member")),
        thread_id=thread_id,
        thread_name=thread_name,
        thread_type="group" if guild else "private",
        timestamp=_timestamp(
            payload.get("edited_timestamp") if edited else payload.get("timestamp")
        ),
        text=text,
        attachments=attachments,
        reply_to=_reply_to(payload, names),
        edit_of=base_id if edited else None,
        sender_roles=_scoped(payload, role_names),
        raw_event=DiscordEvent(kind, payload, tuple(role_names)),
    )


def decode_interaction(
    payload: Mapping[str, Any],
    *,
    connection_id: str,
    names: Names | None = None,
    role_names: Sequence[str] = (),
) -> NormalizedMessage | None:
    """A button click (INTERACTION_CREATE of type MESSAGE_COMPONENT) -> a message whose text is
    the button's value. Other interactions (slash commands, selects, modals) -> None."""
    names = names or Names()
    data = payload.get("data") or {}
    if payload.get("type") != 3 or data.get("component_type") != 2 or not payload.get("id"):
        return None
    member = payload.get("member")
    user = (member or {}).get("user") or payload.get("user") or {}
    if "id" not in user or user.get("bot"):
        return None
    message = payload.get("message") or {}
    channel_id = str(payload.get("channel_id") or message.get("channel_id"))
    thread_id, thread_name = _thread({**payload, "channel_id": channel_id}, names)
    reply = None
    if message.get("id"):
        reply = ReplyTo(
            message_id=native_id(channel_id, str(message["id"])),
            content=str(message.get("content") or "") or None,
            sender_name=user_name(message.get("author")) or None,
        )
    return NormalizedMessage(
        id=f"ia:{payload['id']}",
        connection_id=connection_id,
        channel="discord",
        channel_user_id=str(user["id"]),
        display_name=user_name(user, member),
        thread_id=thread_id,
        thread_name=thread_name,
        thread_type="group" if payload.get("guild_id") else "private",
        timestamp=_snowflake_time(str(payload["id"])),
        text=str(data.get("custom_id") or ""),
        reply_to=reply,
        sender_roles=_scoped(payload, role_names),
        raw_event=DiscordEvent("INTERACTION_CREATE", payload, tuple(role_names)),
    )


def _scoped(payload: Mapping[str, Any], role_names: Sequence[str]) -> tuple[str, ...]:
    """`<server id>/<role>` for each role: a role's name is its server's only (none in a DM)."""
    guild = payload.get("guild_id")
    return tuple(f"{guild}/{role}" for role in role_names) if guild else ()


def decode_delete(payload: Mapping[str, Any]) -> tuple[str, str] | None:
    """A MESSAGE_DELETE payload -> (thread id, native message id)."""
    if not payload.get("channel_id") or not payload.get("id"):
        return None
    channel_id = str(payload["channel_id"])
    return channel_id, native_id(channel_id, str(payload["id"]))


def decode_bulk_delete(payload: Mapping[str, Any]) -> list[tuple[str, str]]:
    """A MESSAGE_DELETE_BULK payload (a moderator's purge) -> (thread id, native message id)
    for each message it names."""
    ids = payload.get("ids")
    if not payload.get("channel_id") or not isinstance(ids, list):
        return []
    channel_id = str(payload["channel_id"])
    return [(channel_id, native_id(channel_id, str(ident))) for ident in ids if ident]


def decode_event(
    kind: str,
    payload: Mapping[str, Any],
    *,
    connection_id: str,
    bot_id: int | str | None = None,
    names: Names | None = None,
    role_names: Sequence[str] = (),
) -> NormalizedMessage | None:
    if kind in ("MESSAGE_CREATE", "MESSAGE_UPDATE"):
        return decode_message(
            payload,
            connection_id=connection_id,
            bot_id=bot_id,
            names=names,
            kind=kind,
            role_names=role_names,
        )
    if kind == "INTERACTION_CREATE":
        return decode_interaction(
            payload, connection_id=connection_id, names=names, role_names=role_names
        )
    return None


_DISCORD_EPOCH_MS = 1420070400000


def _snowflake_time(snowflake: str) -> datetime:
    try:
        return datetime.fromtimestamp(((int(snowflake) >> 22) + _DISCORD_EPOCH_MS) / 1000, UTC)
    except ValueError:
        return datetime.now(UTC)


# ---- outbound ---------------------------------------------------------------------------------

CUSTOM_ID_LIMIT = 100
BUTTON_LABEL_LIMIT = 80
BUTTONS_PER_ROW = 5
MAX_BUTTONS = 25


def check_buttons(buttons: Sequence[tuple[str, str]]) -> None:
    """Raise ValueError naming what Discord would refuse about these (label, value) buttons."""
    if len(buttons) > MAX_BUTTONS:
        raise ValueError(f"Discord allows at most {MAX_BUTTONS} buttons on a message")
    for label, value in buttons:
        if not 1 <= len(label) <= BUTTON_LABEL_LIMIT:
            raise ValueError(f"button label {label!r} must be 1-{BUTTON_LABEL_LIMIT} characters")
        if not 1 <= len(value) <= CUSTOM_ID_LIMIT:
            raise ValueError(
                f"button value for {label!r} must be 1-{CUSTOM_ID_LIMIT} characters "
                "(Discord's custom_id limit)"
            )
