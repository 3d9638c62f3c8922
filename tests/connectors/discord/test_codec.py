"""The pure Discord codec and renderer, on payloads from Discord's developer documentation."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import discord
import pytest
from pydantic import ValidationError

from talkbridge.connectors.discord.codec import (
    ChannelInfo,
    DiscordEvent,
    Names,
    addressed_to_bot,
    check_buttons,
    decode_delete,
    decode_event,
    decode_message,
    parse_native_id,
)
from talkbridge.connectors.discord.config import DiscordConfig
from talkbridge.connectors.discord.errors import translate
from talkbridge.connectors.discord.render import escape_markdown, split_message
from talkbridge.errors import UnauthorizedError
from talkbridge.message import NormalizedMessage

PAYLOADS = Path(__file__).parent / "payloads"


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((PAYLOADS / name).read_text(encoding="utf-8"))
    assert data.pop("_source")
    return data


def test_the_documented_example_message_decodes_as_a_dm() -> None:
    message = decode_message(load("message_example.json"), connection_id="c")
    assert message is not None
    assert message.id == "290926798999357250:334385199974967042"
    assert message.thread_id == "290926798999357250" and message.thread_type == "private"
    assert message.text == "Supa Hot" and message.display_name == "Mason"
    assert message.channel_user_id == "53908099506183680"
    assert message.timestamp.isoformat() == "2017-07-11T17:27:07.299000+00:00"
    assert isinstance(message.raw_event, DiscordEvent)
    assert parse_native_id(message.id) == (290926798999357250, 334385199974967042)


def test_a_crosspost_is_not_a_reply_and_channel_mentions_read_as_names() -> None:
    message = decode_message(load("crossposted_message.json"), connection_id="c")
    assert message is not None
    assert message.reply_to is None  # message_reference of a crosspost, not a reply
    assert message.text == "Big news! In this #big-news channel!"


def test_a_reply_in_a_guild_thread_keeps_its_thread_and_reference() -> None:
    original = load("message_example.json")
    reply = {
        **load("message_example.json"),
        "id": "334385199974967050",
        "type": 19,
        "guild_id": "41771983423143937",
        "channel_id": "900",
        "member": {"nick": "Masy", "roles": []},
        "content": "agreed <@53908099506183680>, ask <@&77> <:blobcat:12345>",
        "mentions": [{**original["author"], "global_name": "Mason G"}],
        "mention_roles": ["77"],
        "message_reference": {"type": 0, "message_id": original["id"], "channel_id": "900"},
        "referenced_message": original,
    }
    names = Names({"900": ChannelInfo("bugs", "800", "help")}, {"77": "Helpers"})
    message = decode_message(reply, connection_id="c", names=names, role_names=("Helpers",))
    assert message is not None
    assert message.thread_id == "900" and message.thread_name == "#help / bugs"
    assert message.thread_type == "group" and message.display_name == "Masy"
    assert message.text == "agreed @Mason G, ask @Helpers :blobcat:"
    assert message.reply_to is not None
    assert message.reply_to.message_id == f"900:{original['id']}"
    assert message.reply_to.content == "Supa Hot" and message.reply_to.sender_name == "Mason"


def test_an_edit_gets_its_own_id_and_names_the_original() -> None:
    edited = {**load("message_example.json"), "edited_timestamp": "2017-07-11T17:30:00+00:00"}
    message = decode_event("MESSAGE_UPDATE", edited, connection_id="c")
    assert message is not None
    assert message.edit_of == "290926798999357250:334385199974967042"
    assert message.id == f"{message.edit_of}:edit:2017-07-11T17:30:00+00:00"
    # An embed unfurl is a MESSAGE_UPDATE without an edit: not a new turn.
    assert decode_event("MESSAGE_UPDATE", load("message_example.json"), connection_id="c") is None


@pytest.mark.parametrize(
    "change",
    [
        {"author": {"id": "1", "username": "b", "bot": True}},
        {"webhook_id": "5"},
        {"type": 7},  # a member join
        {"content": "", "attachments": []},
    ],
)
def test_bots_webhooks_system_and_empty_messages_are_ignored(change: dict[str, Any]) -> None:
    assert decode_message({**load("message_example.json"), **change}, connection_id="c") is None


def test_our_own_message_is_ignored_even_without_the_bot_flag() -> None:
    payload = load("message_example.json")
    assert decode_message(payload, connection_id="c", bot_id=53908099506183680) is None


def test_attachments_embeds_and_voice_messages() -> None:
    payload = {
        **load("message_example.json"),
        "content": "",
        "flags": 1 << 13,
        "attachments": [
            {"id": "1", "filename": "voice-message.ogg", "size": 9, "url": "https://cdn/v.ogg",
             "content_type": "audio/ogg", "duration_secs": 3.2},
            {"id": "2", "filename": "a.png", "size": 5, "url": "https://cdn/a.png",
             "content_type": "image/png", "width": 2, "height": 2},
        ],
        "embeds": [{"title": "Build", "description": "passed", "fields": [{"name": "time",
                    "value": "3m"}], "footer": {"text": "ci"}}],
    }  # fmt: skip
    message = decode_message(payload, connection_id="c")
    assert message is not None
    assert message.text == "Build\npassed\ntime: 3m\nci"
    assert [(a.kind, a.name, a.ref) for a in message.attachments] == [
        ("voice", "voice-message.ogg", "https://cdn/v.ogg"),
        ("image", "a.png", "https://cdn/a.png"),
    ]


def test_the_documented_button_click_becomes_a_message_with_its_value() -> None:
    message = decode_event("INTERACTION_CREATE", load("button_interaction.json"), connection_id="c")
    assert message is not None
    assert message.id == "ia:846462639134605312" and message.text == "click_one"
    assert message.channel_user_id == "53908232506183680" and message.thread_type == "group"
    assert message.thread_id == "345626669114982999"
    assert message.reply_to is not None
    assert message.reply_to.message_id == "345626669114982999:844397162624450620"
    slash = {**load("button_interaction.json"), "type": 2}
    assert decode_event("INTERACTION_CREATE", slash, connection_id="c") is None


def test_addressed_to_bot_and_deletes() -> None:
    payload = load("message_example.json")
    assert not addressed_to_bot({**payload, "mention_everyone": True}, 42)
    assert addressed_to_bot({**payload, "mentions": [{"id": "42"}]}, 42)
    assert addressed_to_bot({**payload, "mention_roles": ["9"]}, 42, ("9",))
    replied = {**payload, "referenced_message": {"author": {"id": "42"}}}
    assert addressed_to_bot(replied, 42)
    assert decode_delete({"id": "2", "channel_id": "1", "guild_id": "3"}) == ("1", "1:2")


def test_role_names_trust_only_in_the_server_the_entry_names() -> None:
    config = DiscordConfig(id="d", token="abc.def", trusted=("123", "4001/moderators"))
    ours = {**load("message_example.json"), "guild_id": "4001"}
    moderator = decode_message(ours, connection_id="d", role_names=("Moderators",))
    plain = decode_message(ours, connection_id="d")
    # Anyone can add the bot to a server of their own and give themselves a role of that name.
    theirs = {**ours, "guild_id": "6660"}
    impostor = decode_message(theirs, connection_id="d", role_names=("Moderators",))
    direct = decode_message(load("message_example.json"), connection_id="d", role_names=("x",))
    assert moderator is not None and plain is not None and impostor is not None
    assert config.trusts_message(moderator) and not config.trusts_message(plain)
    # As stored (the Redis inbound bus, a message recovered after a crash): still trusted.
    stored = NormalizedMessage.model_validate_json(moderator.model_dump_json())
    assert config.trusts_message(stored)
    assert not config.trusts_message(impostor)
    assert direct is not None and not config.trusts_message(direct)
    assert config.trusted_roles() == (("4001", "moderators"),)


@pytest.mark.parametrize("entry", ["Moderators", "Mod*", "*/Moderators", "4001/"])
def test_a_role_that_names_no_server_is_a_config_error(entry: str) -> None:
    with pytest.raises(ValidationError, match="must name its server"):
        DiscordConfig(id="d", token="abc.def", trusted=("123", entry))
    assert DiscordConfig(id="d", token="abc.def", trusted=("12*", "*")).trusted_roles() == ()


def test_config_refuses_a_token_with_the_bot_prefix_without_quoting_it() -> None:
    with pytest.raises(ValidationError) as caught:
        DiscordConfig(id="d", token="Bot secret-value")
    assert "secret-value" not in str(caught.value.errors(include_input=False))
    with pytest.raises(ValueError, match="ws://"):
        DiscordConfig(id="d", token="t", gateway_url="http://x")
    with pytest.raises(ValueError, match="is empty"):  # DISCORD_TOKEN= set to nothing
        DiscordConfig(id="d", token="")


def test_a_gateway_refusing_the_token_says_so_with_its_close_code() -> None:
    closed = discord.ConnectionClosed(SimpleNamespace(close_code=4004), shard_id=None, code=4004)
    error = translate(closed, "tok")
    assert isinstance(error, UnauthorizedError) and "close code 4004" in str(error)


def test_buttons_are_checked_against_discords_limits() -> None:
    check_buttons([("Yes", "y")])
    with pytest.raises(ValueError, match="custom_id"):
        check_buttons([("Yes", "y" * 101)])
    with pytest.raises(ValueError, match="at most 25"):
        check_buttons([("b", "v")] * 26)


# ---- rendering --------------------------------------------------------------------------------


def test_plain_text_is_escaped_to_show_literally() -> None:
    assert escape_markdown("*a* _b_ `c` > d # e") == r"\*a\* \_b\_ \`c\` \> d \# e"


def test_short_text_is_one_chunk_and_blank_text_none() -> None:
    assert split_message("hi") == ["hi"]
    assert split_message("  \n ") == []


def test_splitting_prefers_blank_lines_and_respects_the_limit() -> None:
    text = "\n\n".join(f"paragraph {i} " + "w" * 80 for i in range(40))
    chunks = split_message(text, 500)
    assert all(len(c) <= 500 for c in chunks)
    assert all(c.startswith("paragraph") and c.endswith("w") for c in chunks)
    assert "\n\n".join(chunks) == text


def test_a_fence_open_at_a_cut_is_closed_and_reopened_with_its_language() -> None:
    code = "\n".join(f"x{i} = {i}" for i in range(200))
    text = f"before\n~~~rust\n{code}\n~~~\nafter"
    chunks = split_message(text, 300)
    assert len(chunks) > 3
    for chunk in chunks:
        assert len(chunk) <= 300
        assert chunk.count("~~~") % 2 == 0
    assert all(c.startswith("~~~rust\n") for c in chunks[1:])
    lines = [ln for c in chunks for ln in c.split("\n") if ln.startswith("x")]
    assert lines == [f"x{i} = {i}" for i in range(200)]


def test_a_line_longer_than_a_chunk_is_cut_at_spaces() -> None:
    words = " ".join(f"word{i}" for i in range(400))
    chunks = split_message(words, 200)
    assert all(len(c) <= 200 for c in chunks)
    assert "".join(chunks) == words


def test_astral_characters_count_double_like_discord() -> None:
    chunks = split_message("😀" * 1500)
    assert len(chunks) == 2 and all(len(c) * 2 <= 2000 for c in chunks)
