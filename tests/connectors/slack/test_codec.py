"""The Slack codec on payloads from Slack's documentation and captured traffic (see `_source`)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from talkbridge.connectors.slack.codec import (
    Deletion,
    Identity,
    button_blocks,
    channels_to_resolve,
    conversation_name,
    decode,
    joined_channel,
    native_id,
    parse_native_id,
    parse_thread_id,
    renamed_channel,
    thread_id,
    users_to_resolve,
)
from talkbridge.message import NormalizedMessage

PAYLOADS = Path(__file__).parent / "payloads"
ME = Identity(bot_user_id="U0LAN0Z89", bot_id="B0OURS001")


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((PAYLOADS / f"{name}.json").read_text(encoding="utf-8"))
    assert data.pop("_source")
    return data


def message(name: str, **kwargs: Any) -> NormalizedMessage:
    result = decode(load(name), connection_id="team", me=ME, **kwargs)
    assert isinstance(result, NormalizedMessage)
    return result


def test_every_payload_names_its_source() -> None:
    for path in PAYLOADS.glob("*.json"):
        assert json.loads(path.read_text(encoding="utf-8")).get("_source"), path.name


def test_a_direct_message_is_a_private_conversation_keyed_by_the_channel() -> None:
    msg = message("docs_message_im")
    assert msg.id == "D024BE91L:1355517523.000005"
    assert msg.thread_id == "D024BE91L" and msg.thread_type == "private"
    assert msg.channel_user_id == "U2147483697"
    assert msg.text == "Hello hello can you hear me?"
    assert msg.timestamp == datetime.fromtimestamp(1355517523.000005, UTC)
    assert msg.thread_name is None and msg.reply_to is None


def test_a_channel_message_is_a_group_conversation_named_when_known() -> None:
    msg = message("docs_message_channel", channels={"C123ABC456": "general"})
    assert msg.thread_type == "group" and msg.thread_name == "general"
    assert msg.thread_id == "C123ABC456"


def test_a_thread_reply_stays_in_its_thread_with_mentions_and_links_made_readable() -> None:
    msg = message("thread_reply_with_mentions", users={"U0LAN0Z89": "talkbridge"})
    assert msg.thread_id == "C123ABC456:1355517523.000005"
    assert msg.reply_to is not None and msg.reply_to.message_id == "C123ABC456:1355517523.000005"
    # The bot's own mention opening the message is the address, not the question: taken off.
    assert msg.text == "see #general and the doc (https://example.com/a?b=1&c=2), please <3 @here"


def test_app_mention_has_the_same_id_as_its_message_event_so_the_router_dedupes_them() -> None:
    mention = message("docs_app_mention")
    assert mention.id == native_id("C123ABC456", "1515449522.000016")
    assert mention.text == "is it everything a river should be?"  # the bot's mention taken off
    assert users_to_resolve(load("docs_app_mention")) == {"U061F7AUR", "U0LAN0Z89"}


def test_an_edit_is_its_own_message_that_names_the_original() -> None:
    edit = message("docs_message_changed")
    assert edit.edit_of == "C123ABC456:1355517523.000005"
    assert edit.id == "C123ABC456:1355517523.000005:edit:1358878755.000001"
    assert edit.text == "Hello, world!"
    assert edit.timestamp == datetime.fromtimestamp(1358878755.000001, UTC)


def test_a_captured_edit_inside_a_socket_mode_envelope() -> None:
    envelope = load("captured_message_changed_envelope")
    edit = decode(envelope["payload"], connection_id="team", me=ME)
    assert isinstance(edit, NormalizedMessage)
    assert edit.edit_of == "C03BLMUAG8Z:1652635099.971779" and edit.text == "Goodbye world"
    assert edit.thread_type == "group"


def test_an_unfurl_that_changes_no_text_is_not_an_edit() -> None:
    payload = load("captured_message_changed_envelope")["payload"]
    payload["event"]["previous_message"]["text"] = "Goodbye world"
    assert decode(payload, connection_id="team", me=ME) is None


def test_a_delete_is_reported_as_a_deletion_not_a_message() -> None:
    deletion = decode(load("docs_message_deleted"), connection_id="team", me=ME)
    assert isinstance(deletion, Deletion)
    assert (deletion.thread_id, deletion.message_id) == (
        "C123ABC456",
        "C123ABC456:1358878749.000002",
    )


def test_shared_files_become_attachments_resolved_by_file_id() -> None:
    msg = message("captured_file_share_im")
    [file] = msg.attachments
    assert (file.kind, file.name, file.mime_type, file.size, file.ref) == (
        "document",
        "namenamename.txt",
        "text/plain",
        12,
        "F04EEHX1EES",
    )
    assert msg.text == "message message message" and msg.thread_type == "private"


def test_bot_messages_and_our_own_are_ignored() -> None:
    assert decode(load("docs_bot_message"), connection_id="team", me=ME) is None
    own = load("docs_message_channel")
    own["event"]["user"] = ME.bot_user_id
    assert decode(own, connection_id="team", me=ME) is None
    other_app = load("docs_message_channel")
    other_app["event"]["bot_id"] = "B0THER001"
    assert decode(other_app, connection_id="team", me=ME) is None


def test_service_messages_and_other_events_are_not_turns() -> None:
    join = load("docs_message_channel")
    join["event"].update(subtype="channel_join", text="<@U123ABC456> has joined the channel")
    assert decode(join, connection_id="team", me=ME) is None
    assert decode(load("docs_url_verification"), connection_id="team", me=ME) is None
    reaction = load("docs_message_channel")
    reaction["event"] = {"type": "reaction_added", "user": "U1", "reaction": "+1"}
    assert decode(reaction, connection_id="team", me=ME) is None


def test_the_channels_a_payload_would_like_named_and_how_a_conversation_is_named() -> None:
    channel = load("docs_message_channel")
    channel["event"]["text"] = "see <#C0RANDOM01|> and <#C0DOCS0001|docs> and <#C0NEWS0001>"
    assert channels_to_resolve(channel) == {"C123ABC456", "C0RANDOM01", "C0NEWS0001"}
    assert channels_to_resolve(load("docs_message_im")) == set()  # a DM has no name to ask
    assert channels_to_resolve(load("docs_block_actions")) == {"CBR2V3XEX"}
    assert conversation_name({"name": "general"}) == "general"
    assert conversation_name({"is_im": True, "user": "U1"}) is None
    group = {"name": "mpdm-ada--grace--bot-1", "is_mpim": True}
    assert conversation_name(group, ("ada", "Grace Hopper")) == "ada, Grace Hopper"
    assert conversation_name(group) == "group DM"
    click = message("docs_block_actions", channels={"CBR2V3XEX": "reviews"})
    assert click.thread_name == "reviews"  # what conversations.info says now, not the payload


def test_channel_mentions_in_rich_text_blocks_read_their_names() -> None:
    """A Block Kit `channel` element carries only the id: the names are asked for and shown,
    in the message's blocks and in the blocks of a message it shares."""
    payload = load("docs_message_rich_text_channel")
    assert channels_to_resolve(payload) == {"C123ABC456", "C0RANDOM01", "C0DOCS0001"}
    names = {"C123ABC456": "general", "C0RANDOM01": "random", "C0DOCS0001": "docs"}
    msg = message("docs_message_rich_text_channel", channels=names)
    assert msg.text == "moving this to #random, see also:\n- #docs"
    unnamed = message("docs_message_rich_text_channel", channels={"C0RANDOM01": "random"})
    assert unnamed.text == "moving this to #random, see also:\n- #C0DOCS0001"  # unknown: the id
    event = payload["event"]
    shared = {"is_share": True, "author_name": "Grace", "text": "",
              "message_blocks": [{"message": {"blocks": event.pop("blocks")}}]}  # fmt: skip
    event["attachments"] = [shared]
    assert channels_to_resolve(payload) == {"C123ABC456", "C0RANDOM01", "C0DOCS0001"}
    forwarded = decode(payload, connection_id="team", me=ME, channels=names)
    assert isinstance(forwarded, NormalizedMessage)
    assert (
        forwarded.text
        == "Shared message from Grace:\n> moving this to #random, see also:\n> - #docs"
    )


