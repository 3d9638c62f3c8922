"""Markdown -> Telegram HTML, and splitting after rendering."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from talkbridge.connectors.telegram.render import (
    html_text,
    render,
    render_chunks,
    render_markdown,
    split_html,
    telegram_accepts_link,
    utf16_len,
    visible_length,
)
from tests.support.splitting import CLUSTERS, whole_clusters

TELEGRAM_TAGS = {"b", "i", "s", "u", "a", "code", "pre", "blockquote"}


class _Balance(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.tags: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.stack.append(tag)
        self.tags.add(tag)

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack.pop() != tag:
            self.errors.append(f"unexpected </{tag}>")


def balanced(chunk: str) -> bool:
    parser = _Balance()
    parser.feed(chunk)
    parser.close()
    return not parser.errors and not parser.stack


def tags_in(chunk: str) -> set[str]:
    parser = _Balance()
    parser.feed(chunk)
    return parser.tags


def test_markdown_renders_to_telegram_tags_and_escapes_the_rest() -> None:
    out = render_markdown(
        "# Title\n\n**bold** _it_ ~~gone~~ `a<b>` [site](https://e.com/?a=1&b=2) 1 < 2 & <i>x</i>"
    )
    assert out == (
        "<b>Title</b>\n\n<b>bold</b> <i>it</i> <s>gone</s> <code>a&lt;b&gt;</code> "
        '<a href="https://e.com/?a=1&amp;b=2">site</a> 1 &lt; 2 &amp; &lt;i&gt;x&lt;/i&gt;'
    )


def test_code_blocks_lists_and_quotes() -> None:
    out = render_markdown("- one\n- two\n\n> said\n\n```python\nif a < b:\n    pass\n```")
    assert "• one\n• two" in out
    assert "<blockquote>said</blockquote>" in out
    assert '<pre><code class="language-python">if a &lt; b:\n    pass</code></pre>' in out
    assert tags_in(out) <= TELEGRAM_TAGS


def test_unsafe_links_are_not_links() -> None:
    out = render_markdown("[x](javascript:alert(1))")
    assert "<a" not in out and "javascript" in out


@pytest.mark.parametrize(
    ("markdown", "expected"),
    [
        ("[write to us](mailto:help@example.com)", "write to us (mailto:help@example.com)"),
        ("[the dashboard](http://localhost:8080/x)", "the dashboard (http://localhost:8080/x)"),
        ("[dev box](https://devbox/status)", "dev box (https://devbox/status)"),
        ("[nowhere](http://)", "nowhere (http://)"),
        ("[no host](https:///path)", "no host (https:///path)"),
        ("[port 0](https://e.com:0/)", "port 0 (https://e.com:0/)"),
        ("[files](ftp://e.com/f)", "files (ftp://e.com/f)"),
        ("[docs](/docs/setup)", "docs (/docs/setup)"),
        ("[tg with a dot](tg:google.com)", "tg with a dot (tg:google.com)"),
        (
            "[**q**](http://localhost/?a=1&b=<2>)",
            "<b>q</b> (http://localhost/?a=1&amp;b=%3C2%3E)",
        ),
    ],
)
def test_a_link_telegram_would_refuse_is_written_out_after_its_label(
    markdown: str, expected: str
) -> None:
    """Telegram refuses such an href, and in HTML mode drops the link: the reader saw the label
    alone, and the address was lost."""
    out = render_markdown(markdown)
    assert out == expected
    assert tags_in(out) <= TELEGRAM_TAGS - {"a"}


@pytest.mark.parametrize(
    "href",
    [
        "https://e.com/?a=1",
        "HTTP://Example.org",
        "http://127.0.0.1:8080/",
        "http://[2001:db8::ff00:42:8329]/",
        "https://user:pw@e.com:8443/x#y",
        "tg://user?id=123456789",
        "tg://resolve?domain=talkbridge_bot",
        "TG:_",
    ],
)
def test_a_link_telegram_accepts_stays_a_link(href: str) -> None:
    assert telegram_accepts_link(href)
    assert render_markdown(f"[go]({href})") == f'<a href="{href.replace("&", "&amp;")}">go</a>'


def test_an_address_shown_as_its_own_label_is_written_once() -> None:
    assert render_markdown("<help@example.com>") == "help@example.com"
    assert render_markdown("see <http://localhost:8080>") == "see http://localhost:8080"


@pytest.mark.parametrize(
    ("href", "accepted"),
    [  # TDLib's own cases (td/test/link.cpp, check_link)
        ("sftp://google.com", False),
        ("httP://google.com?1#tes", True),
        ("http:google.com", False),
        ("http://google.com:0", False),
        ("http://google.com:-1", False),
        ("http://localhost", False),
        ("https://.", False),
        ("tg://google_com", True),
        ("tg:google-com", True),
        ("tg:google.com", False),
        ("tg:test@google.com", False),
        ("tg:google.com:80", False),
        ("tg://http://google.com", False),
        ("mailto:a@b.com", False),
        ("", False),
    ],
)
def test_which_links_telegram_accepts(href: str, accepted: bool) -> None:
    assert telegram_accepts_link(href) is accepted


def test_plain_markup_is_only_escaped() -> None:
    assert render("**not bold** <b>", "plain") == "**not bold** &lt;b&gt;"


def test_short_text_is_one_chunk() -> None:
    assert split_html("<b>hi</b>") == ["<b>hi</b>"]


def test_splits_on_paragraphs_first() -> None:
    para = "Word " * 300  # 1,500 characters
    rendered = render_markdown("\n\n".join([para.strip()] * 5))
    chunks = split_html(rendered, 4096)
    assert len(chunks) == 3
    assert all(chunk.endswith("\n\n") for chunk in chunks[:-1])
    assert "".join(chunks) == rendered


def test_splits_on_sentences_when_a_paragraph_is_too_long() -> None:
    text = "This is a sentence. " * 400  # one paragraph of 8,000 characters
    chunks = split_html(render_markdown(text), 4096)
    assert len(chunks) == 2
    assert chunks[0].endswith(". ")


def test_open_tags_are_closed_and_reopened_across_chunks() -> None:
    rendered = '<b><a href="https://e.com">' + "link text " * 900 + "</a></b>"
    chunks = split_html(rendered, 4096)
    assert len(chunks) == 3
    for chunk in chunks:
        assert balanced(chunk), chunk[:80]
        assert chunk.startswith('<b><a href="https://e.com">') and chunk.endswith("</a></b>")
        assert visible_length(chunk) <= 4096
    assert "".join(html_text(c) for c in chunks) == html_text(rendered)


def test_never_splits_a_surrogate_pair_and_counts_utf16() -> None:
    emoji = "😀"  # two UTF-16 units
    rendered = emoji * 3000  # 6,000 units, no spaces at all
    chunks = split_html(rendered, 4096)
    assert [utf16_len(c) for c in chunks] == [4096, 6000 - 4096]
    assert all(set(c) == {emoji} for c in chunks)


def test_never_cuts_inside_a_user_visible_character() -> None:
    # "x" shifts every emoji by one unit, so a cut at the limit would fall inside one.
    for cluster in ("👍🏽", "👨\u200d👩\u200d👧", "🇫🇷", "e\u0301"):
        rendered = "x" + cluster * (5000 // utf16_len(cluster))
        chunks = split_html(rendered, 4096)
        assert len(chunks) == 2 and "".join(chunks) == rendered
        assert chunks[1] == cluster * (len(chunks[1]) // len(cluster)), cluster


def test_never_cuts_inside_an_entity() -> None:
    rendered = "&amp;" * 2000
    for chunk in split_html(rendered, 4096):
        assert re.fullmatch(r"(&amp;)+", chunk)


def test_whitespace_only_chunks_are_dropped_when_sending() -> None:
    assert render_chunks("   ", "plain") == []


markdownish = st.lists(
    st.sampled_from(
        [
            *"abc xyz.!?\n*_`~[]()#>-<&\"'",
            *("😀", "é", "中", "\n\n", "**", "```", "> ", "- "),
            *CLUSTERS,
            *("https://e.com", "[l](https://x.y)"),
        ]
    ),
    max_size=300,
).map("".join)


@settings(max_examples=150, deadline=None)
@given(markdownish, st.integers(min_value=60, max_value=300))
def test_split_property(source: str, limit: int) -> None:
    """Every chunk fits, is balanced HTML, and together they hold exactly the rendered text."""
    rendered = render_markdown(source)
    chunks = split_html(rendered, limit)
    for chunk in chunks:
        assert visible_length(chunk) <= limit
        assert balanced(chunk), chunk
        assert whole_clusters(html_text(chunk)), chunk
    assert "".join(html_text(chunk) for chunk in chunks) == html_text(rendered)
    assert all(tags_in(chunk) <= TELEGRAM_TAGS for chunk in chunks)


@settings(max_examples=30, deadline=None)
@given(
    st.lists(
        st.sampled_from(["Sentence one. ", "**Bold part.** ", "😀 ", "\n\n", "`x` "]), max_size=800
    )
)
def test_split_property_at_the_real_limit(parts: list[str]) -> None:
    rendered = render_markdown("".join(parts))
    chunks = split_html(rendered)
    assert all(visible_length(c) <= 4096 and balanced(c) for c in chunks)
    assert "".join(html_text(c) for c in chunks) == html_text(rendered)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.sampled_from([*CLUSTERS, "x", "**", "_", " ", "\n"]), max_size=200).map("".join),
    st.integers(min_value=20, max_value=80),
)
def test_split_property_keeps_characters_whole(source: str, limit: int) -> None:
    """Runs of emoji with few spaces are cut hard, and still between characters."""
    rendered = render_markdown(source)
    chunks = split_html(rendered, limit)
    for chunk in chunks:
        assert visible_length(chunk) <= limit and balanced(chunk), chunk
        assert whole_clusters(html_text(chunk)), chunk
    assert "".join(html_text(chunk) for chunk in chunks) == html_text(rendered)


def test_markup_and_entities_do_not_use_up_the_limit() -> None:
    # Telegram counts the text after parsing: `&amp;` is one character, a tag is none.
    chunks = split_html("&amp;" * 5000, 4096)
    assert [visible_length(c) for c in chunks] == [4096, 904]
    bold = "<b>" + "x" * 4000 + "</b>"
    assert split_html(bold, 4096) == [bold]
