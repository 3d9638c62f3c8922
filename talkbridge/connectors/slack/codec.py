"""Slack events <-> talkbridge messages; pure (no I/O, no await, no client).

Ids: a message is `"{channel}:{ts}"` (a `ts` is unique within a channel); a conversation is the
channel id for top-level messages and `"{channel}:{thread_ts}"` for a thread. An edit gets its
own id per edit (`"{channel}:{ts}:edit:{edited_ts}"`) with `edit_of` naming the original; a
Block Kit button click is `"action:{channel}:{action_ts}"` with the button's value as its text.

Payloads are read as Slack's JSON: the Events API `event_callback` body (also the `payload` of a
Socket Mode `events_api` envelope), a bare `event`, or a `block_actions` interaction payload.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from talkbridge.connectors.slack.mrkdwn import (
    SLACK_TEXT_LIMIT,
    escape,
    mentioned_channels,
    mentioned_users,
    plain_text,
    render,
    render_chunks,
)
from talkbridge.connectors.slack.shown import channels_shown, shown_text, users_shown
from talkbridge.message import Attachment, AttachmentKind, NormalizedMessage, ReplyTo

__all__ = [
    "SECTION_TEXT_LIMIT",
    "SLACK_TEXT_LIMIT",
    "Deletion",
    "Identity",
    "button_blocks",
    "channels_to_resolve",
    "conversation_name",
    "decode",
    "decode_message",
    "escape",
    "event_of",
    "joined_channel",
    "mentions_bot",
    "native_id",
    "parse_native_id",
    "parse_thread_id",
    "render",
    "render_chunks",
    "started_by_bot",
    "thread_id",
    "users_to_resolve",
]

_CHANNEL = re.compile(r"[A-Z0-9]{2,}")
_TS = re.compile(r"[0-9]+\.[0-9]+")
# Message subtypes that carry something a person said; everything else (joins, topic
# changes, pins, bot_message, …) is not a turn.
_SPOKEN = {None, "file_share", "thread_broadcast", "me_message"}
_TOMBSTONE = "tombstone"
"""The placeholder ("This message was deleted.") left where a message with replies was."""
BUTTON_ACTION_PREFIX = "talkbridge_button_"


@dataclass(frozen=True, slots=True)
class Identity:
    """Who we are in this workspace: our own messages are never delivered back to us."""

    bot_user_id: str | None = None
    bot_id: str | None = None


@dataclass(frozen=True, slots=True)
class Deletion:
    """A message was deleted; `message_id` is its native id."""

    connection_id: str
    thread_id: str
    message_id: str
    raw_event: Any = None


# ---- ids --------------------------------------------------------------------------------------


def native_id(channel: str, ts: str) -> str:
    return f"{channel}:{ts}"


def thread_id(channel: str, thread_ts: str | None) -> str:
    return f"{channel}:{thread_ts}" if thread_ts else channel


def parse_thread_id(value: str) -> tuple[str, str | None]:
    """`"C123"` -> ("C123", None); `"C123:1712345678.000100"` -> ("C123", "1712345678.000100")."""
    channel, sep, ts = value.partition(":")
    if not _CHANNEL.fullmatch(channel) or (sep and not _TS.fullmatch(ts)):
        raise ValueError(f"not a Slack thread id (channel or channel:thread_ts): {value!r}")
    return channel, ts if sep else None


def parse_native_id(value: str) -> tuple[str, str]:
    """`"C123:1712345678.000100"` (or an edit id `"…:edit:…"`) -> (channel, ts)."""
    parts = value.split(":")
    if len(parts) < 2 or not _CHANNEL.fullmatch(parts[0]) or not _TS.fullmatch(parts[1]):
        raise ValueError(f"not a Slack message id (channel:ts): {value!r}")
    return parts[0], parts[1]


# ---- inbound ----------------------------------------------------------------------------------


def event_of(payload: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The inner event of an `event_callback` body, or the payload itself if it is an event."""
    if payload.get("type") == "event_callback":
        event = payload.get("event")
        return event if isinstance(event, Mapping) else None
    if isinstance(payload.get("type"), str) and "channel" in payload:
        return payload
    return None