def test_a_button_click_arrives_as_a_message_carrying_the_button_value() -> None:
    click = message("docs_block_actions")
    assert click.id == "action:CBR2V3XEX:1548426417.840180"
    assert click.text == "click_me_123"
    assert click.channel_user_id == "UA8RXUSPL" and click.display_name == "jtorrance"
    assert click.thread_id == "CBR2V3XEX" and click.thread_name == "review-updates"
    assert click.reply_to is not None
    assert click.reply_to.message_id == "CBR2V3XEX:1548261231.000200"


def test_thread_and_message_ids_round_trip_and_refuse_garbage() -> None:
    assert parse_thread_id(thread_id("C1AB", None)) == ("C1AB", None)
    assert parse_thread_id(thread_id("C1AB", "1.000200")) == ("C1AB", "1.000200")
    assert parse_native_id("C1AB:1.000200:edit:2.0") == ("C1AB", "1.000200")
    for bad in ("", "c-lower", "C1AB:notats", "C1AB:"):
        with pytest.raises(ValueError, match="Slack thread id"):
            parse_thread_id(bad)
    with pytest.raises(ValueError, match="Slack message id"):
        parse_native_id("C1AB")


def test_buttons_become_block_kit_with_their_values() -> None:
    blocks = button_blocks("*Pick*", [("Yes", "yes"), ("No", "no")])
    # verbatim: no automatic parsing, so a plain "@here" in the text stays text
    text = {"type": "mrkdwn", "text": "*Pick*", "verbatim": True}
    assert blocks[0] == {"type": "section", "text": text}
    assert [(e["text"]["text"], e["value"]) for e in blocks[1]["elements"]] == [
        ("Yes", "yes"),
        ("No", "no"),
    ]
    with pytest.raises(ValueError, match="button label"):
        button_blocks("x", [("", "v")])
    with pytest.raises(ValueError, match="at most 25"):
        button_blocks("x", [(str(i), str(i)) for i in range(26)])


