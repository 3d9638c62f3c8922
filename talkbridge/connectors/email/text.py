"""Readable text from mail bodies: HTML -> plain text, and quoted replies / signatures trimmed.

Pure functions on strings. Trimming only ever shortens what the agent sees; the full body stays
in the message's `raw_event` for hooks.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser

_BLOCK = {
    "address", "article", "aside", "div", "dl", "dt", "dd", "fieldset", "figure", "footer",
    "form", "h1", "h2", "h3", "h4", "h5", "h6", "header", "hr", "li", "main", "nav", "ol", "p",
    "pre", "section", "table", "tr", "ul", "center",
}  # fmt: skip
_SKIP = {"script", "style", "head", "title", "template", "noscript"}
_VOID = {"br", "img", "hr", "meta", "link", "input", "wbr", "area", "base", "col", "source"}


class _TextExtractor(HTMLParser):
    """Collects text with line structure: blocks end lines, `<br>` breaks them, quotes get `> `."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.lines: list[str] = []
        self._line: list[str] = []
        self._skip = 0
        self._quote = 0
        self._pre = 0
        self._links: list[tuple[str, int]] = []  # href, length of line text when it opened

    # Lines -------------------------------------------------------------------------------

    def _break(self, force: bool = False) -> None:
        text = "".join(self._line)
        if not self._pre:
            text = re.sub(r"[ \t\r\n\f\v\u00a0]+", " ", text).strip()
        if text or force:
            self.lines.append("> " * self._quote + text if text else ">" * self._quote)
        self._line = []

    def _blank(self) -> None:
        self._break()
        if self.lines and self.lines[-1].strip("> "):
            self.lines.append(">" * self._quote)

    # Parser callbacks --------------------------------------------------------------------

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _SKIP:
            self._skip += 1
            return
        if self._skip:
            return
        attributes = dict(attrs)
        if tag == "br":
            self._break(force=True)
        elif tag == "blockquote":
            self._blank()
            self._quote += 1
        elif tag in ("p", "h1", "h2", "h3", "h4", "h5", "h6", "table", "ul", "ol"):
            self._blank()
        elif tag == "li":
            self._break()
            self._line.append("- ")
        elif tag in ("td", "th"):
            if "".join(self._line).strip():
                self._line.append(" | ")
        elif tag == "pre":
            self._break()
            self._pre += 1
        elif tag in _BLOCK:
            self._break()
        elif tag == "a":
            self._links.append((attributes.get("href") or "", len("".join(self._line))))
        elif tag == "img":
            alt = (attributes.get("alt") or "").strip()
            if alt:
                self._line.append(f"[{alt}]")

    def handle_endtag(self, tag: str) -> None:
        if tag in _SKIP:
            self._skip = max(0, self._skip - 1)
            return
        if self._skip:
            return
        if tag == "blockquote":
            self._break()
            self._quote = max(0, self._quote - 1)
            self._blank()
        elif tag == "pre":
            self._break()
            self._pre = max(0, self._pre - 1)
        elif tag in ("p", "h1", "h2", "h3", "h4", "h5", "h6", "table", "ul", "ol"):
            self._blank()
        elif tag in _BLOCK:
            self._break()
        elif tag == "a" and self._links:
            href, start = self._links.pop()
            label = "".join(self._line)[start:].strip()
            target = href.removeprefix("mailto:")
            if href and not href.startswith("#") and target not in label and label:
                self._line.append(f" ({target})")

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)
        if tag not in _VOID:
            self.handle_endtag(tag)

    def handle_data(self, data: str) -> None:
        if not self._skip:
            self._line.append(data)

    def text(self) -> str:
        self._break()
        return _tidy("\n".join(self.lines))


def _tidy(text: str) -> str:
    lines = [line.rstrip() for line in text.splitlines()]
    out: list[str] = []
    for line in lines:
        blank = not line.strip("> ")
        if blank and (not out or not out[-1].strip("> ")):
            continue  # no leading blank lines, no runs of them
        out.append(line)
    while out and not out[-1].strip("> "):
        out.pop()
    return "\n".join(out)


def html_to_text(html: str) -> str:
    """Readable plain text from an HTML body; never raises on malformed markup."""
    parser = _TextExtractor()
    try:
        parser.feed(html)
        parser.close()
    except (AssertionError, ValueError):  # html.parser's last-resort errors on garbage
        pass
    return parser.text()


# ---- format=flowed ------------------------------------------------------------------------


