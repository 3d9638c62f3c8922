"""Markdown -> a platform's own markup: one token walk, with a hook per construct for each dialect.

Pure functions. Connectors whose platform does not take Markdown (Telegram's HTML, Slack's mrkdwn)
subclass `Dialect`, say how each construct is written, and call `render`: the walk over
markdown-it-py's tokens (lists, quotes, code, links, headings) is the same for all of them. Raw
HTML in the Markdown is never passed through: it is escaped and shown as text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from markdown_it import MarkdownIt
    from markdown_it.token import Token


@lru_cache(maxsize=2)
def parser(tables: bool = False) -> MarkdownIt:
    """CommonMark with strikethrough (and tables if asked); html=False so raw HTML stays text."""
    from markdown_it import MarkdownIt

    rules = ["strikethrough", "table"] if tables else ["strikethrough"]
    return MarkdownIt("commonmark", {"html": False}).enable(rules)


class Dialect:
    """How one platform writes each Markdown construct; `render` does the walking."""

    marks: ClassVar[Mapping[str, str]]
    """Output for `strong_open`/`strong_close`, `em_…` and `s_…` tokens."""
    heading_marks: ClassVar[tuple[str, str]]
    """Text before and after a heading (a heading is shown bold); a blank line follows."""
    list_indent: ClassVar[str] = "  "
    """Indent per level of a nested list."""
    rule: ClassVar[str]
    """A thematic break (`---`), on a line of its own."""
    quotes_restart_lists: ClassVar[bool] = False
    """Whether a list inside a quote starts at the margin again rather than nesting deeper."""

    def escape(self, text: str) -> str:
        raise NotImplementedError

    def code_inline(self, code: str) -> str:
        raise NotImplementedError

    def code_block(self, code: str, language: str) -> str:
        """A code block, `code` without trailing newlines, never empty; `language` may be ''."""
        raise NotImplementedError

    def link(self, href: str, label: str) -> str:
        """A link; `label` is already rendered. Unsafe targets should yield just the label."""
        raise NotImplementedError

    def quote(self, inner: str, depth: int) -> str:
        """A block quote around rendered `inner`; `depth` is 1 for the outermost quote."""
        raise NotImplementedError


@dataclass(slots=True)
class _Frame:
    """Output being collected for one open quote or link (or the whole document)."""

    out: list[str] = field(default_factory=list)
    lists: list[list[int]] = field(default_factory=list)  # per open list: [next number] or []
    href: str = ""


def render(text: str, dialect: Dialect) -> str:
    """Render Markdown `text` in `dialect`; the result may end in newlines, for callers to trim."""
    frames = [_Frame()]
    _blocks(parser().parse(text), dialect, frames)
    return "".join(frames[0].out)


def _blocks(tokens: Sequence[Token], dialect: Dialect, frames: list[_Frame]) -> None:
    for token in tokens:
        frame = frames[-1]
        out, lists, kind = frame.out, frame.lists, token.type
        if kind == "inline":
            _inline(token.children or [], dialect, frames)
        elif kind == "paragraph_close" and not token.hidden:
            out.append("\n\n")
        elif kind in ("paragraph_close", "list_item_close"):
            if out and not out[-1].endswith("\n"):
                out.append("\n")
        elif kind == "heading_open":
            out.append(dialect.heading_marks[0])
        elif kind == "heading_close":
            out.append(dialect.heading_marks[1] + "\n\n")
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
            indent = dialect.list_indent * (len(lists) - 1)
            current = lists[-1] if lists else []
            if current:
                out.append(f"{indent}{current[0]}. ")
                current[0] += 1
            else:
                out.append(f"{indent}• ")
        elif kind == "blockquote_open":
            frames.append(_Frame(lists=[] if dialect.quotes_restart_lists else lists))
        elif kind == "blockquote_close":
            inner = "".join(frames.pop().out)
            frames[-1].out.append(dialect.quote(inner, depth=len(frames)))
        elif kind in ("fence", "code_block"):
            code = token.content.rstrip("\n")
            if code:  # an empty code block renders to nothing visible
                language = token.info.strip().split(" ")[0] if kind == "fence" else ""
                out.append(dialect.code_block(code, language))
        elif kind == "hr":
            out.append(dialect.rule + "\n\n")
        elif kind == "html_block":  # only reachable if html is enabled; still shown as text
            out.append(dialect.escape(token.content))


def _inline(tokens: Sequence[Token], dialect: Dialect, frames: list[_Frame]) -> None:
    for token in tokens:
        out, kind = frames[-1].out, token.type
        if kind == "text":
            out.append(dialect.escape(token.content))
        elif kind in ("softbreak", "hardbreak"):
            out.append("\n")
        elif kind in dialect.marks:
            out.append(dialect.marks[kind])
        elif kind == "code_inline":
            out.append(dialect.code_inline(token.content))
        elif kind == "link_open":
            frames.append(_Frame(href=str(token.attrGet("href") or "")))
        elif kind == "link_close" and len(frames) > 1:
            link = frames.pop()
            frames[-1].out.append(dialect.link(link.href, "".join(link.out)))
        elif kind == "image":
            out.append(dialect.escape(token.content or str(token.attrGet("alt") or "")))
        elif kind in ("html_inline", "html_block"):
            out.append(dialect.escape(token.content))
        elif token.children:
            _inline(token.children, dialect, frames)
