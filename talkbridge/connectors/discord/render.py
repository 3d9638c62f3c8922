"""Outbound text for Discord: escaping plain text, and splitting at the 2,000-character limit.

Pure functions. Discord renders Markdown itself, so Markdown passes through; plain text is
escaped so it shows literally. Splitting works on lines (a blank line is preferred when it keeps
the chunk at least half full) and keeps code fences balanced: a fence open at a cut is closed at
the end of the chunk and reopened, with its language, at the start of the next, so every chunk
renders on its own. A single line longer than a chunk is cut at a space, else anywhere.
"""

from __future__ import annotations

import re
from typing import Literal

DISCORD_TEXT_LIMIT = 2000

_SPECIAL = re.compile(r"([\\*_~`|>#\[\]-])")
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")

Entry = tuple[str, str | None, bool]
"""A line, the fence line still open after it (None outside code), and whether it continues
the previous entry (a piece of a line too long for one chunk) rather than starting a line."""


def length(text: str) -> int:
    """Length as Discord's client counts it (UTF-16 code units): the safe side."""
    return len(text) + sum(1 for ch in text if ord(ch) > 0xFFFF)


def escape_markdown(text: str) -> str:
    """Backslash-escape Discord's Markdown so plain text shows literally."""
    return _SPECIAL.sub(r"\\\1", text)


def render(text: str, markup: Literal["plain", "markdown"]) -> str:
    return text if markup == "markdown" else escape_markdown(text)


def _marker(fence_line: str) -> str:
    match = _FENCE.match(fence_line)
    return match.group(1) if match else "```"


def _fence_after(fence: str | None, line: str) -> str | None:
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


def _hard_split(line: str, budget: int) -> list[str]:
    pieces: list[str] = []
    while length(line) > budget:
        cut = budget
        while cut > 1 and length(line[:cut]) > budget:
            cut -= 1
        space = line.rfind(" ", 0, cut)
        if space >= budget // 2:
            cut = space + 1
        pieces.append(line[:cut])
        line = line[cut:]
    pieces.append(line)
    return pieces


def _entries(text: str, limit: int) -> list[Entry]:
    fence: str | None = None
    entries: list[Entry] = []
    fences = [line for line in text.split("\n") if _FENCE.match(line)]
    overhead = 2 * (max((length(f) for f in fences), default=0) + 1)
    budget = max(limit // 2, limit - overhead)
    for line in text.split("\n"):
        fence = _fence_after(fence, line)
        pieces = _hard_split(line, budget)
        entries.extend((piece, fence, index > 0) for index, piece in enumerate(pieces))
    return entries


def _compose(entries: list[Entry], start: str | None) -> str:
    parts: list[str] = [start] if start is not None else []
    for position, (line, _, continues) in enumerate(entries):
        if continues and position > 0:
            parts[-1] += line
        else:
            parts.append(line)
    end = entries[-1][1] if entries else start
    if end is not None:
        parts.append(_marker(end))
    return "\n".join(parts)


def split_message(text: str, limit: int = DISCORD_TEXT_LIMIT) -> list[str]:
    """Chunks of at most `limit`, cut on line boundaries, each with balanced code fences."""
    if length(text) <= limit:
        return [text] if text.strip() else []
    chunks: list[str] = []

    def emit(entries: list[Entry], start: str | None) -> None:
        chunk = _compose(entries, start).strip("\n")
        visible = [ln for ln, _, _ in entries if ln.strip() and not _FENCE.match(ln)]
        if visible:
            chunks.append(chunk)

    current: list[Entry] = []
    start: str | None = None
    for entry in _entries(text, limit):
        if not current or length(_compose([*current, entry], start)) <= limit:
            current.append(entry)
            continue
        cut = len(current)
        for position in range(len(current) - 1, 0, -1):
            if not current[position][0].strip():
                if length(_compose(current[:position], start)) * 2 >= limit:
                    cut = position
                break
        emit(current[:cut], start)
        start = current[cut - 1][1]
        current = [*current[cut:], entry]
        while current and not current[0][0].strip() and current[0][1] is None:
            current.pop(0)  # a chunk does not start with blank lines
    emit(current, start)
    return chunks


def render_chunks(
    text: str, markup: Literal["plain", "markdown"], limit: int = DISCORD_TEXT_LIMIT
) -> list[str]:
    return split_message(render(text, markup), limit)
