"""Markdown -> Slack mrkdwn, splitting rendered mrkdwn, and mrkdwn -> readable plain text.

Pure functions. Slack's mrkdwn needs `&`, `<` and `>` escaped everywhere (also in code), marks
bold with `*`, italic with `_`, strike with `~`, and links as `<url|label>`. Splitting happens
after rendering (see `splitting`) and never cuts an entity, a `<…>` link or a character; a code
block, inline code or an emphasis cut in two is closed at the end of one chunk and reopened in
the next, so neither shows stray marks.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import ClassVar, Literal

from talkbridge.connectors import markdown
from talkbridge.connectors.markdown import Dialect
from talkbridge.connectors.splitting import Atom, quoted_lines, split, text_atoms

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

_CODE = re.compile(r"```")
_TOKEN = re.compile(r"&(?:amp|lt|gt);|<[^<>\n]*>")
_HIDDEN = "\x01"  # stands in for a link, an entity or code while emphasis is matched


def _length(text: str) -> int:
    """Slack counts characters (code points): its advice of 4,000 characters a message is, in
    its words, under 16 KB even when every one is a 4-byte (astral) character."""
    return len(text)


def split_mrkdwn(rendered: str, limit: int = SLACK_TEXT_LIMIT) -> list[str]:
    """Chunks of at most `limit` characters, cut at paragraph, line, sentence or word ends
    (a coarser cut only if it keeps the chunk at least half full), never inside a link, an
    entity or a character; bold, italic, strike and code open at a cut are closed at the end of
    one chunk and opened again at the start of the next."""
    if len(rendered) <= limit:
        return [rendered] if rendered else []
    if limit < 16:
        raise ValueError("limit too small to split mrkdwn safely")
    pieces = split(_atoms(rendered), limit, _length)
    return [p.text.strip() if not p.text.startswith(_FENCE) else p.text.rstrip() for p in pieces]


def _atoms(rendered: str) -> list[Atom]:
    """Code blocks (between ```), and around them text with its inline spans and quoted
    lines."""
    atoms: list[Atom] = []
    position, in_code = 0, False
    for fence in _CODE.finditer(rendered):
        between = rendered[position : fence.start()]
        atoms.extend(_literal(between) if in_code else _text(between))
        if in_code:
            atoms.append(Atom(_FENCE, 3, "close"))
        else:
            atoms.append(_open(_FENCE, closer="\n" + _FENCE, reopen=_FENCE + "\n", code=True))
        position, in_code = fence.end(), not in_code
    rest = rendered[position:]
    atoms.extend(_literal(rest) if in_code else _text(rest))
    return quoted_lines(atoms, _length)


def _open(mark: str, *, closer: str = "", reopen: str = "", code: bool = False) -> Atom:
    return Atom(
        mark,
        len(mark),
        "open",
        closer=closer or mark,
        reopen=reopen or mark,
        inline=not code,
        trim="\n" if code else " \t\n",
    )


def _literal(text: str) -> list[Atom]:
    """Code: entities and links stay whole, nothing else is markup."""
    atoms: list[Atom] = []
    position = 0
    for token in _TOKEN.finditer(text):
        atoms.extend(text_atoms(text[position : token.start()], _length))
        atoms.append(_token(token.group(0)))
        position = token.end()
    atoms.extend(text_atoms(text[position:], _length))
    return atoms


def _token(token: str) -> Atom:
    """An entity, or a link or mention, which a cut never goes through; a link too long for a
    chunk of its own is shown as its escaped text instead, cut as text."""
    if token.startswith("&"):
        return Atom(token, len(token), visible=unescape(token))
    target, _, label = token[1:-1].partition("|")
    spelled = f"{label} ({target})" if label else target
    return Atom(token, len(token), visible=token, parts=tuple(_literal(spelled)))


def _text(text: str) -> list[Atom]:
    """Text outside code blocks: inline code, and emphasis as Slack reads it (see `plain_text`),
    become spans; entities and links stay whole."""
    hidden = list(text)
    spans: dict[int, tuple[str, int]] = {}  # start -> (kind, end) of each span
    for match in [*_CODE_SPAN.finditer(text), *_TOKEN.finditer(text)]:  # code first, as Slack
        if all(c != _HIDDEN for c in hidden[match.start() : match.end()]):
            if match.group(0).startswith("`"):
                spans[match.start()] = ("code", match.end())
            hidden[match.start() : match.end()] = _HIDDEN * (match.end() - match.start())
    spans.update(_emphasis("".join(hidden)))
    return _span_atoms(text, _nested(spans))


def _emphasis(masked: str) -> dict[int, tuple[str, int]]:
    """Bold, then italic, then strike, each matched once the marks found before are taken out
    (as `plain_text` reads them), so `_~both~_` is italic around strike."""
    spans: dict[int, tuple[str, int]] = {}
    where = list(range(len(masked)))  # the position in `masked` of each character left
    for pattern in _EMPHASIS:
        marks: set[int] = set()
        for match in pattern.finditer(masked):
            spans[where[match.start()]] = ("emphasis", where[match.end() - 1] + 1)
            marks |= {match.start(), match.end() - 1}
        where = [p for i, p in enumerate(where) if i not in marks]
        masked = "".join(c for i, c in enumerate(masked) if i not in marks)
    return spans


def _nested(spans: dict[int, tuple[str, int]]) -> dict[int, tuple[str, int]]:
    """Drop spans that cross another (`*a _b* c_`): only properly nested ones are marks."""
    kept: dict[int, tuple[str, int]] = {}
    open_ends: list[int] = []
    for start in sorted(spans):
        kind, end = spans[start]
        while open_ends and open_ends[-1] <= start:
            open_ends.pop()
        if open_ends and end > open_ends[-1]:
            continue
        kept[start] = (kind, end)
        open_ends.append(end)
    return kept


def _span_atoms(text: str, spans: dict[int, tuple[str, int]]) -> list[Atom]:
    atoms: list[Atom] = []
    closes: list[int] = []  # where the open spans end, innermost last
    position = 0
    plain_from = 0

    def flush(upto: int) -> None:
        atoms.extend(_literal(text[plain_from:upto]))

    while position < len(text):
        if closes and position == closes[-1] - 1:
            flush(position)
            atoms.append(Atom(text[position], 1, "close"))
            closes.pop()
            position += 1
            plain_from = position
        elif position in spans:
            flush(position)
            kind, end = spans[position]
            if kind == "code":
                atoms.append(_open("`"))
                atoms.extend(_literal(text[position + 1 : end - 1]))
                atoms.append(Atom("`", 1, "close"))
                position = end
            else:
                atoms.append(_open(text[position]))
                closes.append(end)
                position += 1
            plain_from = position
        else:
            position += 1
    flush(len(text))
    return atoms


def render_chunks(
    text: str, markup: Literal["plain", "markdown"], limit: int = SLACK_TEXT_LIMIT
) -> list[str]:
    """Render, then split; chunks with nothing visible are dropped."""
    return [c for c in split_mrkdwn(render(text, markup), limit) if plain_text(c).strip()]


# ---- mrkdwn -> readable text ------------------------------------------------------------------

_ANGLE = re.compile(r"<([^<>\n]+)>")


def _emphasis_pattern(mark: str) -> re.Pattern[str]:
    """A span of `mark`: not inside a word, but right against another mark (`_*both*_`)."""
    m = re.escape(mark)
    return re.compile(rf"(?<![^\W_])(?<!{m}){m}(?=\S)([^{m}\n]+?)(?<=\S){m}(?![^\W_])(?!{m})")


_EMPHASIS = [_emphasis_pattern("*"), _emphasis_pattern("_"), _emphasis_pattern("~")]
_CODE_BLOCK = re.compile(r"```\n?(.*?)\n?```", re.DOTALL)
_CODE_SPAN = re.compile(r"`([^`\n]+)`")
SPECIAL_MENTIONS = {"here": "@here", "channel": "@channel", "everyone": "@everyone"}

UserIds = Callable[[str], str | None]


def mentioned_users(text: str) -> list[str]:
    """User ids mentioned as `<@U…>` without a label, so a caller can resolve their names."""
    return [m.group(1) for m in re.finditer(r"<@([UW][A-Z0-9]+)>", text)]


def mentioned_channels(text: str) -> list[str]:
    """Channel ids mentioned as `<#C…>` or `<#C…|>` (Slack's usual form: the label left
    empty), so a caller can resolve their names."""
    return [m.group(1) for m in re.finditer(r"<#([CGD][A-Z0-9]+)\|?>", text)]


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
