"""Splitting for Discord: every chunk renders on its own as its part of the whole did.

What a chunk shows is read with CommonMark (markdown-it), which agrees with Discord on the
constructs generated here; the Discord-only ones (underline, spoilers) have tests of their own.
"""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st
from markdown_it.token import Token

from talkbridge.connectors.discord.render import length, render_chunks, split_message
from talkbridge.connectors.markdown import parser
from tests.support.splitting import CLUSTERS, emphasised_paragraphs, whole_clusters


def shown(markdown: str) -> str:
    """The text `markdown` shows, marks and escapes gone, whitespace aside."""
    out: list[str] = []

    def walk(tokens: Sequence[Token]) -> None:
        for token in tokens:
            if token.children:
                walk(token.children)
            elif token.type in ("text", "code_inline", "fence", "code_block"):
                out.append(token.content)

    # Discord has no indented code blocks: read every line from its first non-space.
    walk(parser().parse("\n".join(line.lstrip() for line in markdown.split("\n"))))
    return "".join("".join(out).split())


def test_emphasis_and_code_cut_by_a_split_are_closed_and_reopened() -> None:
    text = " ".join(
        f"{mark}{word}" + f" {word}" * 40 + f" end{mark}"
        for mark, word in [("**", "bold"), ("*", "it"), ("~~", "gone"), ("`", "code")]
    )
    chunks = split_message(text, 200)
    assert len(chunks) > 4 and all(length(c) <= 200 for c in chunks)
    for chunk in chunks:
        assert chunk.strip()[0] in "*~`" and chunk.strip()[-1] in "*~`", chunk
        assert not set(shown(chunk)) & set("*~`"), chunk  # no mark shows as text
    assert "".join(shown(c) for c in chunks) == shown(text)


def test_underline_and_spoilers_are_closed_and_reopened_too() -> None:
    text = "__" + "under " * 50 + "line__ ||" + "secret " * 50 + "end||"
    chunks = [c.strip() for c in split_message(text, 120)]
    assert len(chunks) > 4 and all(length(c) <= 120 for c in chunks)
    marks = [(c[:2], c[-2:]) for c in chunks]
    assert marks == sorted(marks) and set(marks) == {("__", "__"), ("||", "||")}


def test_bold_italic_nests_and_closes_inside_out() -> None:
    chunks = split_message("***" + "both " * 40 + "end***", 100)
    assert all(c.startswith("***") and c.rstrip().endswith("***") for c in chunks), chunks


def test_a_split_never_cuts_an_escape_in_plain_text() -> None:
    for before in range(1990, 2000):  # the escaped star falls on every place around the limit
        text = "a" * before + "*" + "b" * 100
        chunks = render_chunks(text, "plain")
        assert all(length(c) <= 2000 for c in chunks)
        assert not chunks[0].endswith("\\"), before  # "\\" alone escapes the chunk's end
        assert chunks[1][0] in "\\b", before  # and "*" alone would start an italic
        assert "".join(chunks) == "a" * before + "\\*" + "b" * 100


def test_a_split_never_cuts_inside_a_user_visible_character() -> None:
    for cluster in CLUSTERS:
        text = "x" + cluster * (450 // len(cluster))
        chunks = split_message(text, 101)
        assert all(length(c) <= 101 and whole_clusters(c) for c in chunks), cluster
        assert "".join(chunks) == text


def test_a_quoted_line_cut_by_a_split_is_quoted_again_in_the_next_chunk() -> None:
    """`> ` quotes one line on Discord: the rest of a long quoted paragraph cut off by a split
    showed unquoted, as if the bot said it; a bold span in it is closed and reopened inside."""
    text = "intro\n> " + "quoted **bold words** " * 30 + "\nafter"
    chunks = render_chunks(text, "markdown", limit=150)
    assert len(chunks) > 4 and all(length(c) <= 150 for c in chunks)
    assert chunks[0].startswith("intro\n> ")
    for chunk in chunks[1:-1]:
        assert chunk.startswith("> ") and "\n" not in chunk, chunk
        assert chunk.count("**") % 2 == 0, chunk
    assert chunks[-1].startswith("> ") and chunks[-1].endswith("\nafter"), chunks[-1]

    def words(text: str) -> str:
        return "".join(text.replace("> ", "").replace("**", "").split())

    assert "".join(map(words, chunks)) == words(text)


def test_a_block_quote_cut_by_a_split_is_quoted_again_in_the_next_chunk() -> None:
    """`>>> ` quotes the rest of a Discord message: the chunks after a split showed unquoted."""
    text = "intro\n>>> " + "quoted **bold words** and more\n" * 20
    chunks = render_chunks(text, "markdown", limit=150)
    assert len(chunks) > 3 and all(length(c) <= 150 for c in chunks)
    assert chunks[0].startswith("intro\n>>> ")
    for chunk in chunks[1:]:
        assert chunk.startswith(">>> ") and chunk.count("**") % 2 == 0, chunk
        assert ">>> " not in chunk[4:], chunk


def test_links_and_mentions_are_never_cut() -> None:
    link = "[the docs](https://example.com/" + "p" * 60 + ")"
    tokens = [link, "<@80351110224678912>", "<https://example.com/a>", "https://e.com/" + "b" * 40]
    text = " ".join(f"{'w' * 30} {token}" for token in tokens * 5)
    chunks = split_message(text, 100)
    assert all(length(c) <= 100 for c in chunks)
    assert sum(c.count(token) for c in chunks for token in tokens) == 20


def test_a_link_longer_than_a_chunk_is_spelled_out_rather_than_sent_over_the_limit() -> None:
    url = "https://example.com/" + "p" * 200
    chunks = split_message(f"see [docs]({url}) now", 100)
    assert all(length(c) <= 100 for c in chunks)
    assert "".join(chunks).replace(" ", "") == f"seedocs({url})now"


words = st.sampled_from(
    ["alpha", "beta", "gamma.", "x", "😀", "\\*", "\\_", "<@80351110224678912>", *CLUSTERS,
     "[docs](https://e.com/p)", "https://e.com/q"]
)  # fmt: skip
paragraphs = emphasised_paragraphs(
    words,
    st.lists(st.sampled_from(["alpha", "b*c", "😀", *CLUSTERS]), min_size=1, max_size=8).map(
        " ".join
    ),
)


@settings(max_examples=200, deadline=None)
@given(paragraphs, st.integers(min_value=40, max_value=400))
def test_split_property(source: str, limit: int) -> None:
    """Every chunk fits, shows no stray mark and no part of a character; together they show
    what the whole did."""
    chunks = render_chunks(source, "markdown", limit)
    for chunk in chunks:
        assert length(chunk) <= limit, chunk
        assert whole_clusters(shown(chunk)), chunk
    assert "".join(shown(chunk) for chunk in chunks) == shown(source)


plain = st.lists(
    st.sampled_from([*"abc \n*_~`|>#[]-\\", "😀", *CLUSTERS, "word", "  "]), max_size=300
).map("".join)


@settings(max_examples=200, deadline=None)
@given(plain, st.integers(min_value=40, max_value=300))
def test_split_property_of_plain_text(source: str, limit: int) -> None:
    """Escaped plain text shows exactly itself, chunk after chunk."""
    chunks = render_chunks(source, "plain", limit)
    for chunk in chunks:
        assert length(chunk) <= limit, chunk
        assert whole_clusters(shown(chunk)), chunk
    assert "".join(shown(chunk) for chunk in chunks) == "".join(source.split())
