"""What a Slack message shows beyond its `text`: legacy attachments and Block Kit; pure.

A forwarded or shared message arrives with an empty `text` (or the sharer's comment) and the
shared message in an attachment (`is_share`, `is_msg_unfurl`); apps and integrations may post
only `attachments` or only `blocks`. Read as plain text, so an agent sees what a person sees.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from talkbridge.connectors.slack.mrkdwn import mentioned_channels, mentioned_users, plain_text

Readable = Callable[[str], str]
"""Slack markup (`<@U1>`, `<url|label>`, `*bold*`) -> plain text, names resolved."""


@dataclass(frozen=True, slots=True)
class Names:
    """The names known for the ids a message shows: a Block Kit mention carries only the id."""

    users: Mapping[str, str]
    channels: Mapping[str, str]


def _mappings(value: Any) -> Iterable[Mapping[str, Any]]:
    return (item for item in value if isinstance(item, Mapping)) if isinstance(value, list) else ()


def _quoted(text: str) -> str:
    return "\n".join(f"> {line}" if line else ">" for line in text.splitlines())


def is_shared(attachment: Mapping[str, Any]) -> bool:
    """A message shared or forwarded into this one (not a link preview or an app's card)."""
    return bool(attachment.get("is_share") or attachment.get("is_msg_unfurl"))


def _shared(attachment: Mapping[str, Any], readable: Readable, names: Names) -> str:
    author_id = str(attachment.get("author_id") or "")
    author = (
        attachment.get("author_name")
        or attachment.get("author_subname")
        or names.users.get(author_id)
        or author_id
    )
    body = readable(str(attachment.get("text") or "")) or blocks_text(
        [b.get("message", {}).get("blocks") for b in _mappings(attachment.get("message_blocks"))],
        readable,
        names,
    )
    body = body or readable(str(attachment.get("fallback") or ""))
    if not body:
        return ""
    return f"Shared message from {author}:\n{_quoted(body)}" if author else _quoted(body)


def _card(attachment: Mapping[str, Any], readable: Readable) -> str:
    parts = [readable(str(attachment.get(k) or "")) for k in ("pretext", "title", "text")]
    for field in _mappings(attachment.get("fields")):
        title, value = readable(str(field.get("title") or "")), readable(str(field.get("value")))
        parts.append(f"{title}: {value}" if title else value)
    shown = [p for p in parts if p]
    if not shown:
        shown = [readable(str(attachment.get("fallback") or ""))]
    return "\n".join(p for p in shown if p)


def attachments_text(
    message: Mapping[str, Any], readable: Readable, names: Names, *, cards: bool
) -> str:
    """The shared messages among the attachments; with `cards`, the other attachments too."""
    found = []
    for attachment in _mappings(message.get("attachments")):
        if is_shared(attachment):
            found.append(_shared(attachment, readable, names))
        elif cards:
            found.append(_card(attachment, readable))
    return "\n\n".join(part for part in found if part)


def _inline(element: Mapping[str, Any], names: Names) -> str:
    kind = element.get("type")
    if kind == "text":
        return str(element.get("text") or "")
    if kind == "link":
        url, label = str(element.get("url") or ""), str(element.get("text") or "")
        return f"{label} ({url})" if label and label != url else url
    if kind == "user":
        uid = str(element.get("user_id") or "")
        return "@" + (names.users.get(uid) or uid)
    if kind == "channel":
        cid = str(element.get("channel_id") or "")
        return "#" + (names.channels.get(cid) or cid)
    if kind == "emoji":
        return _unicode(str(element.get("unicode") or "")) or f":{element.get('name')}:"
    if kind == "broadcast":
        return "@" + str(element.get("range") or "")
    if kind == "date":
        return str(element.get("fallback") or "")
    return ""


def _unicode(code: str) -> str:
    """`1f44d` (or `1f469-200d-1f4bb`) -> the character(s); "" if unreadable."""
    try:
        return "".join(chr(int(part, 16)) for part in code.split("-"))
    except ValueError:
        return ""


def _rich(element: Mapping[str, Any], names: Names) -> str:
    kind = element.get("type")
    inner = _mappings(element.get("elements"))
    if kind == "rich_text_list":
        return "\n".join(f"- {_rich(item, names)}" for item in inner)
    text = "".join(
        _rich(e, names) if str(e.get("type", "")).startswith("rich_text_") else _inline(e, names)
        for e in inner
    )
    return _quoted(text) if kind == "rich_text_quote" else text


def blocks_text(blocks: Iterable[Any], readable: Readable, names: Names) -> str:
    """The text of Block Kit blocks (`blocks` may nest lists of them), in order."""
    found: list[str] = []
    for block in blocks:
        if isinstance(block, list):
            found.append(blocks_text(block, readable, names))
            continue
        if not isinstance(block, Mapping):
            continue
        kind = block.get("type")
        if kind == "rich_text":
            found.append("\n".join(_rich(e, names) for e in _mappings(block.get("elements"))))
        elif kind == "markdown":  # standard Markdown as the app wrote it
            found.append(str(block.get("text") or ""))
        elif kind in ("section", "header"):
            text = block.get("text")
            found.append(readable(str(text.get("text") or "")) if isinstance(text, Mapping) else "")
            found.extend(readable(str(f.get("text") or "")) for f in _mappings(block.get("fields")))
        elif kind == "context":
            found.extend(
                readable(str(e.get("text") or "")) for e in _mappings(block.get("elements"))
            )
    return "\n".join(part for part in found if part.strip())


def _shown(
    message: Mapping[str, Any], kind: str, key: str, in_text: Callable[[str], list[str]]
) -> set[str]:
    """The ids of `kind` mentions (`user`, `channel`) the blocks and attachments name."""
    found: set[str] = set()

    def walk(value: Any) -> None:
        if isinstance(value, list):
            for item in value:
                walk(item)
        elif isinstance(value, Mapping):
            if value.get("type") == kind and isinstance(value.get(key), str):
                found.add(value[key])
            walk(value.get("elements"))

    walk(message.get("blocks"))
    for attachment in _mappings(message.get("attachments")):
        found.update(in_text(str(attachment.get("text") or "")))
        for shared in _mappings(attachment.get("message_blocks")):
            walk((shared.get("message") or {}).get("blocks"))
    return found


def users_shown(message: Mapping[str, Any]) -> set[str]:
    """User ids the blocks and attachments name, whose display names `shown_text` would like."""
    found = _shown(message, "user", "user_id", mentioned_users)
    for attachment in _mappings(message.get("attachments")):
        if is_shared(attachment) and not attachment.get("author_name"):
            found.add(str(attachment.get("author_id") or ""))
    found.discard("")
    return found


def channels_shown(message: Mapping[str, Any]) -> set[str]:
    """Channel ids the blocks and attachments mention, whose names `shown_text` would like."""
    found = _shown(message, "channel", "channel_id", mentioned_channels)
    found.discard("")
    return found


def shown_text(
    message: Mapping[str, Any],
    users: Mapping[str, str],
    channels: Mapping[str, str],
) -> str:
    """The message as a person reads it: its text, then what it shares; when it has no text,
    its blocks or attachments stand in (an app's post)."""

    def readable(value: str) -> str:
        return plain_text(value, users, channels).strip()

    names = Names(users, channels)
    text = plain_text(str(message.get("text") or ""), users, channels)
    if not text.strip():
        text = blocks_text(message.get("blocks") or (), readable, names)
    shared = attachments_text(message, readable, names, cards=not text.strip())
    return "\n\n".join(part for part in (text, shared) if part.strip())
