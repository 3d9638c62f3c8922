"""Markdown -> Slack mrkdwn, splitting rendered mrkdwn, and mrkdwn -> readable plain text.

Pure functions. Slack's mrkdwn needs `&`, `<` and `>` escaped everywhere (also in code), marks
bold with `*`, italic with `_`, strike with `~`, and links as `<url|label>`. Splitting happens
after rendering and never cuts an entity or a `<…>` link; a code block cut in two is closed at
the end of one chunk and reopened in the next.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import ClassVar, Literal

from talkbridge.connectors import markdown
from talkbridge.connectors.markdown import Dialect

SLACK_TEXT_LIMIT = 4000
"""Slack truncates message text beyond 40,000 characters and advises at most 4,000."""

_SAFE_SCHEMES = ("http://", "https://", "mailto:")
_FENCE = "```"


def escape(text: str) -> str:
    """Escape the three characters Slack's mrkdwn reserves."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def unescape(text: str) -> str:
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


# ---- Markdown -> mrkdwn -----------------------------------------------------------------------


class _Mrkdwn(Dialect):
    marks: ClassVar[Mapping[str, str]] = {
        "strong_open": "*",
        "strong_close": "*",
        "em_open": "_",
        "em_close": "_",
        "s_open": "~",
        "s_close": "~",
    }
    heading_marks = ("*", "*")
    list_indent = "    "
    rule = "───"
    quotes_restart_lists = True  # every quoted line starts with "> ", so lists restart there

    def escape(self, text: str) -> str:
        return escape(text)

    def code_inline(self, code: str) -> str:
        return f"`{escape(code)}`"

    def code_block(self, code: str, language: str) -> str:
        return f"{_FENCE}\n{escape(code)}\n{_FENCE}\n\n"  # mrkdwn has no code languages

    def link(self, href: str, label: str) -> str:
        safe = href.lower().startswith(_SAFE_SCHEMES) and not re.search(r"[\s<>|]", href)
        if not safe:
            return label
        target = href.replace("&", "&amp;")
        if unescape(label) in (href, href.removeprefix("mailto:")) or not label:
            return f"<{target}>"
        return f"<{target}|{label}>"

    def quote(self, inner: str, depth: int) -> str:
        lines = inner.strip("\n").split("\n")
        return "\n".join(f"> {line}" if line else ">" for line in lines) + "\n\n"


_DIALECT = _Mrkdwn()


def render_markdown(text: str) -> str:
    return markdown.render(text, _DIALECT).strip("\n")


def render(text: str, markup: Literal["plain", "markdown"]) -> str:
    return render_markdown(text) if markup == "markdown" else escape(text)


# ---- splitting --------------------------------------------------------------------------------

_ATOM = re.compile(r"&(?:amp|lt|gt);|<[^<>\n]*>|```|.", re.DOTALL)
_PARAGRAPH, _LINE, _SENTENCE, _WORD = range(4)


def _break_class(tail: str) -> int | None:
    if tail.endswith("\n\n"):
        return _PARAGRAPH
    if tail.endswith("\n"):
        return _LINE
    if len(tail) == 2 and tail[1] == " " and tail[0] in ".!?;:":
        return _SENTENCE
    if tail.endswith(" "):
        return _WORD
    return None


