"""Markdown -> Telegram HTML, and splitting rendered HTML at Telegram's 4,096 limit.

Pure functions. Splitting happens *after* rendering (see `splitting`), so a chunk never ends
inside a tag and every chunk is valid HTML on its own: tags open at a cut are closed at the end of
one chunk and reopened at the start of the next. A user-visible character (an emoji with its skin
tone, a flag, a letter with its accent) is never cut in two. Lengths are counted in UTF-16 code
units, the stricter of the two counts reported for Telegram's limits (TDLib is said to count
characters): a chunk fits either way.
"""

from __future__ import annotations

import html
import re
from collections.abc import Mapping
from typing import ClassVar, Literal
from urllib.parse import urlsplit

from talkbridge.connectors import markdown
from talkbridge.connectors.markdown import Dialect
from talkbridge.connectors.splitting import Atom, split, text_atoms

TELEGRAM_TEXT_LIMIT = 4096
TELEGRAM_CAPTION_LIMIT = 1024


def utf16_len(text: str) -> int:
    """Length in UTF-16 code units (an emoji two): the unit of entity offsets, and the safe
    side of the message limits."""
    return len(text) + sum(1 for ch in text if ord(ch) > 0xFFFF)


def escape(text: str) -> str:
    return html.escape(text, quote=False)


# ---- Markdown -> HTML -------------------------------------------------------------------------

_TG_HOST = re.compile(r"[A-Za-z0-9_-]+")


def telegram_accepts_link(href: str) -> bool:
    """Whether Telegram keeps `href` as a link (`<a href>`), by the rules its servers apply
    (TDLib's `LinkManager::check_link`): `http(s)://` with a host that has a dot in it (or is
    an IPv6 address) and a port from 1 to 65535, or `tg:` with a bare name for host
    (`tg://user?id=123`). Anything else (`mailto:`, `http://localhost`, `http://` without a
    host, a relative or a scheme-less address) is refused, and in HTML mode the link is
    dropped, leaving only its label: the reader would never see the address."""
    lower = href.lower()
    if lower.startswith("tg:"):
        rest = href[3:].removeprefix("//")
        host = re.split(r"[/?#]", rest, maxsplit=1)[0]
        return bool(_TG_HOST.fullmatch(host))
    if not lower.startswith(("http://", "https://")):
        return False
    try:
        parts = urlsplit(href)
        port = parts.port
    except ValueError:  # a bad port or IPv6 address
        return False
    host = parts.hostname or ""
    ipv6 = parts.netloc.rpartition("@")[2].startswith("[")
    if port == 0 or not host.strip(".") or any(ch.isspace() for ch in href):
        return False
    return ipv6 or "." in host


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
        if telegram_accepts_link(href):
            return f'<a href="{html.escape(href, quote=True)}">{label}</a>'
        # Telegram would drop it, and the address with it: written out after its label
        # instead (once, where the label is the address already, as in `<a@b.com>`).
        shown = html.unescape(re.sub(r"<[^>]*>", "", label))
        if not href or shown in (href, href.removeprefix("mailto:")):
            return label
        return f"{label} ({escape(href)})"

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

_TOKEN = re.compile(
    r"(?P<tag><[^<>]+>)|(?P<entity>&(?:[A-Za-z]+|#[0-9]+|#[xX][0-9A-Fa-f]+);)|(?P<text>[^<&]+|[<&])"
)
_TAG_NAME = re.compile(r"</?\s*([A-Za-z][A-Za-z0-9-]*)")


def _atoms(rendered: str) -> list[Atom]:
    """Tags cost nothing (Telegram counts the text after parsing them), an entity one character,
    text one atom per grapheme, so an emoji with its skin tone is never cut in two."""
    atoms: list[Atom] = []
    for match in _TOKEN.finditer(rendered):
        piece = match.group(0)
        if match.group("tag"):
            atoms.append(_tag(piece))
        elif match.group("entity"):
            visible = html.unescape(piece)
            atoms.append(Atom(piece, utf16_len(visible), visible=visible))
        else:
            atoms.extend(text_atoms(piece, utf16_len))
    return atoms


def _tag(tag: str) -> Atom:
    found = _TAG_NAME.match(tag)
    name = found.group(1).lower() if found else ""
    if tag.startswith("</"):
        return Atom(tag, 0, "close")
    return Atom(tag, 0, "open", closer=f"</{name}>", reopen=tag, inline=name not in _BLOCKS)


_BLOCKS = ("pre", "blockquote")


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
    return [piece.text for piece in split(_atoms(rendered), limit, lambda _: 0)]


def html_text(rendered: str) -> str:
    """The visible text of rendered HTML: tags removed, entities decoded."""
    return "".join(atom.visible for atom in _atoms(rendered))


def render_chunks(
    text: str, markup: Literal["plain", "markdown"], limit: int = TELEGRAM_TEXT_LIMIT
) -> list[str]:
    """Render, then split; chunks with no visible text are dropped (Telegram refuses them)."""
    return [chunk for chunk in split_html(render(text, markup), limit) if html_text(chunk).strip()]
