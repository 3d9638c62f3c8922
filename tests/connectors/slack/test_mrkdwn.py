"""Markdown -> mrkdwn, splitting, and mrkdwn -> readable text."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from talkbridge.connectors.slack.mrkdwn import (
    plain_text,
    render,
    render_chunks,
    render_markdown,
    split_mrkdwn,
)
from tests.support.splitting import CLUSTERS, emphasised_paragraphs, whole_clusters


def test_markdown_becomes_slack_mrkdwn() -> None:
    assert render_markdown("**bold** _it_ ~~gone~~ `x`") == "*bold* _it_ ~gone~ `x`"
    assert render_markdown("# Title\n\ntext") == "*Title*\n\ntext"
    assert render_markdown("[doc](https://e.com/?a=1&b=2)") == "<https://e.com/?a=1&amp;b=2|doc>"
    assert render_markdown("<https://e.com>") == "<https://e.com>"
    assert render_markdown("- a\n- b") == "• a\n• b"
    assert render_markdown("1. a\n2. b") == "1. a\n2. b"
    assert render_markdown("> said\n> more") == "> said\n> more"
    assert render_markdown("```py\nif a < b:\n```") == "```\nif a &lt; b:\n```"


def test_reserved_characters_are_escaped_and_unsafe_links_dropped() -> None:
    assert render("a & b <c> d", "plain") == "a &amp; b &lt;c&gt; d"
    assert (
        render_markdown("<script>x</script> & <@U1>")
        == "&lt;script&gt;x&lt;/script&gt; &amp; &lt;@U1&gt;"
    )
    assert render_markdown("[click](ftp://host/file)") == "click"  # only http(s)/mailto links
    assert "<javascript" not in render_markdown("[click](javascript:alert(1))")


def test_long_text_is_split_under_the_limit_at_paragraphs() -> None:
    paragraphs = [f"Paragraph {i}. " + "word " * 60 for i in range(40)]
    chunks = render_chunks("\n\n".join(paragraphs), "markdown", limit=1000)
    assert len(chunks) > 1 and all(len(c) <= 1000 for c in chunks)
    assert all(c.startswith("Paragraph") for c in chunks)  # cut between paragraphs
    joined = " ".join(" ".join(chunks).split())
    assert joined == " ".join(" ".join(paragraphs).split())  # nothing lost


def test_a_split_never_cuts_an_entity_or_a_link_and_reopens_code() -> None:
    text = "x" * 990 + " &amp; <https://example.com/long|label> tail"
    chunks = split_mrkdwn(text, 1000)
    assert all("&am" not in c.replace("&amp;", "") for c in chunks)
    assert "<https://example.com/long|label>" in "".join(chunks)
    code = "```\n" + "line &lt; 1\n" * 200 + "```"
    parts = split_mrkdwn(code, 500)
    assert len(parts) > 1
    assert all(p.startswith("```") and p.endswith("```") for p in parts)
    assert all(len(p) <= 500 for p in parts)


def test_incoming_mrkdwn_is_made_readable() -> None:
    text = "hi <@U1>, <@U2|bob> in <#C1> <#C2|dev>: *b* _i_ ~s~ `*lit*` a_b_c 2*3*4"
    assert plain_text(text, {"U1": "Ada"}, {"C1": "general"}) == (
        "hi @Ada, @bob in #general #dev: b i s *lit* a_b_c 2*3*4"
    )
    assert plain_text("<https://a.b> <https://a.b|site> <mailto:x@y.z|x@y.z>") == (
        "https://a.b site (https://a.b) x@y.z"
    )
    assert plain_text("<!here> <!channel> <!subteam^S1|@ops> <!date^1|Jan 1>") == (
        "@here @channel @ops Jan 1"
    )
    assert plain_text("&lt;b&gt; &amp;amp;") == "<b> &amp;"
    assert plain_text("_*both*_ *_both_* *bold ~struck~*") == "both both bold struck"


# ---- splitting keeps every chunk's markup whole ---------------------------------------------


def shown(chunks: list[str]) -> str:
    """What the chunks show, one after the other, whitespace aside."""
    return "".join("".join(plain_text(chunk).split()) for chunk in chunks)


def test_emphasis_and_code_cut_by_a_split_are_closed_and_reopened() -> None:
    text = (
        "**" + "bold words " * 30 + "end** _" + "italic words " * 30 + "end_ ~~"
        + "struck words " * 30 + "end~~ `" + "code words " * 30 + "end`"
    )  # fmt: skip
    chunks = render_chunks(text, "markdown", limit=200)
    assert len(chunks) > 6 and all(len(c) <= 200 for c in chunks)
    for chunk in chunks:
        assert chunk[0] in "*_~`" and chunk[-1] in "*_~`", chunk  # opened and closed
        assert not set(plain_text(chunk)) & set("*_~`"), chunk  # Slack shows no stray mark
    assert shown(chunks) == shown([render_markdown(text)])


def test_a_quoted_line_cut_by_a_split_is_quoted_again_in_the_next_chunk() -> None:
    """`> ` quotes one line in Slack: the rest of a long quoted paragraph cut off by a split
    showed unquoted, as if the bot said it."""
    text = "> " + "quoted *words* " * 40 + "\n\nafter"
    chunks = render_chunks(text, "markdown", limit=200)
    assert len(chunks) > 3 and all(len(c) <= 200 for c in chunks)
    for chunk in chunks[:-1]:
        assert chunk.startswith("> "), chunk
        assert "\n" not in chunk and not set(plain_text(chunk[2:])) & set("*>"), chunk
    assert chunks[-1].endswith("\n\nafter")
    assert shown(chunks).replace(">", "") == shown([render_markdown(text)]).replace(">", "")


def test_a_split_prefers_the_space_before_an_emphasis_to_cutting_it() -> None:
    text = "word " * 30 + "**a bold phrase that will not fit**"
    chunks = render_chunks(text, "markdown", limit=170)
    assert chunks == [("word " * 30).strip(), "*a bold phrase that will not fit*"]


def test_a_split_never_cuts_inside_a_user_visible_character() -> None:
    for cluster in CLUSTERS:
        chunks = split_mrkdwn("x" + cluster * (450 // len(cluster)), 101)
        assert all(len(c) <= 101 and whole_clusters(c) for c in chunks), cluster
        assert "".join(chunks) == "x" + cluster * (450 // len(cluster))


def test_a_link_longer_than_a_chunk_is_spelled_out_rather_than_sent_over_the_limit() -> None:
    url = "https://example.com/" + "p" * 200
    chunks = split_mrkdwn(f"see <{url}|docs> now", 100)
    assert all(len(c) <= 100 for c in chunks)
    assert "".join(chunks).replace(" ", "") == f"seedocs({url})now"


words = st.sampled_from(
    ["alpha", "beta", "gamma.", "x", "a&b", "1<2", "😀", *CLUSTERS, "[docs](https://e.com/p)"]
)
paragraphs = emphasised_paragraphs(
    words,
    st.lists(words, min_size=1, max_size=8).map(
        lambda ws: " ".join(ws).replace("[docs](https://e.com/p)", "p")
    ),
)


@settings(max_examples=200, deadline=None)
@given(paragraphs, st.integers(min_value=40, max_value=400))
def test_split_property(source: str, limit: int) -> None:
    """Every chunk fits, shows no stray mark and no part of a character; together they show
    what the whole did."""
    rendered = render_markdown(source)
    chunks = split_mrkdwn(rendered, limit)
    for chunk in chunks:
        assert len(chunk) <= limit, chunk
        assert whole_clusters(plain_text(chunk)), chunk
    assert shown(chunks) == shown([rendered])
