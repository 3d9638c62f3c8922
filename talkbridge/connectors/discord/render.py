"""Outbound text for Discord: escaping plain text, and splitting at the 2,000-character limit.

Pure functions. Discord renders Markdown itself, so Markdown passes through; plain text is
escaped so it shows literally. Splitting (see `splitting`) reads the text as Discord does, so
that every chunk renders on its own as its part of the whole did: a code block open at a cut is
closed at the end of the chunk and reopened, with its language, at the start of the next, and
so are bold, italic, underline, strike, spoilers and inline code; an escape (`\\*`), a link, a
mention or an emoji is never cut.
"""

from __future__ import annotations

import re
from typing import Literal

from talkbridge.connectors.splitting import Atom, graphemes, quoted_lines, split, text_atoms

DISCORD_TEXT_LIMIT = 2000

_SPECIAL = re.compile(r"([\\*_~`|>#\[\]-])")
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")


def length(text: str) -> int:
    """UTF-16 code units, an emoji two: the stricter count. Discord's API is said to count code
    points (discord/discord-api-docs#1315), its client counts units; this fits both."""
    return len(text) + sum(1 for ch in text if ord(ch) > 0xFFFF)


def escape_markdown(text: str) -> str:
    """Backslash-escape Discord's Markdown so plain text shows literally."""
    return _SPECIAL.sub(r"\\\1", text)


def render(text: str, markup: Literal["plain", "markdown"]) -> str:
    return text if markup == "markdown" else escape_markdown(text)


# ---- splitting --------------------------------------------------------------------------------


def split_message(text: str, limit: int = DISCORD_TEXT_LIMIT) -> list[str]:
    """Chunks of at most `limit`, each rendering on its own as its part of the whole did.

    Cuts at a blank line, a line, a sentence or a word (a coarser cut only if it keeps the
    chunk at least half full), else between two characters, but never inside an escape
    (`\\*`), a link, a mention or a character. A code block open at a cut is closed and
    reopened with its language; bold, italic, underline, strike, spoiler and inline code are
    closed and reopened the same way."""
    if length(text) <= limit:
        return [text] if text.strip() else []
    pieces = split(quoted_lines(_atoms(text), length, rest=">>> "), limit, length)
    return [p.text.strip("\n") for p in pieces if p.visible.strip()]


def _atoms(text: str) -> list[Atom]:
    """Code blocks line by line; the text between them parsed as Discord's inline Markdown."""
    atoms: list[Atom] = []
    fence: str | None = None
    prose: list[str] = []
    lines = text.split("\n")
    for index, line in enumerate(lines):
        newline = [_char("\n")] if index < len(lines) - 1 else []
        after = _fence_after(fence, line)
        if fence is None and after is None:
            prose.append(line + "\n" * bool(newline))
            continue
        atoms.extend(_inline("".join(prose)))
        prose = []
        if fence is None:  # this line opens a block
            marker = _marker(line)
            atoms.append(_open(line, "\n" + marker, line + "\n", code=True))
        elif after is None:  # this line closes it
            atoms.append(Atom(line, length(line), "close"))
        else:
            atoms.extend(text_atoms(line, length))
        atoms.extend(newline)
        fence = after
    atoms.extend(_inline("".join(prose)))
    return atoms


def _char(text: str) -> Atom:
    return Atom(text, length(text), visible=text)


def _open(mark: str, closer: str, reopen: str, *, code: bool = False) -> Atom:
    trim = "\n" if code else " \t\n"
    return Atom(
        mark, length(mark), "open", closer=closer, reopen=reopen, inline=not code, trim=trim
    )


def _marker(fence_line: str) -> str:
    match = _FENCE.match(fence_line)
    return match.group(1) if match else "```"


def _fence_after(fence: str | None, line: str) -> str | None:
    """The fence line still open after `line` (None outside code)."""
    match = _FENCE.match(line)
    if not match:
        return fence
    if fence is None:
        return line
    opener = _marker(fence)
    marker = match.group(1)
    if marker[0] == opener[0] and len(marker) >= len(opener) and not match.group(2).strip():
        return None
    return fence


# ---- Discord's inline Markdown ----------------------------------------------------------------
# The rules of simple-markdown, which Discord's parser grew from, as Discord applies them.

