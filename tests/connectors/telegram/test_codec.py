"""The pure codec on real Update payloads (each file's `_source` says where it came from)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from talkbridge.connectors.telegram.codec import (
    AlbumKey,
    album_edit,
    album_item,
    decode_update,
    edited_item,
    inline_keyboard,
    merge_album,
    parse_native_id,
    parse_thread_id,
    update_chat,
)
from talkbridge.message import NormalizedMessage

PAYLOADS = Path(__file__).parent / "payloads"
DOC_FILE = "AwADBAADbXXXXXXXXXXXGBdhD2l6_XX"  # the file_id the documentation examples use


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((PAYLOADS / name).read_text(encoding="utf-8"))
    assert data.pop("_source"), f"{name} must say where it came from"
    return data


def decode(name: str, bot_id: int | None = 123456) -> NormalizedMessage | None:
    return decode_update(load(name), connection_id="tg", bot_id=bot_id)


def must(name: str, bot_id: int | None = 123456) -> NormalizedMessage:
    message = decode(name, bot_id)
    assert message is not None, name
    return message


def test_every_payload_names_its_source() -> None:
    for path in PAYLOADS.glob("*.json"):
        assert json.loads(path.read_text(encoding="utf-8")).get("_source"), path.name


def test_private_text_message() -> None:
    msg = must("docs_text.json")
    assert msg.id == "1111111:1365"
    assert msg.connection_id == "tg" and msg.channel == "telegram"
    assert msg.channel_user_id == "1111111"
    assert msg.display_name == "Test Firstname Test Lastname"
    assert msg.thread_id == "1111111"
    assert msg.thread_type == "private" and msg.thread_name is None
    assert msg.timestamp == datetime.fromtimestamp(1441645532, UTC)
    assert msg.text == "/start"  # bot commands arrive as text
    assert msg.edit_of is None and msg.reply_to is None and msg.attachments == ()


def test_entities_are_removed_leaving_plain_text() -> None:
    assert must("docs_entities.json").text == "Bold and italics"


def test_a_hidden_link_is_spelled_out_after_its_words() -> None:
    # Offsets count UTF-16 units: the emoji before the link takes two.
    message = {
        "message_id": 7,
        "from": {"id": 777, "is_bot": False, "first_name": "Ada"},
        "chat": {"id": 777, "type": "private", "first_name": "Ada"},
        "date": 1700000000,
        "text": "👋 read the docs, then https://x.test/faq",
        "entities": [
            {"type": "bold", "offset": 0, "length": 2},
            {"type": "text_link", "offset": 8, "length": 8, "url": "https://x.test/docs"},
            {"type": "url", "offset": 23, "length": 18},
        ],
    }
    decoded = decode_update({"update_id": 1, "message": message}, connection_id="tg")
    assert decoded is not None
    assert decoded.text == "👋 read the docs (https://x.test/docs), then https://x.test/faq"
    caption = {
        **{k: v for k, v in message.items() if k not in ("text", "entities")},
        "photo": [{"file_id": "P", "file_unique_id": "p", "width": 1, "height": 1}],
        "caption": "🖼 source",
        "caption_entities": [{"type": "text_link", "offset": 3, "length": 6, "url": "tg://x"}],
    }
    decoded = decode_update({"update_id": 2, "message": caption}, connection_id="tg")
    assert decoded is not None and decoded.text == "🖼 source (tg://x)"
    broken = {
        **message,
        "entities": [{"type": "text_link", "offset": 30, "length": 99, "url": "u"}],
    }
    decoded = decode_update({"update_id": 3, "message": broken}, connection_id="tg")
    assert decoded is not None and decoded.text == message["text"]


def test_forwarded_message_keeps_its_text() -> None:
    assert must("docs_forwarded.json").text == "/start"


def test_reply_carries_quoted_text_and_sender() -> None:
    reply = must("docs_reply.json").reply_to
    assert reply is not None
    assert reply.message_id == "1111112:1334"
    assert reply.content == "Original"


def test_reply_with_quote_prefers_the_quoted_part() -> None:
    msg = must("group_reply_with_quote.json")
    assert msg.thread_type == "group" and msg.thread_id == "-42"
    assert msg.thread_name == "Old group"
    assert msg.reply_to is not None
    assert msg.reply_to.content == "Step two."
    assert msg.reply_to.sender_name == "Grace Hopper"
    assert msg.reply_to.message_id == "-42:70"


def test_edited_message_is_an_edit_of_the_original_with_its_own_id() -> None:
    msg = must("docs_edited.json")
    original = must("docs_text.json")
    assert msg.edit_of == original.id == "1111111:1365"
    assert msg.id == "1111111:1365:edit:1441646600"
    assert msg.text == "Edited text"
    assert msg.timestamp == datetime.fromtimestamp(1441646600, UTC)


@pytest.mark.parametrize(
    ("name", "kind", "ref", "mime", "size", "label"),
    [
        ("docs_audio.json", "audio", DOC_FILE, "audio/mpeg", 3897500, "Test music file"),
        ("docs_voice.json", "voice", DOC_FILE, "audio/ogg", 23000, None),
        ("docs_document.json", "document", DOC_FILE, "application/pdf", 536392, "Testfile.pdf"),
        ("sticker.json", "sticker", "CAACAgSticker", None, 23000, None),
        ("video_caption.json", "video", "BAACAgVideo", "video/mp4", 700000, None),
    ],
)  # fmt: skip
def test_file_attachments(
    name: str, kind: str, ref: str, mime: str | None, size: int, label: str | None
) -> None:
    msg = must(name)
    assert len(msg.attachments) == 1
    attachment = msg.attachments[0]
    assert (attachment.kind, attachment.ref, attachment.mime_type, attachment.size) == (
        kind,
        ref,
        mime,
        size,
    )
    assert attachment.name == label


def test_group_photo_takes_the_largest_size_and_the_caption() -> None:
    msg = must("group_photo_caption.json")
    assert msg.text == "Error on checkout page"
    assert msg.thread_id == "-1001234567890" and msg.thread_type == "group"
    assert msg.thread_name == "Support"
    [photo] = msg.attachments
    assert photo.kind == "image" and photo.ref == "AgACAgLarge" and photo.size == 98000


def test_video_caption_is_the_text() -> None:
    assert must("video_caption.json").text == "screen recording"


def test_venue_and_contact_are_structured_attachments() -> None:
    [place] = must("venue.json").attachments
    assert place.kind == "location" and place.ref is None
    assert place.meta == {
        "latitude": 52.52,
        "longitude": 13.405,
        "title": "Alexanderplatz",
        "address": "Berlin",
    }
    [contact] = must("contact.json").attachments
    assert contact.kind == "contact" and contact.name == "Ada Lovelace"
    assert contact.meta["phone_number"] == "+15551234567" and contact.meta["user_id"] == 777


def test_forum_topic_message_keeps_chat_and_topic_and_is_no_reply() -> None:
    msg = must("forum_topic_message.json")
    assert msg.thread_id == "-1001971186208:2391"
    assert msg.id == "-1001971186208:2410"
    assert msg.thread_type == "group"
    assert msg.thread_name == "Тест / Тестовая тема 62658df2-1bcc-4e17-8909-4afc3091c0d1"
    # Telegram makes every topic message a reply to the topic's creation; that is not a reply.
    assert msg.reply_to is None
    assert parse_thread_id(msg.thread_id) == (-1001971186208, 2391)


def test_channel_post_is_a_group_message_signed_by_its_author() -> None:
    msg = must("channel_post.json")
    assert msg.thread_id == "-1001893407333" and msg.thread_type == "group"
    assert msg.channel_user_id == "-1001893407333"
    assert msg.display_name == "Editor"
    assert msg.text == "Release 1.2 is out"


def test_a_message_sent_on_behalf_of_a_chat_is_from_that_chat_not_the_placeholder_user() -> None:
    # Trusting the placeholder `from` would trust every channel that posts in any group.
    msg = must("group_message_sent_as_channel.json")
    assert msg.channel_user_id == "-1001111111111" and msg.display_name == "Some channel"
    assert msg.thread_id == "-1002222222222"


def test_display_name_falls_back_to_username() -> None:
    assert must("username_only_sender.json").display_name == "@anon_dev"


def test_service_messages_and_other_update_kinds_are_not_messages() -> None:
    assert decode("captured_channel_pin.json") is None
    assert decode("captured_forum_topic_edited.json", bot_id=None) is None
    assert decode("docs_inline_query.json") is None


def test_the_bots_own_updates_are_ignored() -> None:
    assert decode("docs_text.json", bot_id=1111111) is None
    assert decode("docs_edited.json", bot_id=1111111) is None
    assert decode("docs_text.json", bot_id=999) is not None


def test_callback_query_becomes_a_message_whose_text_is_the_value() -> None:
    msg = must("callback_query_group.json")
    assert msg.id == "cb:9988776655"
    assert msg.text == "approve:17"
    assert msg.channel_user_id == "424242" and msg.display_name == "Grace Hopper"
    assert msg.thread_id == "-1001234567890" and msg.thread_type == "group"
    assert msg.reply_to is not None and msg.reply_to.message_id == "-1001234567890:90"


def test_callback_on_an_inline_message_is_answered_privately() -> None:
    msg = must("docs_callback_query.json")
    assert msg.text == "Data from button callback"
    assert msg.thread_id == "1111111" and msg.thread_type == "private"


def test_decodes_an_aiogram_update_the_same_as_its_json() -> None:
    from aiogram.types import Update

    data = load("group_photo_caption.json")
    from_model = decode_update(Update.model_validate(data), connection_id="tg")
    from_json = decode_update(data, connection_id="tg")
    assert from_model is not None and from_json is not None
    assert from_model.model_dump() == from_json.model_dump()


def test_ids_parse_back() -> None:
    assert parse_native_id("-100123:77") == (-100123, 77)
    assert parse_native_id("-100123:77:edit:5") == (-100123, 77)
    assert parse_thread_id("42") == (42, None)
    assert parse_thread_id("@channel") == ("@channel", None)
    for bad in ("abc", "1:x", "cb:123"):
        with pytest.raises(ValueError, match="Telegram"):
            parse_native_id(bad) if ":" in bad else parse_thread_id(bad)


def test_inline_keyboard_refuses_values_over_64_bytes() -> None:
    assert inline_keyboard([("Yes", "y"), ("No", "n")]) == [
        [{"text": "Yes", "callback_data": "y"}],
        [{"text": "No", "callback_data": "n"}],
    ]
    with pytest.raises(ValueError, match="64 bytes"):
        inline_keyboard([("Long", "x" * 65)])


# ---- albums -----------------------------------------------------------------------------------


def album_update(message_id: int, file_id: str, **extra: Any) -> dict[str, Any]:
    """One item of the album 555 in the group -100777, as the Bot API sends it."""
    return {
        "update_id": 9000 + message_id,
        "message": {
            "message_id": message_id,
            "from": {"id": 42, "is_bot": False, "first_name": "Grace"},
            "chat": {"id": -100777, "type": "supergroup", "title": "Team"},
            "date": 1700000000 + message_id,
            "media_group_id": "555",
            "photo": [
                {"file_id": file_id, "file_unique_id": f"u{file_id}", "width": 9, "height": 9}
            ],
            **extra,
        },
    }


def decoded(update: dict[str, Any]) -> NormalizedMessage:
    message = decode_update(update, connection_id="tg")
    assert message is not None
    return message


def test_an_album_item_names_its_album_and_itself() -> None:
    item = album_update(12, "A")
    assert album_item(item) == (AlbumKey("-100777", "555"), "-100777:12")
    assert album_item({"update_id": 1, "channel_post": item["message"]}) is not None
    assert album_item(load("group_photo_caption.json")) is None  # a photo alone
    assert album_item({"update_id": 2, "edited_message": item["message"]}) is None
    assert album_item(item, bot_id=42) is None  # the bot's own album is never delivered
    assert album_item({"update_id": 3, "message": {**item["message"], "chat": 7}}) is None


def test_an_album_is_one_message_with_its_caption_and_every_attachment_in_order() -> None:
    reply = {"message_id": 3, "chat": {"id": -100777}, "text": "send the photos"}
    items = [
        album_update(13, "C"),
        album_update(11, "A", caption="Before and after", reply_to_message=reply),
        album_update(12, "B"),
    ]
    merged = merge_album([decoded(u) for u in items])  # in any order
    assert merged.id == "-100777:11"  # the first item: what a reply quotes
    assert merged.text == "Before and after"
    assert [a.ref for a in merged.attachments] == ["A", "B", "C"]
    assert merged.timestamp == datetime.fromtimestamp(1700000011, UTC)
    assert merged.reply_to is not None and merged.reply_to.message_id == "-100777:3"
    assert merged.thread_id == "-100777" and merged.channel_user_id == "42"
    assert merged.raw_event == (items[1], items[2], items[0])


def test_the_captions_of_a_documents_album_are_one_paragraph_each() -> None:
    first = album_update(21, "A", caption="the contract")
    second = album_update(22, "B", caption="the annex")
    merged = merge_album([decoded(first), decoded(second)])
    assert merged.text == "the contract\n\nthe annex"
    with pytest.raises(ValueError, match="at least one item"):
        merge_album([])


def test_an_edit_of_an_item_becomes_an_edit_of_the_album() -> None:
    items = [album_update(31, "A", caption="Holiday"), album_update(32, "B")]
    changed = {**items[1]["message"], "caption": "the beach", "edit_date": 1700009999}
    update = {"update_id": 9999, "edited_message": changed}
    as_item = edited_item(update)
    assert as_item == {"update_id": 9999, "message": changed}
    assert edited_item(load("docs_edited.json")) is None  # no album's
    album = merge_album([decoded(items[0]), decoded(as_item)])
    edit = album_edit(album, decoded(update))
    assert edit.id == "-100777:32:edit:1700009999" and edit.edit_of == "-100777:31"
    assert edit.text == "Holiday\n\nthe beach" and [a.ref for a in edit.attachments] == ["A", "B"]
    assert edit.timestamp == datetime.fromtimestamp(1700009999, UTC)


def test_the_chat_of_an_update() -> None:
    assert update_chat(album_update(1, "A")) == "-100777"
    assert update_chat(load("callback_query_group.json")) == "-1001234567890"
    assert update_chat(load("docs_inline_query.json")) is None


def test_a_venue_and_a_contact_read_as_text_and_keep_their_attachments() -> None:
    venue, contact = must("venue.json"), must("contact.json")
    assert venue.text == "Venue: Alexanderplatz, Berlin" and venue.attachments[0].kind == "location"
    assert contact.text.startswith("Contact: Ada Lovelace") and contact.attachments


def test_a_quiz_and_a_web_apps_data_read_as_text() -> None:
    base = load("docs_text.json")
    del base["message"]["text"]
    quiz = {"question": "2+2?", "type": "quiz", "options": [{"text": "4"}, {"text": "5"}]}
    asked = decode_update(
        {**base, "message": {**base["message"], "poll": quiz}}, connection_id="tg"
    )
    assert asked is not None and asked.text == "Quiz: 2+2?\n- 4\n- 5"
    sent = {"data": '{"size": "L"}', "button_text": "Order"}
    data = decode_update(
        {**base, "message": {**base["message"], "web_app_data": sent}}, connection_id="tg"
    )
    assert data is not None and data.text == '{"size": "L"}'
