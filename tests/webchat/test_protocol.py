"""The pure protocol and session rules, without sockets."""

from __future__ import annotations

import json

import pytest

from talkbridge.webchat.protocol import (
    FrameError,
    HistoryFrame,
    SendFrame,
    frame_size,
    parse_frame,
)
from talkbridge.webchat.sessions import Sessions, split_thread


def test_parse_send_ignores_unknown_fields_and_keeps_ref() -> None:
    frame = parse_frame(
        json.dumps(
            {
                "type": "send",
                "thread_id": "a.b",
                "client_id": "c-1",
                "text": "hi",
                "x": 1,
                "ref": "r",
            }
        ),
        4096,
    )
    assert isinstance(frame, SendFrame) and frame.ref == "r" and frame.text == "hi"


def test_history_defaults_and_rejects_negative_seq() -> None:
    frame = parse_frame('{"type": "history", "thread_id": "abc.def"}', 4096)
    assert isinstance(frame, HistoryFrame) and frame.after_seq == 0
    with pytest.raises(FrameError) as err:
        parse_frame('{"type": "history", "thread_id": "abc.def", "after_seq": -1}', 4096)
    assert err.value.code == "bad_frame" and "after_seq" in str(err.value)


def test_size_is_counted_in_utf8_bytes() -> None:
    text = json.dumps({"type": "ping", "ref": "é" * 30}, ensure_ascii=False)
    assert frame_size(text) > len(text)
    with pytest.raises(FrameError) as err:
        parse_frame(text, frame_size(text) - 1)
    assert err.value.code == "too_large"
    parse_frame(text, frame_size(text))


def test_error_frames_carry_the_ref_of_the_bad_frame() -> None:
    with pytest.raises(FrameError) as err:
        parse_frame('{"type": "send", "ref": "r9", "thread_id": "a.b"}', 4096)
    frame = err.value.frame()
    assert frame["type"] == "error" and frame["code"] == "bad_frame" and frame["ref"] == "r9"
    assert "client_id: Field required" in frame["message"]


@pytest.mark.parametrize(
    "thread_id",
    [
        "",
        "abc",
        "0" * 32,
        "0" * 32 + ".",
        "0" * 31 + ".000000000000",
        "G" * 32 + ".000000000000",
        "0" * 32 + ".00000000000g",
        "0" * 32 + ".000000000000.x",
        "0" * 32 + ".000000000000\n",  # `$` alone would let a trailing newline through
        "0" * 32 + "\n.000000000000",
    ],
)
def test_split_thread_rejects_malformed_ids(thread_id: str) -> None:
    assert split_thread(thread_id) is None


def test_split_thread_accepts_issued_shape() -> None:
    assert split_thread("a" * 32 + ".0123456789ab") == ("a" * 32, "0123456789ab")


async def test_sessions_are_bound_to_their_token(sqlite_store: object) -> None:
    sessions = Sessions(sqlite_store)  # type: ignore[arg-type]
    session_id, created = await sessions.authenticate("token-one", None)
    assert created and len(session_id) == 32
    assert await sessions.authenticate("token-one", session_id) == (session_id, False)
    with pytest.raises(FrameError) as err:
        await sessions.authenticate("token-two", session_id)
    assert err.value.code == "forbidden"
    # A fresh process (empty cache) finds the conversations in the store.
    again = Sessions(sqlite_store)  # type: ignore[arg-type]
    [conv] = await again.conversations(session_id)
    assert conv.title == "" and split_thread(conv.as_frame(session_id)["thread_id"])
    renamed = await again.title_from(session_id, conv.id, "  a long\nfirst line " + "x" * 80)
    assert renamed is not None and renamed.title.startswith("a long first line")
    assert len(renamed.title) == 60 and renamed.title.endswith("…")
    assert await again.title_from(session_id, conv.id, "second") is None


@pytest.mark.parametrize(
    ("frame", "says"),
    [
        ({"type": "send", "thread_id": "a.b", "client_id": "c", "text": " \n\t"}, "only spaces"),
        (
            {"type": "send", "thread_id": "a.b", "client_id": "c", "text": "\u00a0\u200b"},
            "invisible",
        ),
        ({"type": "history", "thread_id": "a.b", "limit": "10"}, "limit: Input should be"),
        ({"type": "history", "thread_id": "a.b", "after_seq": 2, "before_seq": 9}, "not both"),
        ({"type": "history", "thread_id": "a.b", "after_seq": 0, "before_seq": 9}, "not both"),
        ({"type": "ping", "ref": "r" * 65}, "ref: String should have at most 64"),
    ],
)
def test_frames_are_refused_with_the_field_named(frame: dict[str, object], says: str) -> None:
    with pytest.raises(FrameError) as err:
        parse_frame(json.dumps(frame), 4096)
    assert says in str(err.value) and "Value error" not in str(err.value)
    # The ids the client chose come back where they are well-formed, and only then.
    fields = err.value.frame()
    assert fields.get("client_id") == frame.get("client_id")
    assert fields.get("ref") is None or len(fields["ref"]) <= 64


async def test_a_title_is_the_first_words_without_markdown_marks(sqlite_store: object) -> None:
    sessions = Sessions(sqlite_store)  # type: ignore[arg-type]
    session_id, _ = await sessions.authenticate("token-one", None)
    [conv] = await sessions.conversations(session_id)
    renamed = await sessions.title_from(session_id, conv.id, "# **Bold** and `code` ~~x~~")
    assert renamed is not None and renamed.title == "Bold and code x"
    [other] = [await sessions.new_conversation(session_id)]
    renamed = await sessions.title_from(session_id, other.id, "***")  # only marks: kept as typed
    assert renamed is not None and renamed.title == "***"


@pytest.mark.parametrize(
    ("first", "kept"),
    [
        ("a" * 58 + "\U0001f468\u200d\U0001f469\u200d\U0001f467 family", "a" * 58),
        ("b" * 58 + "\U0001f1e9\U0001f1ea\U0001f1ef\U0001f1f5 flags", "b" * 58),
        (
            "d" * 57 + "\U0001f1e9\U0001f1ea\U0001f1ef\U0001f1f5 flags",
            "d" * 57 + "\U0001f1e9\U0001f1ea",
        ),
        ("e" * 58 + "\U0001f44d\U0001f3fd thumbs", "e" * 58),
        ("f" * 58 + "e\u0301\u0301 accents", "f" * 58),
    ],
)
def test_a_long_title_is_never_cut_inside_a_character(first: str, kept: str) -> None:
    from talkbridge.webchat.sessions import _title

    assert _title(first) == kept + "…"


async def test_a_session_of_the_generated_tokens_hash_moves_to_its_holder(
    sqlite_store: object,
) -> None:
    from talkbridge.webchat.auth import GENERATED_IDENTITY
    from talkbridge.webchat.sessions import token_hash

    sessions = Sessions(sqlite_store)  # type: ignore[arg-type]
    old, _ = await sessions.authenticate(token_hash("the-old-generated-token"), None)
    moved = await sessions.authenticate(
        GENERATED_IDENTITY, old, earlier_identity=token_hash("the-old-generated-token")
    )
    assert moved == (old, False)
    assert await sessions.authenticate(GENERATED_IDENTITY, old) == (old, False)  # for good
    with pytest.raises(FrameError):  # another token's session never moves
        other, _ = await sessions.authenticate(token_hash("someone-else"), None)
        await sessions.authenticate(
            GENERATED_IDENTITY, other, earlier_identity=token_hash("the-old-generated-token")
        )