_ESCAPE = re.compile(r"\\[^0-9A-Za-z\s]")
_WHOLE = re.compile(
    # a mention, an emoji, a timestamp, a command or an autolink
    r"<(?:@[!&]?\d+|#\d+|a?:\w+:\d+|t:-?\d+(?::[tTdDfFR])?|/[\w -]+:\d+|[^: >]+:/[^ >]+)>"
    r"|https?://[^\s<]+[^<.,:;\"')\]\s]"  # a bare link
    # a [masked](link), its label holding [brackets] one deep and its address (parens) once,
    # written so that no text can be matched two ways (the backtracking would never end)
    r"|\[(?:[^\[\]\\]|\\.|\[[^\[\]]*\]){0,1000}\]"
    r"\(\s*<?[^\s()<>]*(?:\([^\s()<>]*\)[^\s()<>]*)*>?(?:\s+\"[^\"]*\")?\s*\)"
)
_RULE_START = re.compile(r"[\\<\[*_~|`]|https?://")
_EM = re.compile(
    r"_((?:__|\\[\s\S]|[^\\_])+?)_\b"
    r"|\*(?=\S)((?:\*\*|\\[\s\S]|\s+(?:\\[\s\S]|[^\s*\\]|\*\*)|[^\s*\\])+?)\*(?!\*)"
)
_STRONG = re.compile(r"\*\*((?:\\[\s\S]|[^\\])+?)\*\*(?!\*)")
_UNDERLINE = re.compile(r"__((?:\\[\s\S]|[^\\])+?)__(?!_)")
_OTHER_SPANS = (re.compile(r"~~([\s\S]+?)~~(?!_)"), re.compile(r"\|\|([\s\S]+?)\|\|"))
_CODE = re.compile(r"(`+)([\s\S]*?[^`])\1(?!`)")


_DEEPEST = 8
"""Spans nested deeper than this (`*` a thousand times) are read as text."""


def _inline(text: str, start: int = 0, end: int | None = None, depth: int = 0) -> list[Atom]:
    """Atoms of `text[start:end]`: escapes, links and mentions whole, spans as open/close marks
    around their own atoms."""
    end = len(text) if end is None else end
    atoms: list[Atom] = []
    plain = position = start
    while (start_of := _RULE_START.search(text, position, end)) is not None:
        position = start_of.start()
        found = _rule_at(text, position, end, depth)
        if found is None:
            position += 1
            continue
        atoms.extend(text_atoms(text[plain:position], length))
        atoms.extend(found[0])
        plain = position = found[1]
    atoms.extend(text_atoms(text[plain:end], length))
    return atoms


def _rule_at(text: str, position: int, end: int, depth: int) -> tuple[list[Atom], int] | None:
    """What starts at `position`, in the order Discord tries its rules, with where it ends."""
    if _ESCAPE.match(text, position, end):
        escaped = graphemes(text[position + 1 : min(end, position + 33)])[0]  # all of an emoji
        token = "\\" + escaped
        return [Atom(token, length(token), visible=escaped)], position + len(token)
    if match := _WHOLE.match(text, position, end):
        return [_whole(match[0])], match.end()
    if depth >= _DEEPEST:
        return None
    if match := _emphasis(text, position, end):
        width = (len(match[0]) - len(match[match.lastindex or 1])) // 2
        return _span(text, match, width, depth), match.end()
    for pattern in _OTHER_SPANS:
        if match := pattern.match(text, position, end):
            return _span(text, match, 2, depth), match.end()
    if match := _CODE.match(text, position, end):
        return _code(match), match.end()
    return None


def _emphasis(text: str, position: int, end: int) -> re.Match[str] | None:
    """Italic, bold or underline: the longest match wins, italic before bold on a tie (so
    `***a***` is italic around bold), as simple-markdown's rule quality has it."""
    found = [
        (len(m[0]) + quality, m)
        for pattern, quality in ((_EM, 0.2), (_STRONG, 0.1), (_UNDERLINE, 0.0))
        if (m := pattern.match(text, position, end))
    ]
    return max(found, key=lambda pair: pair[0])[1] if found else None


def _span(text: str, match: re.Match[str], width: int, depth: int) -> list[Atom]:
    mark = match[0][:width]
    inner = _inline(text, match.start() + width, match.end() - width, depth + 1)
    return [_open(mark, mark, mark), *inner, Atom(mark, length(mark), "close")]


def _code(match: re.Match[str]) -> list[Atom]:
    ticks = match[1]
    content = text_atoms(match[2], length)
    return [_open(ticks, ticks, ticks), *content, Atom(ticks, length(ticks), "close")]


def _whole(token: str) -> Atom:
    """A link or mention a cut never goes through; one too long for a chunk of its own is
    shown as text (its label, then its address) and cut as text."""
    masked = re.fullmatch(r"\[(.*)\]\(\s*<?(.*?)>?\s*\)", token, re.DOTALL)
    spelled = f"{masked[1]} ({masked[2]})" if masked else token
    parts = tuple(text_atoms(spelled.strip("<>"), length))
    return Atom(token, length(token), visible=token, parts=parts)


def render_chunks(
    text: str, markup: Literal["plain", "markdown"], limit: int = DISCORD_TEXT_LIMIT
) -> list[str]:
    return split_message(render(text, markup), limit)
