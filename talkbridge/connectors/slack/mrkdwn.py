"""Markdown -> Slack mrkdwn, splitting rendered mrkdwn, and mrkdwn -> readable plain text.

Pure functions. Slack's mrkdwn needs `&`, `<` and `>` escaped everywhere (also in code), marks
bold with `*`, italic with `_`, strike with `~`, and links as `<url|label>`. Splitting happens
after rendering and never cuts an entity or a `<…>` link; a code block cut in two is closed at
the end of one chunk and reopened in the next.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from markdown_it import MarkdownIt
    from markdown_it.token import Token

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


@lru_cache(maxsize=1)
def _markdown() -> MarkdownIt:
    from markdown_it import MarkdownIt

    # html=False: raw HTML in the Markdown is shown as text.
    return MarkdownIt("commonmark", {"html": False}).enable("strikethrough")


_INLINE = {
    "strong_open": "*",
    "strong_close": "*",
    "em_open": "_",
    "em_close": "_",
    "s_open": "~",
    "s_close": "~",
}


def render_markdown(text: str) -> str:
    return _blocks(_markdown().parse(text), 0, None).strip("\n")


def render(text: str, markup: Literal["plain", "markdown"]) -> str:
    return render_markdown(text) if markup == "markdown" else escape(text)


def _closing(tokens: Sequence[Token], start: int) -> int:
    """Index of the token closing the block opened at `start`."""
    depth = 0
    for index in range(start, len(tokens)):
        depth += tokens[index].nesting
        if depth == 0:
            return index
    return len(tokens) - 1


def _blocks(tokens: Sequence[Token], start: int, end: int | None) -> str:
    out: list[str] = []
    lists: list[list[int]] = []
    index = start
    stop = len(tokens) if end is None else end
    while index < stop:
        token = tokens[index]
        kind = token.type
        if kind == "inline":
            out.append(_inline(token.children or []))
        elif kind == "paragraph_close":
            out.append("\n" if token.hidden else "\n\n")
        elif kind == "heading_open":
            out.append("*")
        elif kind == "heading_close":
            out.append("*\n\n")
        elif kind == "bullet_list_open":
            lists.append([])
        elif kind == "ordered_list_open":
            first = token.attrGet("start")
            lists.append([int(first) if isinstance(first, int | str) else 1])
        elif kind in ("bullet_list_close", "ordered_list_close"):
            lists.pop()
            if not lists:
                out.append("\n")
        elif kind == "list_item_open":
            indent = "    " * (len(lists) - 1)
            current = lists[-1] if lists else []
            if current:
                out.append(f"{indent}{current[0]}. ")
                current[0] += 1
            else:
                out.append(f"{indent}• ")
        elif kind == "list_item_close":
            if out and not out[-1].endswith("\n"):
                out.append("\n")
        elif kind == "blockquote_open":
            close = _closing(tokens, index)
            inner = _blocks(tokens, index + 1, close).strip("\n")
            out.append("\n".join(f"> {line}" if line else ">" for line in inner.split("\n")))
            out.append("\n\n")
            index = close
        elif kind in ("fence", "code_block"):
            code = token.content.rstrip("\n")
            if code:
                out.append(f"{_FENCE}\n{escape(code)}\n{_FENCE}\n\n")
        elif kind == "hr":
            out.append("───\n\n")
        elif kind == "html_block":
            out.append(escape(token.content))
        index += 1
    return "".join(out)


def _inline(tokens: Sequence[Token]) -> str:
    out: list[str] = []
    links: list[str | None] = []
    for token in tokens:
        kind = token.type
        if kind == "text":
            out.append(escape(token.content))
        elif kind in ("softbreak", "hardbreak"):
            out.append("\n")
        elif kind in _INLINE:
            out.append(_INLINE[kind])
        elif kind == "code_inline":
            out.append(f"`{escape(token.content)}`")
        elif kind == "link_open":
            given = str(token.attrGet("href") or "")
            safe = given.lower().startswith(_SAFE_SCHEMES) and not re.search(r"[\s<>|]", given)
            links.append(given if safe else None)
            out.append("\x00")  # where the label starts
        elif kind == "link_close":
            target = links.pop() if links else None
            mark = len(out) - 1 - out[::-1].index("\x00")
            label = "".join(out[mark + 1 :])
            del out[mark:]
            if target is None:
                out.append(label)
            elif unescape(label) in (target, target.removeprefix("mailto:")) or not label:
                out.append(f"<{target.replace('&', '&amp;')}>")
            else:
                out.append(f"<{target.replace('&', '&amp;')}|{label}>")
        elif kind == "image":
            out.append(escape(token.content or str(token.attrGet("alt") or "")))
        elif kind in ("html_inline", "html_block"):
            out.append(escape(token.content))
        elif token.children:
            out.append(_inline(token.children))
    return "".join(out)


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
