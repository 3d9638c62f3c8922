"""Markdown -> Telegram HTML, and splitting rendered HTML at Telegram's 4,096 limit.

Pure functions. Splitting happens *after* rendering, so a chunk never ends inside a tag and every
chunk is valid HTML on its own: tags open at a cut are closed at the end of one chunk and reopened
at the start of the next. Lengths are counted in UTF-16 code units, as Telegram counts them, so an
astral character (emoji) is never split into half a surrogate pair.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from markdown_it import MarkdownIt
    from markdown_it.token import Token

TELEGRAM_TEXT_LIMIT = 4096
TELEGRAM_CAPTION_LIMIT = 1024


def utf16_len(text: str) -> int:
    """Length as Telegram counts it: characters outside the BMP take two UTF-16 units."""
    return len(text) + sum(1 for ch in text if ord(ch) > 0xFFFF)


def escape(text: str) -> str:
    return html.escape(text, quote=False)


# ---- Markdown -> HTML -------------------------------------------------------------------------


@lru_cache(maxsize=1)
def _markdown() -> MarkdownIt:
    from markdown_it import MarkdownIt

    # html=False: raw HTML in the Markdown is shown as text, never passed through to Telegram.
    return MarkdownIt("commonmark", {"html": False}).enable("strikethrough")


_INLINE_TAGS = {
    "strong_open": "<b>",
    "strong_close": "</b>",
    "em_open": "<i>",
    "em_close": "</i>",
    "s_open": "<s>",
    "s_close": "</s>",
}
_SAFE_SCHEMES = ("http://", "https://", "tg://", "mailto:")


def render_markdown(text: str) -> str:
    """Render Markdown to the subset of HTML Telegram accepts; everything else is escaped."""
    out: list[str] = []
    _render_blocks(_markdown().parse(text), out)
    return "".join(out).rstrip("\n")


def render(text: str, markup: Literal["plain", "markdown"]) -> str:
    return render_markdown(text) if markup == "markdown" else escape(text)


def _trim_newlines(out: list[str]) -> None:
    while out and out[-1].endswith("\n"):
        out[-1] = out[-1].rstrip("\n")
        if not out[-1]:
            out.pop()


def _render_blocks(tokens: Sequence[Token], out: list[str]) -> None:
    lists: list[list[int]] = []  # per open list: [next number] or [] for bullets
    quotes = 0  # Telegram cannot nest blockquotes: only the outermost one is a tag
    for token in tokens:
        kind = token.type
        if kind == "inline":
            _render_inline(token.children or [], out)
        elif kind == "paragraph_close" and not token.hidden:
            out.append("\n\n")
        elif kind == "paragraph_close" or kind == "list_item_close":
            if out and not out[-1].endswith("\n"):
                out.append("\n")
        elif kind == "heading_open":
            out.append("<b>")
        elif kind == "heading_close":
            out.append("</b>\n\n")
        elif kind == "bullet_list_open":
            lists.append([])
        elif kind == "ordered_list_open":
            start = token.attrGet("start")
            lists.append([int(start) if isinstance(start, int | str) else 1])
        elif kind in ("bullet_list_close", "ordered_list_close"):
            lists.pop()
            if not lists:
                out.append("\n")
        elif kind == "list_item_open":
            indent = "  " * (len(lists) - 1)
            current = lists[-1] if lists else []
            if current:
                out.append(f"{indent}{current[0]}. ")
                current[0] += 1
            else:
                out.append(f"{indent}• ")
        elif kind == "blockquote_open":
            quotes += 1
            if quotes == 1:
                out.append("<blockquote>")
        elif kind == "blockquote_close":
            quotes -= 1
            if quotes == 0:
                _trim_newlines(out)
                if out and out[-1] == "<blockquote>":
                    out.pop()  # an empty quote
                else:
                    out.append("</blockquote>")
                out.append("\n\n")
        elif kind in ("fence", "code_block") and not token.content.strip("\n"):
            continue  # an empty code block renders to nothing visible
        elif kind in ("fence", "code_block"):
            code = escape(token.content.rstrip("\n"))
            language = token.info.strip().split(" ")[0] if kind == "fence" else ""
            if language and re.fullmatch(r"[\w+#.-]+", language):
                out.append(f'<pre><code class="language-{language}">{code}</code></pre>\n\n')
            else:
                out.append(f"<pre>{code}</pre>\n\n")
        elif kind == "hr":
            out.append("――――――\n\n")
        elif kind == "html_block":  # only reachable if html is enabled; still shown as text
            out.append(escape(token.content))


def _render_inline(tokens: Sequence[Token], out: list[str]) -> None:
    links: list[bool] = []  # whether each open link emitted an <a>
    for token in tokens:
        kind = token.type
        if kind == "text":
            out.append(escape(token.content))
        elif kind in ("softbreak", "hardbreak"):
            out.append("\n")
        elif kind in _INLINE_TAGS:
            out.append(_INLINE_TAGS[kind])
        elif kind == "code_inline":
            out.append(f"<code>{escape(token.content)}</code>")
        elif kind == "link_open":
            href = str(token.attrGet("href") or "")
            safe = href.lower().startswith(_SAFE_SCHEMES)
            links.append(safe)
            if safe:
                out.append(f'<a href="{html.escape(href, quote=True)}">')
        elif kind == "link_close":
            if links.pop():
                out.append("</a>")
        elif kind == "image":
            out.append(escape(token.content or str(token.attrGet("alt") or "")))
        elif kind in ("html_inline", "html_block"):
            out.append(escape(token.content))
        elif token.children:
            _render_inline(token.children, out)


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
            atoms.append(_Atom(piece, utf16_len(piece), kind, name))
        else:
            atoms.append(_Atom(piece, utf16_len(piece), "text", visible=html.unescape(piece)))
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


def split_html(rendered: str, limit: int = TELEGRAM_TEXT_LIMIT) -> list[str]:
    """Split rendered HTML into chunks of at most `limit` UTF-16 units (tags included).

    Cuts on paragraph, then line, then sentence, then word boundaries (a coarser boundary is
    taken only if it keeps the chunk at least half full); a word longer than a chunk is cut
    between characters. Tags open at a cut are closed and reopened in the next chunk.
    """
    if utf16_len(rendered) <= limit:
        return [rendered] if rendered else []
    atoms = _atoms(rendered)
    chunks: list[str] = []
    start = 0
    stack: list[_Atom] = []
    while start < len(atoms):
        prefix = "".join(atom.text for atom in stack)
        budget = limit - utf16_len(prefix)
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
            closing = utf16_len(_closing(after))
            if cost + atom.cost + closing > budget:
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
