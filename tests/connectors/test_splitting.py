"""The shared splitting core: user-visible characters, and spans closed and reopened at a cut."""

from __future__ import annotations

from talkbridge.connectors.splitting import Atom, graphemes, split, text_atoms


def test_a_user_visible_character_is_one_grapheme() -> None:
    thumbs = "👍🏽"  # with a skin tone
    family = "👨\u200d👩\u200d👧"  # a ZWJ sequence
    flags = "🇫🇷🇩🇪"  # two regional-indicator pairs
    accented = "e\u0301"  # e with a combining acute
    keycap = "1\ufe0f\u20e3"
    hangul = "\u1100\u1161\u11a8"  # a syllable written as three jamo
    text = f"a{thumbs}{family}{flags}{accented}{keycap}{hangul}\r\nb"
    assert graphemes(text) == [
        "a", thumbs, family, "🇫🇷", "🇩🇪", accented, keycap, hangul, "\r\n", "b"
    ]  # fmt: skip
    assert graphemes("abc") == ["a", "b", "c"]
    assert graphemes("\u200b\u0301") == ["\u200b", "\u0301"]  # nothing joins a format control


def test_a_span_open_at_a_cut_is_closed_and_reopened_with_whitespace_outside_the_marks() -> None:
    def bold(*inner: Atom) -> list[Atom]:
        mark = Atom("*", 1, "open", closer="*", reopen="*", trim=" ")
        return [mark, *inner, Atom("*", 1, "close")]

    atoms = bold(*text_atoms("one two three four five six", len))
    pieces = [piece.text for piece in split(atoms, 16, len)]
    assert pieces == ["*one two three* ", "*four five six*"]
    assert all(len(piece) <= 16 for piece in pieces)


def test_an_atom_larger_than_a_piece_is_cut_into_its_parts() -> None:
    link = Atom("<" + "u" * 30 + ">", 32, parts=tuple(text_atoms("u" * 30, len)))
    pieces = split([*text_atoms("see ", len), link], 20, len)
    assert [p.text for p in pieces] == ["see ", "u" * 20, "u" * 10]