def _timestamp(ts: Any) -> datetime:
    try:
        return datetime.fromtimestamp(float(ts), UTC)
    except (TypeError, ValueError):
        return datetime.now(UTC)


def _is_private(event: Mapping[str, Any], channel: str) -> bool:
    kind = event.get("channel_type")
    if isinstance(kind, str):
        return kind == "im"
    return channel.startswith("D")


def _from_us_or_a_bot(message: Mapping[str, Any], me: Identity) -> bool:
    if message.get("bot_id") or message.get("subtype") == "bot_message":
        return True  # other apps' bots too: bot-to-bot loops are the classic echo storm
    user = message.get("user")
    return user is not None and user == me.bot_user_id


def _kind(mimetype: str | None) -> AttachmentKind:
    major = (mimetype or "").split("/", 1)[0]
    if major == "image":
        return "image"
    if major == "video":
        return "video"
    if major == "audio":
        return "audio"
    return "document"


def _attachments(message: Mapping[str, Any]) -> tuple[Attachment, ...]:
    found: list[Attachment] = []
    for item in message.get("files") or ():
        if not isinstance(item, Mapping) or not item.get("id"):
            continue
        meta = {
            k: item[k]
            for k in ("title", "filetype", "permalink", "url_private_download", "file_access")
            if item.get(k)
        }
        size = item.get("size")
        found.append(
            Attachment(
                kind=_kind(item.get("mimetype")),
                name=item.get("name") or item.get("title"),
                mime_type=item.get("mimetype"),
                size=size if isinstance(size, int) and size >= 0 else None,
                ref=str(item["id"]),  # inbound_media resolves it through files.info
                meta=meta,
            )
        )
    return tuple(found)


def _sender_name(message: Mapping[str, Any], users: Mapping[str, str]) -> str:
    user = message.get("user")
    if isinstance(user, str) and user in users:
        return users[user]
    profile = message.get("user_profile") or {}
    for key in ("display_name", "real_name", "name"):
        if profile.get(key):
            return str(profile[key])
    return str(user or message.get("username") or "")


def _without_leading_mention(message: Mapping[str, Any], me: Identity) -> Mapping[str, Any]:
    """The message with the bot's mention that opens it taken off (`@bot what is …`), as on
    Discord: the agent and keyword hooks read the question, not the address."""
    text = message.get("text")
    if not isinstance(text, str) or me.bot_user_id is None:
        return message
    bare = re.sub(rf"^\s*<@{re.escape(me.bot_user_id)}(\|[^>]*)?>[\s,:]*", "", text, count=1)
    return message if bare == text else {**message, "text": bare}


def decode_message(
    message: Mapping[str, Any],
    *,
    channel: str,
    connection_id: str,
    me: Identity,
    users: Mapping[str, str] | None = None,
    channels: Mapping[str, str] | None = None,
    private: bool | None = None,
    edited: bool = False,
    include_own: bool = False,
    raw: Any = None,
) -> NormalizedMessage | None:
    """One Slack message object (from an event or from conversations.history) -> a message."""
    users = users or {}
    channels = channels or {}
    if message.get("subtype") not in _SPOKEN and not (include_own and message.get("bot_id")):
        return None
    if not include_own and _from_us_or_a_bot(message, me):
        return None
    ts = message.get("ts")
    if not isinstance(ts, str) or not _TS.fullmatch(ts):
        return None
    text = shown_text(_without_leading_mention(message, me), users, channels)
    attachments = _attachments(message)
    if not text.strip() and not attachments:
        return None
    thread_ts = message.get("thread_ts")
    thread_ts = thread_ts if isinstance(thread_ts, str) and _TS.fullmatch(thread_ts) else None
    is_private = _is_private(message, channel) if private is None else private
    base = native_id(channel, ts)
    edit_ts = (message.get("edited") or {}).get("ts")
    reply = None
    if thread_ts and thread_ts != ts:
        reply = ReplyTo(message_id=native_id(channel, thread_ts))
    user = message.get("user") or message.get("bot_id") or ""
    return NormalizedMessage(
        id=f"{base}:edit:{edit_ts or 0}" if edited else base,
        connection_id=connection_id,
        channel="slack",
        channel_user_id=str(user),
        display_name=_sender_name(message, users),
        thread_id=thread_id(channel, thread_ts),
        thread_name=None if is_private else channels.get(channel),
        thread_type="private" if is_private else "group",
        timestamp=_timestamp(edit_ts if edited and edit_ts else ts),
        text=text,
        attachments=attachments,
        reply_to=reply,
        edit_of=base if edited else None,
        raw_event=raw,
    )


