"""Telegram Update <-> talkbridge messages; pure (no I/O, no await, no client).

Native ids: a message is `"{chat_id}:{message_id}"` (unique within a bot), a thread is the chat
id, or `"{chat_id}:{topic_id}"` for a forum topic. An edit gets its own id per edit
(`"{chat}:{msg}:edit:{edit_date}"`) with `edit_of` naming the original, so the store dedupes
edits without mistaking them for the original. A button click arrives as a message whose id is
`"cb:{callback_query_id}"` and whose text is the button's value.

Updates are read as the Bot API's JSON (dicts); an aiogram `Update` is dumped to that shape first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, NamedTuple

from talkbridge.connectors.telegram.kinds import skipped, text_form
from talkbridge.connectors.telegram.render import (
    TELEGRAM_CAPTION_LIMIT,
    TELEGRAM_TEXT_LIMIT,
    html_text,
    render,
    render_chunks,
    split_html,
    utf16_len,
    visible_length,
)
from talkbridge.message import Attachment, AttachmentKind, NormalizedMessage, ReplyTo

__all__ = [
    "ALBUM_MAX",
    "TELEGRAM_CAPTION_LIMIT",
    "TELEGRAM_TEXT_LIMIT",
    "AlbumKey",
    "ThreadRef",
    "album_edit",
    "album_item",
    "decode_update",
    "edited_item",
    "html_text",
    "inline_keyboard",
    "merge_album",
    "migration",
    "native_id",
    "parse_native_id",
    "parse_thread_id",
    "render",
    "render_chunks",
    "skipped_kind",
    "split_html",
    "update_chat",
    "update_id",
    "update_to_dict",
    "utf16_len",
    "visible_length",
]

# The update kinds the connector asks for (`allowed_updates`) and decodes.
MESSAGE_KINDS = ("message", "edited_message", "channel_post", "edited_channel_post")
ALLOWED_UPDATES = (*MESSAGE_KINDS, "callback_query")

ThreadRef = tuple[int | str, int | None]
"""(chat id, forum topic id or None)."""


def update_to_dict(update: Mapping[str, Any] | Any) -> dict[str, Any]:
    """The Bot API JSON of an update, whether given as a dict or an aiogram `Update`."""
    if isinstance(update, Mapping):
        return dict(update)
    dump = getattr(update, "model_dump", None)
    if dump is None:
        raise TypeError(f"expected a Bot API update (dict or aiogram Update), got {type(update)}")
    result: dict[str, Any] = dump(mode="json", by_alias=True, exclude_none=True)
    return result


def update_id(update: Mapping[str, Any] | Any) -> int:
    value = update_to_dict(update).get("update_id")
    if not isinstance(value, int):
        raise ValueError("a Telegram update needs an integer update_id")
    return value


# ---- ids --------------------------------------------------------------------------------------


def native_id(chat_id: int | str, message_id: int | str) -> str:
    return f"{chat_id}:{message_id}"


def _chat_ref(value: str) -> int | str:
    """Numeric chat ids become ints; `@channelname` stays a string."""
    try:
        return int(value)
    except ValueError:
        if value.startswith("@") and len(value) > 1:
            return value
        raise ValueError(f"not a Telegram chat id: {value!r}") from None


def parse_thread_id(thread_id: str) -> ThreadRef:
    """`"-100123:42"` -> (-100123, 42); `"12345"` -> (12345, None)."""
    chat, sep, topic = thread_id.partition(":")
    if sep and not topic.isdigit():
        raise ValueError(f"not a Telegram thread id (chat or chat:topic): {thread_id!r}")
    return _chat_ref(chat), int(topic) if sep else None


def parse_native_id(message_id: str) -> tuple[int | str, int]:
    """`"-100123:77"` (or an edit id `"-100123:77:edit:…"`) -> (-100123, 77)."""
    parts = message_id.split(":")
    if len(parts) < 2 or not parts[1].isdigit():
        raise ValueError(f"not a Telegram message id (chat:message): {message_id!r}")
    return _chat_ref(parts[0]), int(parts[1])


# ---- inbound ----------------------------------------------------------------------------------


def _timestamp(value: Any) -> datetime:
    if isinstance(value, int | float):
        return datetime.fromtimestamp(value, UTC)
    if isinstance(value, str):
        return datetime.fromisoformat(value).astimezone(UTC)
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    return datetime.now(UTC)


def display_name(user: Mapping[str, Any] | None) -> str:
    """`First Last`, else `@username`, else a chat title, else the id."""
    if not user:
        return ""
    name = " ".join(p for p in (user.get("first_name"), user.get("last_name")) if p)
    if name:
        return name
    if user.get("username"):
        return f"@{user['username']}"
    return str(user.get("title") or user.get("id") or "")


def _thread(message: Mapping[str, Any]) -> tuple[str, str | None]:
    chat = message.get("chat") or {}
    chat_id = chat.get("id")
    title = chat.get("title")
    topic = message.get("message_thread_id")
    # In a forum every topic message carries its topic; elsewhere message_thread_id only names
    # a reply chain, which is not a separate conversation.
    if message.get("is_topic_message") and isinstance(topic, int):
        topic_name = ((message.get("reply_to_message") or {}).get("forum_topic_created") or {}).get(
            "name"
        )
        name = f"{title} / {topic_name}" if title and topic_name else title
        return f"{chat_id}:{topic}", name
    return str(chat_id), title


def _largest(sizes: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    return max(sizes, key=lambda s: (s.get("width", 0) * s.get("height", 0), s.get("file_size", 0)))


_FILE_KINDS: tuple[tuple[str, AttachmentKind], ...] = (
    ("document", "document"),
    ("audio", "audio"),
    ("voice", "voice"),
    ("video", "video"),
    ("video_note", "video"),
    ("animation", "video"),
    ("sticker", "sticker"),
)


def _file_attachment(kind: AttachmentKind, item: Mapping[str, Any], field: str) -> Attachment:
    meta: dict[str, Any] = {"telegram_type": field}
    for key in ("duration", "width", "height", "emoji", "title", "performer", "file_unique_id"):
        if key in item:
            meta[key] = item[key]
    return Attachment(
        kind=kind,
        name=item.get("file_name") or item.get("title"),
        mime_type=item.get("mime_type") or ("image/jpeg" if field == "photo" else None),
        size=item.get("file_size"),
        ref=item.get("file_id"),
        meta=meta,
    )


def _attachments(message: Mapping[str, Any]) -> tuple[Attachment, ...]:
    found: list[Attachment] = []
    photo = message.get("photo")
    if isinstance(photo, list) and photo:
        found.append(_file_attachment("image", _largest(photo), "photo"))
    for field, kind in _FILE_KINDS:
        item = message.get(field)
        # An animation also arrives as `document`; keep one attachment for it.
        if isinstance(item, Mapping) and not (field == "document" and "animation" in message):
            found.append(_file_attachment(kind, item, field))
    venue = message.get("venue")
    location = (venue or {}).get("location") or message.get("location")
    if isinstance(location, Mapping):
        meta = {k: location[k] for k in ("latitude", "longitude") if k in location}
        if venue:
            meta.update({k: venue[k] for k in ("title", "address") if k in venue})
        found.append(Attachment(kind="location", name=(venue or {}).get("title"), meta=meta))
    contact = message.get("contact")
    if isinstance(contact, Mapping):
        meta = {
            k: contact[k]
            for k in ("phone_number", "first_name", "last_name", "user_id", "vcard")
            if k in contact
        }
        found.append(Attachment(kind="contact", name=display_name(contact) or None, meta=meta))
    return tuple(found)


def _with_links(text: str, entities: Any) -> str:
    """`text` with each hidden link spelled out after its words: "the docs (https://…)".

    Formatting entities are dropped, but a `text_link` is the only place its URL is written;
    without it the agent reads "the docs" and never sees where they are (Slack's links read the
    same way). Offsets count UTF-16 units, as Telegram counts them; an entity that does not fit
    the text leaves it as it is.
    """
    if not isinstance(entities, list):
        return text
    data = text.encode("utf-16-le")
    links: list[tuple[int, int, str]] = []
    for entity in entities:
        if not isinstance(entity, Mapping) or entity.get("type") != "text_link":
            continue
        offset, length, url = entity.get("offset"), entity.get("length"), entity.get("url")
        if isinstance(offset, int) and isinstance(length, int) and isinstance(url, str) and url:
            links.append((2 * offset, 2 * (offset + length), url))
    if not links:
        return text
    pieces: list[str] = []
    done = 0
    try:
        for start, end, url in sorted(links, key=lambda link: link[1]):
            if not 0 <= start <= end <= len(data) or end < done:
                return text
            pieces.append(data[done:end].decode("utf-16-le"))
            if data[start:end].decode("utf-16-le").strip() != url:
                pieces.append(f" ({url})")
            done = end
        pieces.append(data[done:].decode("utf-16-le"))
    except UnicodeDecodeError:  # an offset inside a surrogate pair: not Telegram's
        return text
    return "".join(pieces)


def _reply_to(message: Mapping[str, Any]) -> ReplyTo | None:
    replied = message.get("reply_to_message")
    if not isinstance(replied, Mapping):
        return None
    # Telegram makes every topic message a "reply" to the topic's creation; that is no reply.
    if "forum_topic_created" in replied:
        return None
    chat_id = str((replied.get("chat") or message.get("chat") or {}).get("id"))
    quote = (message.get("quote") or {}).get("text")
    sender = replied.get("sender_chat") or replied.get("from")
    return ReplyTo(
        message_id=native_id(chat_id, replied.get("message_id", 0)),
        content=quote or replied.get("text") or replied.get("caption"),
        sender_name=display_name(sender) or None,
    )


def _from_bot_itself(message: Mapping[str, Any], bot_id: int | None) -> bool:
    if bot_id is None:
        return False
    sender = message.get("from") or {}
    via = message.get("via_bot") or {}
    return sender.get("id") == bot_id or via.get("id") == bot_id


def _decode_message(
    message: Mapping[str, Any], *, edited: bool, connection_id: str, raw: Any
) -> NormalizedMessage | None:
    chat = message.get("chat") or {}
    chat_id = chat.get("id")
    message_id = message.get("message_id")
    if chat_id is None or message_id is None:
        return None
    if message.get("text"):
        text = _with_links(str(message["text"]), message.get("entities"))
    else:
        text = _with_links(str(message.get("caption") or ""), message.get("caption_entities"))
    if edited and isinstance(message.get("location"), Mapping):
        return None  # a live location's move (`kinds.skipped`)
    text = text or text_form(message)
    attachments = _attachments(message)
    if not text and not attachments:
        return None  # service messages (joins, pins, topic changes …), and `kinds.SKIPPED`
    # On behalf of a chat (a channel, a group's anonymous admin), `from` is a placeholder user
    # Telegram shares among all such chats: the sender is the chat, and trust is the chat's.
    sender = message.get("sender_chat") or message.get("from") or chat
    is_private = chat.get("type", "private") == "private"
    thread_id, thread_name = _thread(message)
    base_id = native_id(chat_id, message_id)
    edit_date = message.get("edit_date")
    name = display_name(sender)
    if message.get("author_signature") and not message.get("from"):
        name = str(message["author_signature"])
    return NormalizedMessage(
        id=f"{base_id}:edit:{edit_date or 0}" if edited else base_id,
        connection_id=connection_id,
        channel="telegram",
        channel_user_id=str(sender.get("id", chat_id)),
        display_name=name,
        thread_id=thread_id,
        thread_name=None if is_private else thread_name,
        thread_type="private" if is_private else "group",
        timestamp=_timestamp(edit_date if edited and edit_date else message.get("date")),
        text=text,
        attachments=attachments,
        reply_to=_reply_to(message),
        edit_of=base_id if edited else None,
        raw_event=raw,
    )


def _decode_callback(
    query: Mapping[str, Any], *, connection_id: str, raw: Any
) -> NormalizedMessage | None:
    sender = query.get("from") or {}
    message = query.get("message") or {}
    chat = message.get("chat") or {}
    if not query.get("id") or "id" not in sender:
        return None
    if chat.get("id") is not None:
        thread_id, thread_name = _thread(message)
        private = chat.get("type", "private") == "private"
    else:  # a button on an inline-mode message: answer the user privately
        thread_id, thread_name, private = str(sender["id"]), None, True
    reply = None
    if chat.get("id") is not None and message.get("message_id") is not None:
        reply = ReplyTo(
            message_id=native_id(chat["id"], message["message_id"]),
            content=message.get("text") or message.get("caption"),
            sender_name=display_name(message.get("from")) or None,
        )
    return NormalizedMessage(
        id=f"cb:{query['id']}",
        connection_id=connection_id,
        channel="telegram",
        channel_user_id=str(sender["id"]),
        display_name=display_name(sender),
        thread_id=thread_id,
        thread_name=None if private else thread_name,
        thread_type="private" if private else "group",
        timestamp=_timestamp(message.get("date")) if message.get("date") else datetime.now(UTC),
        text=str(query.get("data") or query.get("game_short_name") or ""),
        reply_to=reply,
        raw_event=raw,
    )


def migration(update: Mapping[str, Any] | Any) -> tuple[int, int] | None:
    """(old chat id, new one) when `update` is the service message of a group's upgrade to a
    supergroup: `migrate_to_chat_id` in the old group, `migrate_from_chat_id` in the new."""
    message = update_to_dict(update).get("message")
    if not isinstance(message, Mapping):
        return None
    chat_id = (message.get("chat") or {}).get("id")
    to, since = message.get("migrate_to_chat_id"), message.get("migrate_from_chat_id")
    if isinstance(chat_id, int) and isinstance(to, int):
        return chat_id, to
    if isinstance(chat_id, int) and isinstance(since, int):
        return since, chat_id
    return None


def skipped_kind(
    update: Mapping[str, Any] | Any, *, bot_id: int | None = None
) -> tuple[str, str] | None:
    """(kind, why) when `update` is someone's message that `decode_update` does not deliver
    (`kinds.SKIPPED`, a live location's move); None otherwise."""
    data = update_to_dict(update)
    for kind in MESSAGE_KINDS:
        message = data.get(kind)
        if isinstance(message, Mapping) and not _from_bot_itself(message, bot_id):
            return skipped(message, edited=kind.startswith("edited_"))
    return None


def decode_update(
    update: Mapping[str, Any] | Any, *, connection_id: str, bot_id: int | None = None
) -> NormalizedMessage | None:
    """One Update -> one message, or None for what the bridge does not handle.

    None for: the bot's own messages (echo loops), service messages with no content, and
    update kinds other than messages, channel posts, their edits and callback queries.
    """
    data = update_to_dict(update)
    for kind in MESSAGE_KINDS:
        message = data.get(kind)
        if isinstance(message, Mapping):
            if _from_bot_itself(message, bot_id):
                return None
            return _decode_message(
                message,
                edited=kind.startswith("edited_"),
                connection_id=connection_id,
                raw=update,
            )
    query = data.get("callback_query")
    if isinstance(query, Mapping):
        return _decode_callback(query, connection_id=connection_id, raw=update)
    return None


# ---- albums -----------------------------------------------------------------------------------
# An album (media group) arrives as one update per item, sharing a `media_group_id`; collecting
# them is the transport's (`talkbridge.connectors.telegram.albums`), combining them is here.

_NEW_KINDS = ("message", "channel_post")
"""The update kinds that bring a new message; their edits are `edited_` + the kind."""


ALBUM_MAX = 10
"""Items in one album (`sendMediaGroup` sends 2 to 10)."""


class AlbumKey(NamedTuple):
    """One album: a `media_group_id` names it within its chat."""

    chat_id: str
    media_group_id: str


def album_item(
    update: Mapping[str, Any] | Any, *, bot_id: int | None = None
) -> tuple[AlbumKey, str] | None:
    """A new message that is one item of an album: its album and its native id.

    None for anything else, an edit of an item included (it changes a message already
    delivered; nothing waits for it), and for the bot's own albums (never delivered)."""
    data = update_to_dict(update)
    for kind in _NEW_KINDS:
        message = data.get(kind)
        if not isinstance(message, Mapping):
            continue
        group = message.get("media_group_id")
        chat = message.get("chat")
        message_id = message.get("message_id")
        if (
            not group
            or not isinstance(chat, Mapping)
            or chat.get("id") is None
            or not isinstance(message_id, int)
            or _from_bot_itself(message, bot_id)
        ):
            return None
        return AlbumKey(str(chat["id"]), str(group)), native_id(chat["id"], message_id)
    return None


def edited_item(update: Mapping[str, Any] | Any) -> dict[str, Any] | None:
    """An edit of an album's item, in the shape of the item's own update (`edited_message`
    read as `message`), so the album can be decoded again with the item as it now is; None
    when the update is not such an edit."""
    data = update_to_dict(update)
    for kind in _NEW_KINDS:
        message = data.get(f"edited_{kind}")
        if isinstance(message, Mapping) and message.get("media_group_id"):
            return {"update_id": data.get("update_id"), kind: dict(message)}
    return None


def update_chat(update: Mapping[str, Any] | Any) -> str | None:
    """The chat an update belongs to (a button click: the chat of its message), if any."""
    data = update_to_dict(update)
    message = next((data[k] for k in MESSAGE_KINDS if isinstance(data.get(k), Mapping)), None)
    if message is None and isinstance(data.get("callback_query"), Mapping):
        message = data["callback_query"].get("message")
    chat = message.get("chat") if isinstance(message, Mapping) else None
    chat_id = chat.get("id") if isinstance(chat, Mapping) else None
    return None if chat_id is None else str(chat_id)


def merge_album(items: Sequence[NormalizedMessage]) -> NormalizedMessage:
    """The decoded items of one album as one message, so the agent answers it once.

    It takes the first item's id (what a reply quotes, and an edit of it names), every item's
    attachments in order, and the caption as its text; items with captions of their own (a
    documents album) give one paragraph each.
    """
    if not items:
        raise ValueError("an album needs at least one item")
    ordered = sorted(items, key=lambda m: parse_native_id(m.id)[1])
    first = ordered[0]
    if len(ordered) == 1:
        return first
    return first.model_copy(
        update={
            "text": "\n\n".join(m.text for m in ordered if m.text),
            "attachments": tuple(a for m in ordered for a in m.attachments),
            "reply_to": next((m.reply_to for m in ordered if m.reply_to), None),
            "raw_event": tuple(m.raw_event for m in ordered),
        }
    )


def album_edit(album: NormalizedMessage, edit: NormalizedMessage) -> NormalizedMessage:
    """`edit` of one item as an edit of the whole `album` (decoded with the edited item): the
    bridge then updates its one answer to the album, and the agent reads all of it again."""
    return album.model_copy(
        update={
            "id": edit.id,
            "edit_of": album.id,
            "timestamp": edit.timestamp,
            "raw_event": edit.raw_event,
        }
    )


# ---- outbound ---------------------------------------------------------------------------------

_CALLBACK_DATA_LIMIT = 64


def inline_keyboard(
    buttons: Sequence[tuple[str, str]], per_row: int = 1
) -> list[list[dict[str, str]]]:
    """Bot API `inline_keyboard` rows for (label, value) buttons; values ride as callback_data."""
    rows: list[list[dict[str, str]]] = []
    for label, value in buttons:
        if not label:
            raise ValueError("a button needs a label")
        if not 1 <= len(value.encode()) <= _CALLBACK_DATA_LIMIT:
            raise ValueError(
                f"button value for {label!r} must be 1-{_CALLBACK_DATA_LIMIT} bytes "
                "(Telegram's callback_data limit)"
            )
        button = {"text": label, "callback_data": value}
        if rows and len(rows[-1]) < per_row:
            rows[-1].append(button)
        else:
            rows.append([button])
    return rows