def test_button_text_over_a_sections_limit_is_refused_not_cut() -> None:
    assert button_blocks("x" * 3000, [("Yes", "yes")])[0]["text"]["text"] == "x" * 3000
    with pytest.raises(ValueError, match="3000"):
        button_blocks("x" * 3001, [("Yes", "yes")])


@pytest.mark.parametrize(
    ("name", "channel"),
    [
        ("docs_channel_rename", "C02ELGNBH"),
        ("docs_group_rename", "G02ELGNBH"),
        ("docs_message_channel_name", "C02ELGNBH"),
        ("docs_message_channel", None),
        ("docs_app_mention", None),
    ],
)
def test_a_rename_names_the_channel_renamed(name: str, channel: str | None) -> None:
    payload = load(name)
    assert renamed_channel(payload) == channel
    if channel is not None:  # a rename is no message for the agent
        assert decode(payload, connection_id="team", me=ME) is None


@pytest.mark.parametrize(
    ("event", "channel"),
    [
        ({"type": "member_joined_channel", "user": "U0LAN0Z89", "channel": "C123ABC456",
          "channel_type": "C", "team": "T123ABC456", "inviter": "U123456789"}, "C123ABC456"),
        ({"type": "member_joined_channel", "user": "U123ABC456", "channel": "C123ABC456",
          "channel_type": "C", "team": "T123ABC456"}, None),  # someone else
        ({"type": "message", "subtype": "channel_join", "user": "U0LAN0Z89",
          "text": "<@U0LAN0Z89> has joined the channel", "channel": "C123ABC456",
          "ts": "1358877458.000011", "channel_type": "channel"}, "C123ABC456"),
        ({"type": "group_joined", "channel": {"id": "G024BE91L", "name": "secretplans"}},
         "G024BE91L"),
    ],
)  # fmt: skip
def test_the_bot_joining_names_the_channel_joined(
    event: dict[str, Any], channel: str | None
) -> None:
    """Shapes from https://docs.slack.dev/reference/events/member_joined_channel/,
    .../message/channel_join/ and .../group_joined/: the bot sees the channel from then on."""
    payload = {"type": "event_callback", "team_id": "T123ABC456", "event": event}
    assert joined_channel(payload, ME) == channel
    assert decode(payload, connection_id="team", me=ME) is None  # no message for the agent