def _decode_event(
    event: Mapping[str, Any],
    *,
    connection_id: str,
    me: Identity,
    users: Mapping[str, str],
    channels: Mapping[str, str],
    raw: Any,
) -> NormalizedMessage | Deletion | None:
    kind = event.get("type")
    channel = event.get("channel")
    if kind not in ("message", "app_mention") or not isinstance(channel, str):
        return None
    subtype = event.get("subtype")
    private = _is_private(event, channel)
    if subtype == "message_changed":
        inner = event.get("message")
        if not isinstance(inner, Mapping):
            return None
        if inner.get("subtype") == _TOMBSTONE:
            # A message with thread replies (the bot's answer under it, with reply_in_thread)
            # is deleted this way: Slack leaves a placeholder and sends no message_deleted.
            return _deletion(event, inner, connection_id=connection_id, raw=raw)
        previous = event.get("previous_message") or {}
        if previous.get("text") == inner.get("text") and previous.get("files") == inner.get(
            "files"
        ):
            return None  # unfurls and metadata updates also arrive as message_changed
        return decode_message(
            inner,
            channel=channel,
            connection_id=connection_id,
            me=me,
            users=users,
            channels=channels,
            private=private,
            edited=True,
            raw=raw,
        )
    if subtype == "message_deleted":
        previous = event.get("previous_message") or {}
        if not isinstance(previous, Mapping) or previous.get("subtype") == _TOMBSTONE:
            return None  # the placeholder goes (its last reply went): reported when it came
        return _deletion(event, {**previous, "ts": event.get("deleted_ts")}, connection_id, raw)
    return decode_message(
        event,
        channel=channel,
        connection_id=connection_id,
        me=me,
        users=users,
        channels=channels,
        private=private,
        raw=raw,
    )


def _deletion(
    event: Mapping[str, Any], message: Mapping[str, Any], connection_id: str, raw: Any
) -> Deletion | None:
    """The deletion of `message` (its `ts` and `thread_ts`) in the event's channel."""
    channel, ts = str(event.get("channel")), message.get("ts")
    if not isinstance(ts, str):
        return None
    return Deletion(
        connection_id=connection_id,
        thread_id=thread_id(channel, message.get("thread_ts")),
        message_id=native_id(channel, ts),
        raw_event=raw,
    )


def _decode_action(
    payload: Mapping[str, Any],
    *,
    connection_id: str,
    me: Identity,
    channels: Mapping[str, str],
    raw: Any,
) -> NormalizedMessage | None:
    actions = payload.get("actions") or []
    user = payload.get("user") or {}
    container = payload.get("container") or {}
    message = payload.get("message") or {}
    channel = (payload.get("channel") or {}).get("id") or container.get("channel_id")
    if not actions or not isinstance(actions[0], Mapping) or not user.get("id") or not channel:
        return None
    action = actions[0]
    value = action.get("value")
    if value is None:
        value = (action.get("selected_option") or {}).get("value")
    if value is None:
        value = (action.get("text") or {}).get("text")
    action_ts = action.get("action_ts") or payload.get("trigger_id")
    message_ts = container.get("message_ts") or message.get("ts")
    thread_ts = container.get("thread_ts") or message.get("thread_ts")
    private = str(channel).startswith("D")
    name = user.get("name") or user.get("username") or user.get("id")
    return NormalizedMessage(
        id=f"action:{channel}:{action_ts}",
        connection_id=connection_id,
        channel="slack",
        channel_user_id=str(user["id"]),
        display_name=str(name),
        thread_id=thread_id(str(channel), thread_ts),
        thread_name=None
        if private
        else channels.get(str(channel)) or (payload.get("channel") or {}).get("name"),
        thread_type="private" if private else "group",
        timestamp=_timestamp(action.get("action_ts")),
        text=str(value or ""),
        reply_to=ReplyTo(
            message_id=native_id(str(channel), str(message_ts)),
            content=plain_text(str(message.get("text") or "")) or None,
        )
        if message_ts
        else None,
        raw_event=raw,
    )


