"""Markdown -> mrkdwn, splitting, and mrkdwn -> readable text."""

from __future__ import annotations

from talkbridge.connectors.slack.mrkdwn import (
    plain_text,
    render,
    render_chunks,
    render_markdown,
    split_mrkdwn,
)


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
