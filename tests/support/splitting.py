"""What the splitters' tests share: characters of several code points, and generated Markdown
with nested emphasis (hypothesis strategies)."""

from __future__ import annotations

from hypothesis import strategies as st

CLUSTERS = ("👍🏽", "👨\u200d👩\u200d👧", "🇫🇷", "e\u0301", "1\ufe0f\u20e3")
"""Characters of several code points; none of their parts ever appears alone in a test."""


def whole_clusters(text: str) -> bool:
    """Whether `text` holds only whole CLUSTERS: no part of one is left once they are removed."""
    for cluster in CLUSTERS:
        text = text.replace(cluster, "")
    return not set(text) & set("".join(CLUSTERS)) - set("1e")


Node = tuple[str, frozenset[str]]
"""Markdown, and the emphasis marks used in it (a span never nests in one of its own kind)."""


def _wrapped(children: list[Node]) -> st.SearchStrategy[Node]:
    used = frozenset().union(*(marks for _, marks in children))
    inner = " ".join(text for text, _ in children)
    free = [mark for mark in ("**", "_", "~~") if mark not in used]
    if not free:
        return st.just((inner, used))
    return st.sampled_from(free).map(lambda mark: (mark + inner + mark, used | {mark}))


def emphasised_paragraphs(
    words: st.SearchStrategy[str], code: st.SearchStrategy[str]
) -> st.SearchStrategy[str]:
    """Paragraphs of `words` and inline `code` spans, nested in bold, italic and strike."""
    plain_words = st.lists(words, min_size=1, max_size=8).map(" ".join)
    leaves = st.one_of(
        plain_words.map(lambda text: (text, frozenset[str]())),
        code.map(lambda text: ("`" + text + "`", frozenset[str]())),
    )
    markdown = st.recursive(
        leaves,
        lambda inner: st.lists(inner, min_size=1, max_size=4).flatmap(_wrapped),
        max_leaves=12,
    ).map(lambda node: node[0])
    return st.lists(markdown, min_size=1, max_size=12).map(
        lambda parts: "".join(p + (" ", "\n", "\n\n")[i % 3] for i, p in enumerate(parts))
    )
