"""Markdown -> Telegram HTML, and splitting rendered HTML at Telegram's 4,096 limit.

Pure functions. Splitting happens *after* rendering, so a chunk never ends inside a tag and every
chunk is valid HTML on its own: tags open at a cut are closed at the end of one chunk and reopened
at the start of the next. Lengths are counted in UTF-16 code units, as Telegram counts them, so an
astral character (emoji) is never split into half a surrogate pair.
"""

from __future__ import annotations

import html
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal

from talkbridge.connectors import markdown
from talkbridge.connectors.markdown import Dialect

TELEGRAM_TEXT_LIMIT = 4096
TELEGRAM_CAPTION_LIMIT = 1024


def utf16_len(text: str) -> int:
    """Length as Telegram counts it: characters outside the BMP take two UTF-16 units."""
    return len(text) + sum(1 for ch in text if ord(ch) > 0xFFFF)


def escape(text: str) -> str:
    return html.escape(text, quote=False)


# ---- Markdown -> HTML -------------------------------------------------------------------------

_SAFE_SCHEMES = ("http://", "https://", "tg://", "mailto:")


class _TelegramHTML(Dialect):
    marks: ClassVar[Mapping[str, str]] = {
        "strong_open": "<b>",
        "strong_close": "</b>",
        "em_open": "<i>",
        "em_close": "</i>",
        "s_open": "<s>",
        "s_close": "</s>",
    }
    heading_marks = ("<b>", "</b>")
    rule = "――――――"

    def escape(self, text: str) -> str:
        return escape(text)

    def code_inline(self, code: str) -> str:
        return f"<code>{escape(code)}</code>"

    def code_block(self, code: str, language: str) -> str:
        if language and re.fullmatch(r"[\w+#.-]+", language):
            return f'<pre><code class="language-{language}">{escape(code)}</code></pre>\n\n'
        return f"<pre>{escape(code)}</pre>\n\n"

    def link(self, href: str, label: str) -> str:
        if not href.lower().startswith(_SAFE_SCHEMES):
            return label
        return f'<a href="{html.escape(href, quote=True)}">{label}</a>'

    def quote(self, inner: str, depth: int) -> str:
        # Telegram cannot nest blockquotes: only the outermost one is a tag.
        if depth > 1:
            return inner
        inner = inner.rstrip("\n")
        return f"<blockquote>{inner}</blockquote>\n\n" if inner else "\n\n"


_DIALECT = _TelegramHTML()


def render_markdown(text: str) -> str:
    """Render Markdown to the subset of HTML Telegram accepts; everything else is escaped."""
    return markdown.render(text, _DIALECT).rstrip("\n")


def render(text: str, markup: Literal["plain", "markdown"]) -> str:
    return render_markdown(text) if markup == "markdown" else escape(text)


# ---- splitting --------------------------------------------------------------------------------

_ATOM = re.compile(
    r"(?P<tag><[^<>]+>)|(?P<entity>&(?:[A-Za-z]+|#[0-9]+|#[xX][0-9A-Fa-f]+);)|(?P<char>.)",
    re.DOTALL,
)
_TAG_NAME = re.compile(r"</?\s*([A-Za-z][A-Za-z0-9-]*)")


@dataclass(frozen=True, slots=True)
class _Atom:
    text: str
    cost: int
    kind: Literal["open", "close", "text"]
    name: str = ""
    visible: str = ""


def _atoms(rendered: str) -> list[_Atom]:
    atoms: list[_Atom] = []
    for match in _ATOM.finditer(rendered):
        piece = match.group(0)
        if match.group("tag"):
            found = _TAG_NAME.match(piece)
            name = found.group(1).lower() if found else ""
            kind: Literal["open", "close"] = "close" if piece.startswith("</") else "open"
            atoms.append(_Atom(piece, 0, kind, name))  # markup: not counted by Telegram
        else:
            visible = html.unescape(piece)
            atoms.append(_Atom(piece, utf16_len(visible), "text", visible=visible))
    return atoms


# Break classes, best first. A cut "after" position k means atoms[:k] | atoms[k:].
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


def _closing(stack: Sequence[_Atom]) -> str:
    return "".join(f"</{atom.name}>" for atom in reversed(stack))


def visible_length(rendered: str) -> int:
    """The length Telegram checks against its limit: UTF-16 units of the text, without tags."""
    return sum(atom.cost for atom in _atoms(rendered))


def split_html(rendered: str, limit: int = TELEGRAM_TEXT_LIMIT) -> list[str]:
    """Split rendered HTML into chunks of at most `limit` UTF-16 units of visible text.

    Telegram counts a message's length after parsing its entities: tags count nothing and
    `&amp;` counts one, so they do not use up the budget either.

    Cuts on paragraph, then line, then sentence, then word boundaries (a coarser boundary is
    taken only if it keeps the chunk at least half full); a word longer than a chunk is cut
    between characters. Tags open at a cut are closed and reopened in the next chunk.
    """
    if visible_length(rendered) <= limit:
        return [rendered] if rendered else []
    atoms = _atoms(rendered)
    chunks: list[str] = []
    start = 0
    stack: list[_Atom] = []
    while start < len(atoms):
        prefix = "".join(atom.text for atom in stack)
        budget = limit
        local = list(stack)
        cost = 0
        tail = ""
        best: dict[int, tuple[int, int, tuple[_Atom, ...]]] = {}
        end = start
        while end < len(atoms):
            atom = atoms[end]
            after = local[:-1] if atom.kind == "close" and local else local
            if atom.kind == "open":
                after = [*local, atom]
            if cost + atom.cost > budget:
                break
            local = after
            cost += atom.cost
            end += 1
            if atom.kind == "text":
                tail = (tail + atom.visible)[-2:]
            if atom.kind != "open":
                cls = _break_class(tail)
                if cls is not None:
                    best[cls] = (end, cost, tuple(local))
        if end == len(atoms):
            chunks.append(prefix + "".join(a.text for a in atoms[start:end]) + _closing(local))
            break
        if end == start:  # a single atom larger than the budget: take it anyway, to progress
            atom = atoms[start]
            local = [*local, atom] if atom.kind == "open" else local
            end, cut_stack = start + 1, tuple(local)
        else:
            end, cut_stack = end, tuple(local)
            for cls in (_PARAGRAPH, _LINE, _SENTENCE, _WORD):
                if cls in best and (cls == _WORD or best[cls][1] * 2 >= budget):
                    end, _, cut_stack = best[cls]
                    break
        cut = list(cut_stack)
        # Closing tags right at the cut belong to this chunk: their cost is already reserved.
        while end < len(atoms) and atoms[end].kind == "close" and cut:
            cut.pop()
            end += 1
        chunks.append(prefix + "".join(a.text for a in atoms[start:end]) + _closing(cut))
        start, stack = end, cut
    return chunks


def html_text(rendered: str) -> str:
    """The visible text of rendered HTML: tags removed, entities decoded."""
    return "".join(atom.visible for atom in _atoms(rendered) if atom.kind == "text")


def render_chunks(
    text: str, markup: Literal["plain", "markdown"], limit: int = TELEGRAM_TEXT_LIMIT
) -> list[str]:
    """Render, then split; chunks with no visible text are dropped (Telegram refuses them)."""
    return [chunk for chunk in split_html(render(text, markup), limit) if html_text(chunk).strip()]