def unflow(text: str, *, delsp: bool = False) -> str:
    """A `format=flowed` body (RFC 3676) as its writer typed it: Thunderbird, Apple Mail and
    others wrap long lines at ~72 characters, ending each wrapped line with a space; a line
    ending in a space joins the next one of the same quote depth. Space-stuffing is undone and
    quoted lines come out as `> text`; with `delsp=yes` the space that marks the wrap goes too.
    """
    out: list[str] = []
    current: str | None = None
    depth_of_current = 0

    def flush() -> None:
        nonlocal current
        if current is not None:
            prefix = ">" * depth_of_current
            out.append(f"{prefix} {current}" if prefix and current else prefix + current)
        current = None

    for line in text.replace("\r\n", "\n").split("\n"):
        depth = len(line) - len(line.lstrip(">"))
        body = line[depth:]
        if body.startswith(" "):
            body = body[1:]  # space-stuffing (or the space after the quote marks)
        flowed = body.endswith(" ") and body != "-- "
        if current is not None and depth != depth_of_current:
            flush()  # a quote depth change ends a paragraph, wrapped or not (RFC 3676, 4.5)
        piece = body[:-1] if flowed and delsp else body
        if current is None:
            current, depth_of_current = piece, depth
        else:
            current += piece
        if not flowed:
            flush()
    flush()
    return "\n".join(out)


# ---- trimming -----------------------------------------------------------------------------

_ATTRIBUTION = [
    re.compile(r"^\s*On .{1,200}(wrote|writes):\s*$", re.IGNORECASE),  # Gmail, Apple Mail
    re.compile(r"^\s*Le .{1,200}a écrit\s*:\s*$", re.IGNORECASE),
    re.compile(r"^\s*Am .{1,200}schrieb .{1,200}:\s*$", re.IGNORECASE),
    re.compile(r"^\s*El .{1,200}escribió:\s*$", re.IGNORECASE),
    re.compile(r"^\s*Il .{1,200}ha scritto:\s*$", re.IGNORECASE),
    re.compile(r"^\s*Op .{1,200}schreef .{1,200}:\s*$", re.IGNORECASE),
]
"""Lines that introduce a quote ("On Monday, Ada wrote:"): a cut only when a quote follows."""
_SEPARATOR = [
    re.compile(r"^\s*-{2,}\s*Original Message\s*-{2,}\s*$", re.IGNORECASE),  # Outlook, TB
    re.compile(r"^\s*-{2,}\s*Ursprüngliche Nachricht\s*-{2,}\s*$", re.IGNORECASE),
    re.compile(r"^\s*_{20,}\s*$"),  # Outlook's rule above the quoted header block
]
_OUTLOOK_HEADER = re.compile(r"^\s*\*?(From|De|Von|Van)\s*:\*?\s+\S", re.IGNORECASE)
_OUTLOOK_NEXT = re.compile(r"^\s*\*?(Sent|Date|Envoyé|Gesendet|To|Subject)\s*:", re.IGNORECASE)
_SIGNATURE = re.compile(r"^-- ?$")  # RFC 3676 signature separator
_MOBILE = re.compile(
    r"^\s*(Sent from my \w+|Sent from (Mail|Outlook) for \w+|Get Outlook for \w+"
    r"|Von meinem \w+ gesendet|Envoyé de mon \w+)\b.*$",
    re.IGNORECASE,
)


def _is_quote(line: str) -> bool:
    return line.lstrip().startswith(">")


def _ends_colon(line: str) -> bool:
    return line.rstrip().endswith(":")


def _quote_follows(lines: list[str], index: int) -> bool:
    """Whether only quoted lines (or nothing) follow line `index` before the next text: what
    sets an attribution ("On Monday, Ada wrote:") apart from a sentence ending the same way."""
    for following in lines[index + 1 :]:
        if following.strip():
            return _is_quote(following)
    return True


def trim_reply(text: str) -> str:
    """The new part of a reply: quoted history, attribution lines and signatures removed.

    Interleaved answers keep their context lines; when trimming would leave nothing (a mail that
    is all quote), the text is returned whole rather than lost.
    """
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    cut = len(lines)
    for index, line in enumerate(lines):
        joined = line + " " + lines[index + 1] if index + 1 < len(lines) else line
        if any(p.match(line) for p in _SEPARATOR):
            cut = index
            break
        attribution = any(p.match(line) for p in _ATTRIBUTION) or (
            # an attribution wrapped over two lines ("On Mon, ... Ada\n<ada@x> wrote:")
            not line.startswith(">") and _ATTRIBUTION[0].match(joined)
        )
        if attribution and _quote_follows(lines, index + (0 if _ends_colon(line) else 1)):
            cut = index
            break
        if _OUTLOOK_HEADER.match(line) and any(
            _OUTLOOK_NEXT.match(following) for following in lines[index + 1 : index + 4]
        ):
            cut = index
            break
        if _SIGNATURE.match(line):
            cut = index
            break
    kept = lines[:cut]
    while kept and (not kept[-1].strip() or _is_quote(kept[-1]) or _MOBILE.match(kept[-1])):
        kept.pop()  # a trailing quote block, and the "Sent from my phone" line
    while kept and (not kept[0].strip() or _is_quote(kept[0])):
        kept.pop(0)  # bottom-posting: the quote comes first
    result = "\n".join(kept).strip()
    return result or text.strip()