def split_mrkdwn(rendered: str, limit: int = SLACK_TEXT_LIMIT) -> list[str]:
    """Chunks of at most `limit` characters, cut at paragraph, line, sentence or word ends
    (a coarser cut only if it keeps the chunk at least half full)."""
    if len(rendered) <= limit:
        return [rendered] if rendered else []
    if limit < 16:
        raise ValueError("limit too small to split mrkdwn safely")
    atoms = _ATOM.findall(rendered)
    chunks: list[str] = []
    start = 0
    in_code = False
    while start < len(atoms):
        prefix = _FENCE + "\n" if in_code else ""
        budget = limit - len(prefix) - len("\n" + _FENCE)  # room to close a code block
        size = 0
        code = in_code
        tail = ""
        best: dict[int, tuple[int, bool, int]] = {}
        end = start
        while end < len(atoms) and size + len(atoms[end]) <= budget:
            atom = atoms[end]
            size += len(atom)
            end += 1
            if atom == _FENCE:
                code = not code
                continue
            tail = (tail + atom)[-2:]
            cls = _break_class(tail)
            if cls is not None:
                best[cls] = (end, code, size)
        if end == len(atoms):
            chunks.append(prefix + "".join(atoms[start:end]))
            break
        if end == start:  # one atom over budget (cannot happen with sane limits): take it
            end, code = start + 1, in_code
        else:
            for cls in (_PARAGRAPH, _LINE, _SENTENCE, _WORD):
                if cls in best and (cls == _WORD or best[cls][2] * 2 >= budget):
                    end, code, _ = best[cls]
                    break
        body = "".join(atoms[start:end])
        if code:
            body = body.rstrip("\n") + "\n" + _FENCE
        chunks.append(prefix + body)
        start, in_code = end, code
    return [chunk.strip() if not chunk.startswith(_FENCE) else chunk.rstrip() for chunk in chunks]


def render_chunks(
    text: str, markup: Literal["plain", "markdown"], limit: int = SLACK_TEXT_LIMIT
) -> list[str]:
    """Render, then split; chunks with nothing visible are dropped."""
    return [c for c in split_mrkdwn(render(text, markup), limit) if c.strip() and c != _FENCE]


# ---- mrkdwn -> readable text ------------------------------------------------------------------

_ANGLE = re.compile(r"<([^<>\n]+)>")
_EMPHASIS = [
    re.compile(r"(?<![\w*])\*(?=\S)([^*\n]+?)(?<=\S)\*(?![\w*])"),
    re.compile(r"(?<![\w_])_(?=\S)([^_\n]+?)(?<=\S)_(?![\w_])"),
    re.compile(r"(?<![\w~])~(?=\S)([^~\n]+?)(?<=\S)~(?![\w~])"),
]
_CODE_BLOCK = re.compile(r"```\n?(.*?)\n?```", re.DOTALL)
_CODE_SPAN = re.compile(r"`([^`\n]+)`")
SPECIAL_MENTIONS = {"here": "@here", "channel": "@channel", "everyone": "@everyone"}

UserIds = Callable[[str], str | None]


def mentioned_users(text: str) -> list[str]:
    """User ids mentioned as `<@U…>` without a label, so a caller can resolve their names."""
    return [m.group(1) for m in re.finditer(r"<@([UW][A-Z0-9]+)>", text)]


def _angle(body: str, users: Mapping[str, str], channels: Mapping[str, str]) -> str:
    target, _, label = body.partition("|")
    if target.startswith("@"):
        uid = target[1:]
        return "@" + (label or users.get(uid) or uid)
    if target.startswith("#"):
        cid = target[1:]
        return "#" + (label or channels.get(cid) or cid)
    if target.startswith("!"):
        name = target[1:]
        if name in SPECIAL_MENTIONS:
            return SPECIAL_MENTIONS[name]
        if label:
            return label
        return "@" + name.split("^", 1)[0]
    if target.startswith("mailto:"):
        return label or target.removeprefix("mailto:")
    if label and label != target:
        return f"{label} ({target})"
    return target


def plain_text(
    text: str,
    users: Mapping[str, str] | None = None,
    channels: Mapping[str, str] | None = None,
) -> str:
    """Readable text: mentions named, links spelled out, formatting marks and escapes removed."""
    users = users or {}
    channels = channels or {}
    keep: list[str] = []

    def stash(value: str) -> str:
        keep.append(value)
        return f"\x00{len(keep) - 1}\x00"

    # Code is literal: keep it away from the emphasis rules.
    text = _CODE_BLOCK.sub(lambda m: stash(m.group(1)), text)
    text = _CODE_SPAN.sub(lambda m: stash(m.group(1)), text)
    text = _ANGLE.sub(lambda m: stash(_angle(m.group(1), users, channels)), text)
    for pattern in _EMPHASIS:
        text = pattern.sub(r"\1", text)
    text = re.sub(r"\x00(\d+)\x00", lambda m: keep[int(m.group(1))], text)
    return unescape(text)