def decode(
    payload: Mapping[str, Any],
    *,
    connection_id: str,
    me: Identity,
    users: Mapping[str, str] | None = None,
    channels: Mapping[str, str] | None = None,
) -> NormalizedMessage | Deletion | None:
    """An Events API body, a bare event or a `block_actions` payload -> message, deletion or None.

    None for: our own and other bots' messages, service messages, events the bridge does not
    handle, and edits that change nothing a person wrote (link unfurls).
    """
    if payload.get("type") == "block_actions":
        return _decode_action(
            payload, connection_id=connection_id, me=me, channels=channels or {}, raw=payload
        )
    event = event_of(payload)
    if event is None:
        return None
    return _decode_event(
        event,
        connection_id=connection_id,
        me=me,
        users=users or {},
        channels=channels or {},
        raw=payload,
    )


_RENAMES = frozenset({"channel_rename", "group_rename"})


def renamed_channel(payload: Mapping[str, Any]) -> str | None:
    """The id of the conversation the payload says was renamed, else None: a `channel_rename`
    (public) or `group_rename` (private) event, whose `channel` is an object, or the
    `channel_name` message Slack posts in the channel itself (which a bot in it receives with
    the `message.*` subscriptions it has anyway)."""
    event = event_of(payload) or {}
    channel = event.get("channel")
    if event.get("type") in _RENAMES and isinstance(channel, Mapping):
        ident = channel.get("id")
        return ident if isinstance(ident, str) and ident else None
    if event.get("type") == "message" and event.get("subtype") == "channel_name":
        return channel if isinstance(channel, str) and channel else None
    return None


_JOINS = frozenset({"channel_joined", "group_joined"})


def joined_channel(payload: Mapping[str, Any], me: Identity) -> str | None:
    """The id of the conversation the payload says the bot joined, else None: a
    `member_joined_channel` event or `channel_join` message naming the bot (the bot is in the
    channel from then on), or a `channel_joined` / `group_joined` event (whose `channel` is an
    object)."""
    event = event_of(payload) or {}
    channel = event.get("channel")
    if event.get("type") in _JOINS and isinstance(channel, Mapping):
        ident = channel.get("id")
        return ident if isinstance(ident, str) and ident else None
    joining = event.get("type") == "member_joined_channel" or (
        event.get("type") == "message" and event.get("subtype") == "channel_join"
    )
    if joining and me.bot_user_id is not None and event.get("user") == me.bot_user_id:
        return channel if isinstance(channel, str) and channel else None
    return None


def mentions_bot(payload: Mapping[str, Any], me: Identity) -> bool:
    """Whether the event (an edit: its new text) names the bot: an `app_mention`, `<@BOT>` in
    the text, or a mention of it in the blocks. Not one in a message it shares (forwarded
    `@bot …` addresses the channel, and Slack sends no app_mention for it)."""
    event = event_of(payload) or {}
    if event.get("type") == "app_mention":
        return True
    message = event.get("message") if event.get("subtype") == "message_changed" else event
    if not isinstance(message, Mapping) or me.bot_user_id is None:
        return False
    text = str(message.get("text") or "")
    return (
        me.bot_user_id in mentioned_users(text)
        or f"<@{me.bot_user_id}|" in text
        or (me.bot_user_id in users_shown({"blocks": message.get("blocks")}))
    )


def started_by_bot(payload: Mapping[str, Any], me: Identity) -> bool:
    """Whether the event is a reply in a thread under one of the bot's own messages."""
    event = event_of(payload) or {}
    message = event.get("message") if event.get("subtype") == "message_changed" else event
    parent = message.get("parent_user_id") if isinstance(message, Mapping) else None
    return parent is not None and parent == me.bot_user_id


def users_to_resolve(payload: Mapping[str, Any]) -> set[str]:
    """User ids whose display names `decode` would like: the sender and unlabeled mentions."""
    event = event_of(payload) or {}
    inner = event.get("message") if event.get("subtype") == "message_changed" else event
    if not isinstance(inner, Mapping):
        return set()
    found = set(mentioned_users(str(inner.get("text") or ""))) | users_shown(inner)
    if isinstance(inner.get("user"), str) and not inner.get("bot_id"):
        found.add(inner["user"])
    return found


