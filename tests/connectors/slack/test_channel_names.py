"""Inbound messages name their conversation (`thread_name`) and the channels they mention, from
`conversations.info` asked once per channel per `channel_cache_seconds`, never per message."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import pytest

from tests.peers.slack import SlackPeer, edit_event, message_event

BOT = "<@U0BOT0001> "
"""Channel messages reach the bot when they mention it (`require_mention`)."""


def _in(channel: str, text: str, **extra: Any) -> dict[str, Any]:
    return message_event("U0ADA0001", BOT + text, channel=channel, **extra)


async def test_channel_messages_carry_the_channel_name_asked_once_per_channel(
    peer: SlackPeer, start: Callable[..., Any]
) -> None:
    peer.add_conversation("C0GENERAL1", "general")
    peer.add_conversation("C0RANDOM01", "random")
    run = await start()
    first = _in("C0GENERAL1", "see <#C0RANDOM01|>")  # Slack's usual form: the label left empty
    for event in (
        first,
        _in("C0GENERAL1", "and <#C0RANDOM01>"),
        _in("C0RANDOM01", "hello"),
        edit_event(first, BOT + "see <#C0RANDOM01|> now", "1800000000.000001"),
        message_event("U0ADA0001", "a DM has no channel name to ask for"),
    ):
        await peer.send_event(event)
    messages = await run.inbox.wait_count(5)
    assert [(m.thread_name, m.text) for m in messages] == [
        ("general", "see #random"),
        ("general", "and #random"),
        ("random", "hello"),
        ("general", "see #random now"),
        (None, "a DM has no channel name to ask for"),
    ]
    asked = [c.params["channel"] for c in peer.calls_of("conversations.info", ok=None)]
    assert sorted(asked) == ["C0GENERAL1", "C0RANDOM01"]


async def test_a_group_dm_is_named_by_its_members_not_mpdm(
    peer: SlackPeer, start: Callable[..., Any]
) -> None:
    peer.add_conversation(
        "G0GROUP001", "mpdm-ada--grace.hopper--bot-1", is_mpim=True, is_private=True,
        members=["U0ADA0001", "U0GRACE01", "U0BOT0001"],
    )  # fmt: skip
    peer.add_conversation("G0GROUP002", "mpdm-ada--bot-1", is_mpim=True, is_private=True)
    peer.fail_next("conversations.members", error="missing_scope", needed="mpim:read", after=1)
    run = await start()
    for channel in ("G0GROUP001", "G0GROUP002", "G0GROUP001"):
        await peer.send_event(_in(channel, "hi", channel_type="mpim"))
    messages = await run.inbox.wait_count(3)
    assert [m.thread_name for m in messages] == [
        "ada, Grace Hopper",
        "group DM",
        "ada, Grace Hopper",
    ]
    assert all(m.thread_type == "group" for m in messages)
    directory = await run.connector.thread("G0GROUP001")
    assert directory is not None and directory.name == "ada, Grace Hopper"
    assert len(peer.calls_of("conversations.info")) == 2  # the directory's from the cache too
    assert len(peer.calls_of("conversations.members", ok=None)) == 2


async def test_a_failed_lookup_delivers_the_message_without_the_name(
    peer: SlackPeer, start: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    peer.add_conversation("C0GENERAL1", "general")
    peer.fail_next("conversations.info", error="missing_scope", needed="channels:read")
    run = await start()
    with caplog.at_level(logging.DEBUG, logger="test"):
        await peer.send_event(_in("C0GENERAL1", "first"))
        [first] = await run.inbox.wait_count(1)
    assert (first.thread_name, first.text) == (None, "first")
    assert any(
        r.levelno == logging.DEBUG and "conversations.info C0GENERAL1 failed" in r.getMessage()
        for r in caplog.records
    )
    await peer.send_event(_in("C0GENERAL1", "second"))  # not kept: asked again, and found
    second = (await run.inbox.wait_count(2))[1]
    assert second.thread_name == "general"


async def test_a_slow_lookup_holds_no_message_back_and_is_not_asked_again(
    peer: SlackPeer, start: Callable[..., Any]
) -> None:
    peer.add_conversation("C0GENERAL1", "general")
    run = await start()
    peer.hold("conversations.info")  # Slack wants its ack within 3 s; no answer comes
    envelopes = [await peer.send_event(_in("C0GENERAL1", f"m{i}")) for i in range(3)]
    for envelope in envelopes:
        await peer.wait_ack(envelope)
    assert [m.thread_name for m in run.inbox.messages] == [None] * 3
    assert len(peer.calls_of("conversations.info", ok=None)) == 1
    peer.release("conversations.info")
    names: list[str | None] = []
    while "general" not in names:  # once the one lookup under way is answered
        await peer.send_event(_in("C0GENERAL1", "again"))
        names.append((await run.inbox.wait_count(len(run.inbox.messages) + 1))[-1].thread_name)
    assert len(peer.calls_of("conversations.info", ok=None)) == 1  # not asked again meanwhile


def _joined(channel: str, user: str = "U0BOT0001") -> dict[str, Any]:
    """Slack's `member_joined_channel` event (the bot, by default, invited to `channel`)."""
    return {"type": "member_joined_channel", "user": user, "channel": channel,
            "channel_type": "C", "team": "T0ACME001", "inviter": "U0ADA0001"}  # fmt: skip


