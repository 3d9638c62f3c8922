"""Cutting rendered text into messages a platform takes: each piece within its limit, and each
showing what the whole showed.

Pure functions, shared by the Telegram, Slack and Discord splitters. Each turns its rendered
text into atoms: a user-visible character (a grapheme: an emoji with its skin tone or a ZWJ
family is one), an escape or an entity, a link, or a mark that opens or closes a span (bold,
inline code, a code block, an HTML tag). `split` cuts only between atoms, at the best break
that fits, and writes every span open at a cut twice: closed at the end of one piece, opened
again at the start of the next, so neither half shows a stray `*`.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal, NamedTuple

Kind = Literal["text", "open", "close"]


@dataclass(frozen=True, slots=True)
class Atom:
    """One piece of rendered text a cut never goes through."""

    text: str
    """As written."""
    cost: int
    """What the platform counts for it."""
    kind: Kind = "text"
    visible: str = ""
    """What it shows: breaks are found in it, and a piece showing nothing is not sent."""
    closer: str = ""
    """An opening mark: what closes its span at a cut."""
    reopen: str = ""
    """An opening mark: what opens its span again after a cut."""
    inline: bool = True
    """An opening mark: an inline span (bold, a link), before which a cut is preferred, rather
    than a block (code) that is simply continued."""
    trim: str = ""
    """An opening mark: whitespace that must not touch `closer` or `reopen` (`*bold *` is not
    bold); at a cut it moves outside the marks."""
    parts: tuple[Atom, ...] = ()
    """A text atom too long for a piece of its own (a huge link) is cut into these instead."""


class Piece(NamedTuple):
    text: str
    visible: str


def split(atoms: Sequence[Atom], limit: int, mark_cost: Callable[[str], int]) -> list[Piece]:
    """Pieces of at most `limit` (atom costs plus `mark_cost` of the marks a cut adds).

    Cuts at a paragraph, then a line, sentence or word end, the first that keeps the piece at
    least half full (among equal breaks, one outside inline spans if it does too), else as far
    as the piece goes, between any two atoms: a run with no break longer than a piece is cut
    anyway, so it starts here rather than in a piece of its own. A mark too long for any piece
    (a fence line of thousands of `~`) is taken as text; ValueError only if `limit` cannot hold
    a single character.
    """
    queue = list(atoms)
    pieces: list[Piece] = []
    start = 0
    stack: tuple[Atom, ...] = ()
    while start < len(queue):
        cut = _next_cut(queue, start, stack, limit, mark_cost)
        if cut is None:
            _loosen(queue, start, limit, mark_cost)
            continue
        end, after = _absorb_closes(queue, cut.end, list(cut.stack), mark_cost)
        pieces.append(_write(stack, queue[start:end], after))
        start, stack = end, tuple(after)
    return pieces


def _loosen(atoms: list[Atom], start: int, limit: int, mark_cost: Callable[[str], int]) -> None:
    """Cut up the atom at `start`, which does not fit in a piece: into its parts, or, for a mark,
    it (and the mark closing it) into characters of text."""
    atom = atoms[start]
    if atom.parts:
        atoms[start : start + 1] = atom.parts
        return
    if atom.kind == "text" or len(atom.text) < 2:
        raise ValueError(f"the limit of {limit} cannot hold {atom.text[:40]!r}")
    depth = 0
    for index in range(start + 1, len(atoms) if atom.kind == "open" else start):
        depth += {"open": 1, "close": -1}.get(atoms[index].kind, 0)
        if depth < 0:
            atoms[index : index + 1] = _characters(atoms[index].text, mark_cost)
            break
    atoms[start : start + 1] = _characters(atom.text, mark_cost)


def _characters(text: str, measure: Callable[[str], int]) -> list[Atom]:
    return [Atom(c, measure(c), visible=c) for c in text]


# ---- finding the cut -------------------------------------------------------------------------

_PARAGRAPH, _LINE, _SENTENCE, _WORD = range(4)


def _break_class(tail: str) -> int | None:
    """Classify a cut right after the visible text ending in `tail` (its last two characters)."""
    if tail.endswith("\n\n"):
        return _PARAGRAPH
    if tail.endswith("\n"):
        return _LINE
    if len(tail) == 2 and tail[1].isspace() and tail[0] in ".!?…;:":
        return _SENTENCE
    if tail[-1:].isspace():
        return _WORD
    return None


class _Cut(NamedTuple):
    end: int
    size: int
    stack: tuple[Atom, ...]


@dataclass(slots=True)
class _Scan:
    """Where a piece could end, found walking forward from its start."""

    best: dict[int, _Cut]
    outside: dict[int, _Cut]  # the same, with no inline span open
    last: _Cut | None = None  # the furthest cut that fits, whatever the break
    fallback: _Cut | None = None  # the same, even one leaving a span empty


def _next_cut(
    atoms: Sequence[Atom],
    start: int,
    stack: tuple[Atom, ...],
    limit: int,
    mark_cost: Callable[[str], int],
) -> _Cut | None:
    scan = _walk(atoms, start, stack, limit, mark_cost)
    if scan.last is not None and scan.last.end == len(atoms):
        return scan.last  # the rest fits
    for cls in (_PARAGRAPH, _LINE, _SENTENCE, _WORD):
        for cut in (scan.outside.get(cls), scan.best.get(cls)):
            if cut is not None and cut.size * 2 >= limit:
                return cut
    return scan.last or scan.fallback


def _walk(
    atoms: Sequence[Atom],
    start: int,
    stack: tuple[Atom, ...],
    limit: int,
    mark_cost: Callable[[str], int],
) -> _Scan:
    scan = _Scan({}, {})
    local = list(stack)
    size = sum(mark_cost(atom.reopen) for atom in local)
    closing = sum(mark_cost(atom.closer) for atom in local)
    tail = ""
    bare = False  # a span opened in this piece shows nothing yet: a cut here would leave it empty
    frozen, inline = tuple(local), any(atom.inline for atom in local)
    end = start
    while end < len(atoms) and size + atoms[end].cost <= limit:
        atom = atoms[end]
        size += atom.cost
        end += 1
        if atom.kind != "text":
            if atom.kind == "open":
                local.append(atom)
                closing += mark_cost(atom.closer)
            elif local:
                closing -= mark_cost(local.pop().closer)
            frozen, inline = tuple(local), any(open_.inline for open_ in local)
            bare = atom.kind == "open" or bare
            if atom.kind == "open":
                continue
        tail = (tail + atom.visible)[-2:]
        bare = bare and not atom.visible.strip()
        if size + closing > limit:
            continue
        cut = _Cut(end, size, frozen)
        scan.fallback = cut
        if bare:
            continue
        scan.last = cut
        cls = _break_class(tail)
        if cls is not None:
            scan.best[cls] = cut
            if not inline:
                scan.outside[cls] = cut
    if end == len(atoms) and end > start and size + closing <= limit:
        scan.last = _Cut(end, size, frozen)  # the rest fits, however it ends
    return scan


def _absorb_closes(
    atoms: Sequence[Atom], end: int, stack: list[Atom], mark_cost: Callable[[str], int]
) -> tuple[int, list[Atom]]:
    """Closing marks right after a cut end this piece: their room is already kept for `closer`."""
    while (
        end < len(atoms)
        and atoms[end].kind == "close"
        and stack
        and atoms[end].cost <= mark_cost(stack[-1].closer)
    ):
        stack.pop()
        end += 1
    return end, stack


def _write(opened: Sequence[Atom], body: Sequence[Atom], still_open: Sequence[Atom]) -> Piece:
    text = "".join(atom.text for atom in body)
    if opened:
        lead = text[: len(text) - len(text.lstrip(opened[-1].trim))]
        text = lead + "".join(atom.reopen for atom in opened) + text[len(lead) :]
    if still_open:
        kept = text.rstrip(still_open[-1].trim)
        closers = "".join(atom.closer for atom in reversed(still_open))
        text = kept + closers + text[len(kept) :]
    return Piece(text, "".join(atom.visible for atom in body))


# ---- quoted lines ----------------------------------------------------------------------------

QUOTE = "> "


def quoted_lines(
    atoms: Sequence[Atom], measure: Callable[[str], int], *, rest: str | None = None
) -> list[Atom]:
    """`atoms` with each line that starts with `> ` made a span (Slack's and Discord's quote of
    one line): a cut inside it starts the next piece with `> ` again, where the rest of the
    line showed unquoted, as if the bot said it. A line that a span crosses (bold over two
    lines, a code block) stays as it is: spans must nest. `rest`: a mark that quotes all that
    follows it (Discord's `>>> `), made a span to the end the same way."""
    out: list[Atom] = []
    lines = _lines(atoms)
    for index, (line, quoted) in enumerate(lines):
        if rest is not None and _starts(line, rest):
            after = [atom for later, _ in lines[index + 1 :] for atom in later]
            out.extend([_quote_mark(rest, measure), *line[len(rest) :], *after, _QUOTE_END])
            break
        if quoted:
            body, newline = (line[2:-1], line[-1:]) if _is_newline(line[-1]) else (line[2:], [])
            out.extend([_quote_mark(QUOTE, measure), *body, _QUOTE_END, *newline])
        else:
            out.extend(line)
    return out


def _quote_mark(mark: str, measure: Callable[[str], int]) -> Atom:
    return Atom(mark, measure(mark), "open", reopen=mark, inline=False)


_QUOTE_END = Atom("", 0, "close")


def _lines(atoms: Sequence[Atom]) -> list[tuple[list[Atom], bool]]:
    """The atoms line by line, each with its newline (a newline inside a span ends no line),
    and whether the line is a quote that no span crosses."""
    lines: list[tuple[list[Atom], bool]] = []
    line: list[Atom] = []
    depth, crossed = 0, False
    for atom in atoms:
        line.append(atom)
        depth += {"open": 1, "close": -1}.get(atom.kind, 0)
        if _is_newline(atom):
            if depth == 0:
                lines.append((line, _quote_at(line) and not crossed))
                line, crossed = [], False
            else:
                crossed = True
    if line:
        lines.append((line, _quote_at(line) and not crossed and depth == 0))
    return lines


def _is_newline(atom: Atom) -> bool:
    return atom.kind == "text" and atom.text == "\n"


def _quote_at(line: Sequence[Atom]) -> bool:
    return len(line) > 2 and _starts(line, QUOTE)


def _starts(line: Sequence[Atom], mark: str) -> bool:
    """Whether the line starts with `mark`, written as text (a character an atom)."""
    return len(line) > len(mark) and all(
        atom.kind == "text" and atom.text == char
        for atom, char in zip(line[: len(mark)], mark, strict=True)
    )


# ---- graphemes -------------------------------------------------------------------------------

_ZWJ = 0x200D


def graphemes(text: str) -> list[str]:
    """User-perceived characters, close to Unicode's extended grapheme clusters (UAX #29):
    combining marks, variation selectors, skin tones and tags stay with their base, ZWJ
    sequences and flag pairs stay whole, CR LF is one, Hangul jamo join into syllables."""
    if text.isascii() and "\r" not in text:
        return list(text)
    clusters: list[str] = []
    regional = 0  # regional indicators in a row so far
    previous = -1
    for char in text:
        cp = ord(char)
        if clusters and _joins(previous, cp, regional):
            clusters[-1] += char
        else:
            clusters.append(char)
        regional = regional + 1 if 0x1F1E6 <= cp <= 0x1F1FF else 0
        previous = cp
    return clusters


def _joins(previous: int, cp: int, regional: int) -> bool:
    if cp < 0x300:  # nothing below U+0300 extends a cluster; only CR LF and a ZWJ'd © ® join
        return (previous == 0x0D and cp == 0x0A) or (previous == _ZWJ and cp in (0xA9, 0xAE))
    if _control(previous) or _control(cp):
        return False
    if _extends(cp) or cp == _ZWJ:
        return True
    if previous == _ZWJ:
        return cp >= 0x2000  # an emoji ZWJ sequence (an approximation of "pictographic")
    if 0x1F1E6 <= cp <= 0x1F1FF:
        return regional % 2 == 1  # flags are pairs
    return _hangul_joins(_hangul(previous), _hangul(cp))


def _extends(cp: int) -> bool:
    if 0x1F3FB <= cp <= 0x1F3FF or 0xE0020 <= cp <= 0xE007F or cp in (0x200C, 0xFF9E, 0xFF9F):
        return True  # skin tones, tag characters, ZWNJ, half-width sound marks
    return unicodedata.category(chr(cp)) in ("Mn", "Me", "Mc")


def _control(cp: int) -> bool:
    if cp < 0 or cp in (0x200C, _ZWJ) or 0xE0020 <= cp <= 0xE007F:
        return False
    return unicodedata.category(chr(cp)) in ("Cc", "Zl", "Zp", "Cf")


def _hangul(cp: int) -> str:
    if 0x1100 <= cp <= 0x115F or 0xA960 <= cp <= 0xA97C:
        return "L"
    if 0x1160 <= cp <= 0x11A7 or 0xD7B0 <= cp <= 0xD7C6:
        return "V"
    if 0x11A8 <= cp <= 0x11FF or 0xD7CB <= cp <= 0xD7FB:
        return "T"
    if 0xAC00 <= cp <= 0xD7A3:
        return "LV" if (cp - 0xAC00) % 28 == 0 else "LVT"
    return ""


def _hangul_joins(previous: str, current: str) -> bool:
    if previous == "L":
        return current in ("L", "V", "LV", "LVT")
    if previous in ("LV", "V"):
        return current in ("V", "T")
    return previous in ("LVT", "T") and current == "T"


def text_atoms(text: str, measure: Callable[[str], int]) -> list[Atom]:
    """One text atom per grapheme; one longer than a whole piece (a letter under hundreds of
    combining marks) may still be cut between its code points."""
    return [_grapheme(g, measure) for g in graphemes(text)]


@lru_cache(maxsize=4096)
def _grapheme(cluster: str, measure: Callable[[str], int]) -> Atom:
    parts = tuple(Atom(c, measure(c), visible=c) for c in cluster) if len(cluster) > 1 else ()
    return Atom(cluster, measure(cluster), visible=cluster, parts=parts)