def channels_to_resolve(payload: Mapping[str, Any]) -> set[str]:
    """Channel ids whose names `decode` would like: the conversation's (for `thread_name`; a
    DM has none) and those its text mentions without a label, or its blocks mention (a Block Kit
    `channel` element carries only the id)."""
    if payload.get("type") == "block_actions":
        channel = payload.get("channel") or {}
        ident = channel.get("id") if isinstance(channel, Mapping) else None
        return {ident} if isinstance(ident, str) and not ident.startswith("D") else set()
    event = event_of(payload) or {}
    inner = event.get("message") if event.get("subtype") == "message_changed" else event
    if not isinstance(inner, Mapping):
        return set()
    found = set(mentioned_channels(str(inner.get("text") or ""))) | channels_shown(inner)
    channel = event.get("channel")
    if isinstance(channel, str) and _CHANNEL.fullmatch(channel) and not _is_private(event, channel):
        found.add(channel)
    return found


GROUP_DM = "group DM"
"""A group DM's name when its members' names are unknown (Slack names it `mpdm-a--b--c-1`)."""


def conversation_name(conversation: Mapping[str, Any], members: Sequence[str] = ()) -> str | None:
    """A conversation's name as people read it, from `conversations.info`: a channel's name
    (`general`); a group DM's `members` (their names, the bot's left out) as Slack lists them,
    else "group DM"; None for a DM (named by the person in it) or a conversation without one."""
    if conversation.get("is_im"):
        return None
    if conversation.get("is_mpim"):
        return ", ".join(members) or GROUP_DM
    name = conversation.get("name")
    return name if isinstance(name, str) and name else None


# ---- outbound ---------------------------------------------------------------------------------

_BUTTON_LABEL_LIMIT = 75
_BUTTON_VALUE_LIMIT = 2000
SECTION_TEXT_LIMIT = 3000
"""A section's mrkdwn text object holds at most this many characters (Slack refuses more with
`invalid_blocks`); a message with buttons shows its blocks, not its `text`, so the text above the
buttons is split at this limit instead of the message limit."""


def button_blocks(text_mrkdwn: str, buttons: Sequence[tuple[str, str]]) -> list[dict[str, Any]]:
    """Block Kit for a text with (label, value) buttons; a click comes back as `block_actions`.

    The text must already fit one section (`SECTION_TEXT_LIMIT`): cutting it here would lose its
    end, or leave half an entity or link, where the user reads it."""
    if not buttons:
        raise ValueError("no buttons given")
    if len(text_mrkdwn) > SECTION_TEXT_LIMIT:
        raise ValueError(
            f"the text above buttons must be at most {SECTION_TEXT_LIMIT} characters "
            "(split it first)"
        )
    if len(buttons) > 25:
        raise ValueError("Slack allows at most 25 buttons in one actions block")
    elements = []
    for index, (label, value) in enumerate(buttons):
        if not label or len(label) > _BUTTON_LABEL_LIMIT:
            raise ValueError(f"button label must be 1-{_BUTTON_LABEL_LIMIT} characters: {label!r}")
        if not value or len(value) > _BUTTON_VALUE_LIMIT:
            raise ValueError(
                f"button value for {label!r} must be 1-{_BUTTON_VALUE_LIMIT} characters"
            )
        elements.append(
            {
                "type": "button",
                "action_id": f"{BUTTON_ACTION_PREFIX}{index}",
                "text": {"type": "plain_text", "text": label, "emoji": True},
                "value": value,
            }
        )
    blocks: list[dict[str, Any]] = []
    if text_mrkdwn.strip():
        # verbatim: Slack parses a block's mrkdwn for mentions unless told not to, and a plain
        # "@channel" in text we were handed would then notify the whole channel.
        text = {"type": "mrkdwn", "text": text_mrkdwn, "verbatim": True}
        blocks.append({"type": "section", "text": text})
    blocks.append({"type": "actions", "elements": elements})
    return blocks
