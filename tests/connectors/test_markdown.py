"""The shared Markdown walk: every construct reaches its dialect hook, raw HTML stays text."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from talkbridge.connectors import markdown


class Tags(markdown.Dialect):
    marks: ClassVar[Mapping[str, str]] = {
        "strong_open": "[b]",
        "strong_close": "[/b]",
        "em_open": "[i]",
        "em_close": "[/i]",
        "s_open": "[s]",
        "s_close": "[/s]",
    }
    heading_marks = ("[h]", "[/h]")
    rule = "[hr]"

    def escape(self, text: str) -> str:
        return text.replace("<", "&lt;")

    def code_inline(self, code: str) -> str:
        return f"[c]{code}[/c]"

    def code_block(self, code: str, language: str) -> str:
        return f"[pre {language}]{code}[/pre]\n\n"

    def link(self, href: str, label: str) -> str:
        return f"[a {href}]{label}[/a]"

    def quote(self, inner: str, depth: int) -> str:
        return f"[q{depth}]{inner.strip()}[/q{depth}]\n\n"


def test_each_construct_goes_through_its_hook() -> None:
    source = (
        "# T\n\n**b** _i_ ~~s~~ `c` [l **x**](http://e) <b>\n\n"
        "- a\n  1. n\n\n> q\n> > qq\n\n```py\ncode\n```\n\n---\n"
    )
    assert markdown.render(source, Tags()) == (
        "[h]T[/h]\n\n"
        "[b]b[/b] [i]i[/i] [s]s[/s] [c]c[/c] [a http://e]l [b]x[/b][/a] &lt;b>\n\n"
        "• a\n  1. n\n\n"
        "[q1]q\n\n[q2]qq[/q2][/q1]\n\n"
        "[pre py]code[/pre]\n\n"
        "[hr]\n\n"
    )


def test_empty_code_blocks_render_to_nothing() -> None:
    assert markdown.render("```\n\n```", Tags()) == ""


def test_tables_only_when_asked() -> None:
    table = "| a |\n| - |\n| 1 |"
    assert "<table>" in markdown.parser(tables=True).render(table)
    assert "<table>" not in markdown.parser().render(table)