async def test_a_channel_the_bot_cannot_see_is_not_asked_for_on_every_mention(
    peer: SlackPeer, start: Callable[..., Any], make_connector: Callable[..., Any]
) -> None:
    """Anyone can mention a channel the bot cannot see: asking on each mention would spend the
    tier-3 budget. "Not found" is kept a while, until the bot is invited there."""
    peer.add_conversation("C0GENERAL1", "general")
    run = await start()
    for index in range(3):
        await peer.send_event(_in("C0GENERAL1", f"look at <#C0SECRET01|> {index}"))
    messages = await run.inbox.wait_count(3)
    assert [m.text for m in messages][-1] == "look at #C0SECRET01 2"
    assert await run.connector.thread("C0SECRET01") is None  # the directory: not asked either
    asked = [c.params["channel"] for c in peer.calls_of("conversations.info", ok=None)]
    assert sorted(asked) == ["C0GENERAL1", "C0SECRET01"]

    # Someone else joining changes nothing; the bot invited sees the channel at once.
    peer.add_conversation("C0SECRET01", "secret")
    await peer.wait_ack(await peer.send_event(_joined("C0SECRET01", user="U0GRACE01")))
    await peer.send_event(_in("C0GENERAL1", "still <#C0SECRET01|>"))
    assert (await run.inbox.wait_count(4))[-1].text == "still #C0SECRET01"
    await peer.wait_ack(await peer.send_event(_joined("C0SECRET01")))
    await peer.send_event(_in("C0GENERAL1", "now <#C0SECRET01|>"))
    assert (await run.inbox.wait_count(5))[-1].text == "now #secret"
    assert len(peer.calls_of("conversations.info", ok=None)) == 3

    # Kept `channel_cache_seconds` at most: 0 keeps nothing, not-found included.
    uncached = make_connector(channel_cache_seconds=0)
    assert await uncached.thread("C0NOWHERE1") is None
    assert await uncached.thread("C0NOWHERE1") is None
    assert len(peer.calls_of("conversations.info", ok=None)) == 5
    await uncached.close()


def _renamed(channel: str, name: str) -> dict[str, Any]:
    """Slack's `channel_rename` event."""
    return {
        "type": "channel_rename",
        "channel": {"id": channel, "name": name, "created": 1360782804},
    }


async def test_a_rename_while_the_name_is_being_asked_for_wins(
    peer: SlackPeer, start: Callable[..., Any]
) -> None:
    """An answer asked for before a rename names the channel as it was: it is not kept, and
    no later event waits for it."""
    peer.add_conversation("C0GENERAL1", "general")
    run = await start()

    async def rename(name: str) -> None:
        peer.add_conversation("C0GENERAL1", name)
        await peer.send_event(_renamed("C0GENERAL1", name))
        await peer.send_event(message_event("U0ADA0001", f"renamed to {name}"))  # events go in
        await run.inbox.wait_for(lambda: f"renamed to {name}" in run.inbox.texts)  # in order

    # A message's lookup: Slack answered "general"; the answer is on its way.
    peer.hold("conversations.info", answered=True)
    await peer.send_event(_in("C0GENERAL1", "first"))
    await peer.wait_for(lambda: len(peer.calls_of("conversations.info", ok=None)) == 1)
    await rename("town-square")
    peer.release("conversations.info")
    await peer.send_event(_in("C0GENERAL1", "second"))
    await run.inbox.wait_for(lambda: "second" in run.inbox.texts)
    named = [(m.text, m.thread_name) for m in run.inbox.messages if m.thread_type == "group"]
    assert named == [("first", None), ("second", "town-square")]

    # The directory's lookup.
    await rename("plaza")
    peer.hold("conversations.info", answered=True)
    asked = asyncio.create_task(run.connector.thread("C0GENERAL1"))
    await peer.wait_for(lambda: len(peer.calls_of("conversations.info", ok=None)) == 3)
    await rename("lobby")
    peer.release("conversations.info")
    before = await asked
    assert before is not None and before.name == "#plaza"  # as it was when asked
    after = await run.connector.thread("C0GENERAL1")
    assert after is not None and after.name == "#lobby"
    assert len(peer.calls_of("conversations.info", ok=None)) == 4
