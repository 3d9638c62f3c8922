"""What was written while the bridge was away is fetched when a new gateway session starts.

Discord replays missed events only to a resumed session; a restart identifies afresh, so the
connector fetches `GET /channels/{id}/messages?after=` for the channels it delivered from.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from talkbridge.errors import RateLimitedError
from talkbridge.message import OutboundMessage
from tests.connectors.discord.conftest import TOKEN
from tests.peers.discord import GENERAL, DiscordPeer
from tests.support.logs import LogWatch

HISTORY = "/channels/{channel_id}/messages"


async def test_messages_sent_while_the_bridge_was_down_are_delivered_once_in_order(
    peer: DiscordPeer, start: Callable[..., Any]
) -> None:
    bot = peer.bots[TOKEN].user
    alice, bob = peer.person("Alice"), peer.person("Bob")
    first = await start()
    peer.dispatch(TOKEN, "MESSAGE_CREATE", peer.message(alice, "one", guild=False))
    mention = f"<@{bot['id']}> "
    peer.dispatch(TOKEN, "MESSAGE_CREATE", peer.message(bob, mention + "guild one", mentions=[bot]))
    await first.inbox.wait_count(2)
    await first.stop()

    # Written while the bridge is down: in the channels' history, never sent to a session.
    dm_two = peer.message(alice, "two", guild=False)
    peer.message(alice, "three", guild=False)
    peer.message(bob, "chatter nobody asked the bot about")  # not addressed: stays unanswered
    peer.message(bob, mention + "guild two", mentions=[bot])

    second = await start()
    assert peer.identifies == [TOKEN, TOKEN]  # a new session: the gateway replays nothing
    # A live message after the restart comes after the channel's catch-up, never before it.
    peer.dispatch(TOKEN, "MESSAGE_CREATE", peer.message(alice, "four", guild=False))
    await second.inbox.wait_count(4)
    texts = second.inbox.texts
    assert sorted(texts) == sorted(["two", "three", "guild two", "four"])  # "one": not again
    assert [t for t in texts if t in ("two", "three", "four")] == ["two", "three", "four"]
    [two] = [m for m in second.inbox.messages if m.text == "two"]
    assert two.id == f"{dm_two['channel_id']}:{dm_two['id']}"  # as the gateway would have it
    assert two.thread_type == "private"
    [guild] = [m for m in second.inbox.messages if m.text == "guild two"]
    assert guild.thread_id == GENERAL and guild.thread_type == "group"
    fetched = peer.calls_of("GET", HISTORY)
    assert {c.path.split("/")[2] for c in fetched} == {dm_two["channel_id"], GENERAL}


@pytest.mark.parametrize("status", [403, 503])
async def test_a_channel_whose_history_fails_is_skipped_and_the_connection_stays_up(
    peer: DiscordPeer, start: Callable[..., Any], status: int
) -> None:
    alice, bob = peer.person("Alice"), peer.person("Bob")
    first = await start()
    one = peer.message(alice, "one", guild=False)
    refused = one["channel_id"]
    peer.dispatch(TOKEN, "MESSAGE_CREATE", one)
    peer.dispatch(TOKEN, "MESSAGE_CREATE", peer.message(bob, "hi", guild=False))
    await first.inbox.wait_count(2)
    await first.stop()

    peer.message(alice, "lost: its channel cannot be read", guild=False)
    peer.message(bob, "caught up", guild=False)
    peer.fail_next("GET", HISTORY, status=status, channel_id=refused)
    second = await start()
    await peer.wait_for(lambda: bool(peer.calls_of("GET", HISTORY, answered=status)))
    await second.inbox.wait_count(1)
    peer.dispatch(TOKEN, "MESSAGE_CREATE", peer.message(alice, "live", guild=False))
    await second.inbox.wait_count(2)
    assert sorted(second.inbox.texts) == ["caught up", "live"]  # two channels: either order
    assert not second.task.done()
    assert second.status.count("degraded") == 0
    assert peer.identifies == [TOKEN, TOKEN]


async def test_a_refused_resume_catches_up_on_what_the_old_session_never_got(
    peer: DiscordPeer, start: Callable[..., Any]
) -> None:
    running = await start()
    alice = peer.person("Alice")
    peer.dispatch(TOKEN, "MESSAGE_CREATE", peer.message(alice, "one", guild=False))
    await running.inbox.wait_count(1)
    peer.message(alice, "two", guild=False)  # written, never sent to the session
    peer.refuse_next_resume(TOKEN)
    await peer.drop(TOKEN)
    await running.inbox.wait_count(2)
    assert running.inbox.texts == ["one", "two"]
    assert peer.resumes == [(TOKEN, False)] and peer.identifies == [TOKEN, TOKEN]


async def test_live_messages_of_a_channel_wait_for_its_catch_up(
    peer: DiscordPeer, start: Callable[..., Any]
) -> None:
    alice = peer.person("Alice")
    first = await start()
    peer.dispatch(TOKEN, "MESSAGE_CREATE", peer.message(alice, "one", guild=False))
    await first.inbox.wait_count(1)
    await first.stop()
    peer.message(alice, "two", guild=False)
    gate = peer.hold("GET", HISTORY)
    second = await start()
    await peer.wait_for(lambda: bool(peer.calls_of("GET", HISTORY, answered=None)))
    peer.dispatch(TOKEN, "MESSAGE_CREATE", peer.message(alice, "three", guild=False))
    # Another channel's message, taken after "three" (one queue, in order), is not held.
    peer.dispatch(TOKEN, "MESSAGE_CREATE", peer.message(peer.person("Bob"), "bob", guild=False))
    await second.inbox.wait_count(1)
    assert second.inbox.texts == ["bob"]  # "three" waits for the catch-up of its channel
    gate.set()
    await second.inbox.wait_count(3)
    assert second.inbox.texts == ["bob", "two", "three"]


async def test_a_catch_up_during_a_global_rate_limit_waits_and_asks_discord_nothing(
    peer: DiscordPeer, start: Callable[..., Any]
) -> None:
    """A new session while the bot is globally rate limited: each history fetch would earn a
    429 of its own (counted toward Cloudflare's IP ban), and its channel's messages be lost."""
    alice, bob = peer.person("Alice"), peer.person("Bob")
    running = await start()
    peer.dispatch(TOKEN, "MESSAGE_CREATE", peer.message(alice, "one", guild=False))
    peer.dispatch(TOKEN, "MESSAGE_CREATE", peer.message(bob, "hi", guild=False))
    await running.inbox.wait_count(2)
    peer.message(alice, "two", guild=False)  # written, never sent to the session
    peer.limit_globally(TOKEN, 45.0)
    with pytest.raises(RateLimitedError, match="global rate limit"):
        await running.connector.send(OutboundMessage(thread_id=GENERAL, text="later"))
    with LogWatch("test.discord") as logs:
        peer.refuse_next_resume(TOKEN)
        await peer.drop(TOKEN)
        said = await logs.said("global rate limit")
    assert "catching up on 2 channel(s) waits for it" in said
    assert peer.identifies == [TOKEN, TOKEN]
    assert peer.calls_of("GET", HISTORY, answered=None) == []
    assert len(peer.calls_of("POST", "/channels/{channel_id}/messages", answered=429)) == 1
    assert not [m for m in logs.messages if "could not fetch" in m]
    assert "two" not in running.inbox.texts  # waits for the limit to end: not given up


async def test_a_429_on_a_catch_up_fetch_is_waited_out_and_the_fetch_made_again(
    peer: DiscordPeer, start: Callable[..., Any]
) -> None:
    """A 429 discord.py hands back (here Cloudflare's, which it never retries) on one
    channel's history: its `Retry-After` is waited out, then the channel is fetched again."""
    alice = peer.person("Alice")
    first = await start()
    one = peer.message(alice, "one", guild=False)
    peer.dispatch(TOKEN, "MESSAGE_CREATE", one)
    await first.inbox.wait_count(1)
    await first.stop()
    peer.message(alice, "two", guild=False)
    peer.rate_limit("GET", HISTORY, channel_id=one["channel_id"], retry_after=1.0, proxy=True)
    second = await start()
    await second.inbox.wait_count(1)
    assert second.inbox.texts == ["two"]
    assert [c.status for c in peer.calls_of("GET", HISTORY, answered=None)] == [429, 200]
