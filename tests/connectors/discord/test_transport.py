"""The Discord transport against the local Discord peer, driven by the real discord.py client."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import pytest

from talkbridge.connectors.discord.logs import install as install_log_filter
from talkbridge.errors import (
    NotFoundError,
    PermanentError,
    RateLimitedError,
    StoreError,
    TransientError,
    UnauthorizedError,
)
from talkbridge.message import NormalizedMessage, OutboundMessage
from talkbridge.store import SqliteStore
from tests.connectors.discord.conftest import TOKEN, TOKEN_B
from tests.connectors.discord.test_render import shown
from tests.peers.discord import FORUM, GENERAL, GUILD_ID, THREAD, DiscordPeer
from tests.support.running import Inbox


async def test_a_dm_arrives_as_a_private_message(
    peer: DiscordPeer, start: Callable[..., Any]
) -> None:
    running = await start()
    alice = peer.person("Alice")
    payload = peer.message(alice, "hello **bot**", guild=False)
    peer.dispatch(TOKEN, "MESSAGE_CREATE", payload)
    [message] = await running.inbox.wait_count(1)
    assert message.text == "hello **bot**"
    assert message.thread_type == "private"
    assert message.channel_user_id == alice["id"]
    assert message.id == f"{payload['channel_id']}:{payload['id']}"


async def test_guild_messages_need_a_mention_which_is_stripped_and_names_are_readable(
    peer: DiscordPeer, start: Callable[..., Any]
) -> None:
    running = await start()
    bot = peer.bots[TOKEN].user
    alice, bob = peer.person("Alice"), peer.person("Bob")
    peer.dispatch(TOKEN, "MESSAGE_CREATE", peer.message(alice, "just chatting", nick="Al"))
    peer.dispatch(
        TOKEN,
        "MESSAGE_CREATE",
        peer.message(
            alice, f"<@{bot['id']}> ask <@{bob['id']}> in <#{GENERAL}>", mentions=[bot, bob]
        ),
    )
    [message] = await running.inbox.wait_count(1)
    assert message.text == "ask @Bob in #general"  # the unaddressed one was never delivered
    assert message.thread_type == "group"
    assert message.thread_id == GENERAL and message.thread_name == "#general"


async def test_require_mention_off_delivers_every_guild_message(
    peer: DiscordPeer, start: Callable[..., Any]
) -> None:
    running = await start(require_mention=False)
    peer.dispatch(TOKEN, "MESSAGE_CREATE", peer.message(peer.person("Alice"), "no mention"))
    assert (await running.inbox.wait_count(1))[0].text == "no mention"


async def test_a_thread_message_keeps_its_thread_and_names_the_parent(
    peer: DiscordPeer, start: Callable[..., Any]
) -> None:
    running = await start()
    bot = peer.bots[TOKEN].user
    payload = peer.message(
        peer.person("Alice"), f"<@{bot['id']}> it burns", channel_id=THREAD, mentions=[bot]
    )
    peer.dispatch(TOKEN, "MESSAGE_CREATE", payload)
    [message] = await running.inbox.wait_count(1)
    assert message.thread_id == THREAD
    assert message.thread_name == "#help-forum / printer on fire"
    result = await running.connector.send(
        OutboundMessage(thread_id=message.thread_id, text="on it", reply_to=message.id)
    )
    [sent] = peer.sent(TOKEN, THREAD)
    assert str(sent["message_reference"]["message_id"]) == payload["id"]
    assert result.message_id.startswith(f"{THREAD}:")


async def test_our_own_and_other_bots_messages_are_ignored(
    peer: DiscordPeer, start: Callable[..., Any]
) -> None:
    running = await start(require_mention=False)
    peer.dispatch(TOKEN, "MESSAGE_CREATE", peer.message(peer.bots[TOKEN].user, "echo?"))
    peer.dispatch(TOKEN, "MESSAGE_CREATE", peer.message(peer.bots[TOKEN_B].user, "bot talk"))
    peer.dispatch(TOKEN, "MESSAGE_CREATE", peer.message(peer.person("Alice"), "a person"))
    await running.inbox.wait_count(1)
    assert running.inbox.texts == ["a person"]


async def test_a_gateway_drop_resumes_with_nothing_lost_or_repeated(
    peer: DiscordPeer, start: Callable[..., Any]
) -> None:
    running = await start()
    alice = peer.person("Alice")
    peer.dispatch(TOKEN, "MESSAGE_CREATE", peer.message(alice, "one", guild=False))
    await running.inbox.wait_count(1)
    await peer.drop(TOKEN)
    # Sent while the bot is away: the gateway keeps them for the session.
    peer.dispatch(TOKEN, "MESSAGE_CREATE", peer.message(alice, "two", guild=False))
    peer.dispatch(TOKEN, "MESSAGE_CREATE", peer.message(alice, "three", guild=False))
    await running.inbox.wait_count(3)
    peer.dispatch(TOKEN, "MESSAGE_CREATE", peer.message(alice, "four", guild=False))
    await running.inbox.wait_count(4)
    assert running.inbox.texts == ["one", "two", "three", "four"]
    assert peer.resumes == [(TOKEN, True)]
    assert peer.identifies == [TOKEN]  # resumed, not a new session
    # Nothing to catch up on over REST: the resume replayed it all.
    assert peer.calls_of("GET", "/channels/{channel_id}/messages", answered=None) == []
    assert ("degraded", "the Discord gateway connection dropped; resuming") in (
        running.status.reports
    )
    await running.status.wait(lambda: running.status.count("up") >= 2)


async def test_a_gateway_that_stops_acknowledging_heartbeats_is_left_and_resumed(
    peer: DiscordPeer, start: Callable[..., Any]
) -> None:
    # A "zombie" connection (Discord's gateway docs): heartbeats go unacknowledged while
    # dispatches still arrive, so discord.py, which times out on the last frame received
    # rather than the last HEARTBEAT_ACK, never leaves it. Discord says: close with a code
    # other than 1000 and RESUME.
    peer.heartbeat_interval = 0.25  # seconds: the zombie is noticed after two of them
    running = await start()
    alice = peer.person("Alice")
    peer.dispatch(TOKEN, "MESSAGE_CREATE", peer.message(alice, "one", guild=False))
    await running.inbox.wait_count(1)
    peer.stop_acking(TOKEN)
    peer.dispatch(TOKEN, "MESSAGE_CREATE", peer.message(alice, "two", guild=False))
    await running.inbox.wait_count(2)
    await peer.wait_for(lambda: len(peer.resumes) == 1)
    # Dispatches kept flowing on the zombie until the bridge left it (discord.py's own
    # timeout never fired), and it was left for a resume, not a new session.
    assert peer.unacknowledged >= 1
    assert peer.resumes == [(TOKEN, True)] and peer.identifies == [TOKEN]
    peer.dispatch(TOKEN, "MESSAGE_CREATE", peer.message(alice, "three", guild=False))
    await running.inbox.wait_count(3)
    assert running.inbox.texts == ["one", "two", "three"]
    [reason] = [r for kind, r in running.status.reports if kind == "degraded"]
    assert "no HEARTBEAT_ACK" in reason and "resuming" in reason
    await running.status.wait(lambda: running.status.count("up") >= 2)


async def test_a_gateway_retry_is_logged_in_one_line_not_a_traceback(
    peer: DiscordPeer, start: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    # discord.py logs every gateway retry with `logger.exception`: a 30-line traceback each
    # time, for an outage of minutes, burying what the operator needs to read.
    running = await start()
    peer.refuse_gateway(1)
    with caplog.at_level(logging.INFO, logger="discord"):
        await peer.drop(TOKEN)
        await peer.wait_for(lambda: peer.handshakes_refused == 1)
        await running.status.wait(lambda: running.status.count("up") >= 2)
    [retry] = [
        r
        for r in caplog.records
        if r.name == "discord.client" and r.levelno >= logging.WARNING and "voice" not in r.msg
    ]
    assert retry.exc_info is None and retry.levelno == logging.WARNING
    line = retry.getMessage()
    assert "\n" not in line and TOKEN not in line
    assert line.startswith("Discord gateway: could not connect (WSServerHandshakeError: 503")
    assert "retrying in" in line


def test_discord_py_voice_warnings_are_not_logged(caplog: pytest.LogCaptureFixture) -> None:
    # discord.py warns once per process that voice is unsupported (PyNaCl, davey missing) as
    # its first client is made; talkbridge never uses voice.
    install_log_filter()
    with caplog.at_level(logging.INFO, logger="discord"):
        logging.getLogger("discord.client").warning(
            "PyNaCl is not installed, voice will NOT be supported"
        )
    assert caplog.records == []


async def test_events_the_gateway_delivered_are_taken_when_the_connection_stops(
    peer: DiscordPeer, start: Callable[..., Any]
) -> None:
    # Discord never sends an event again (the next start opens a new session): what the
    # gateway delivered before a stop must reach the router, not die in a queue.
    taking, release = asyncio.Event(), asyncio.Event()

    class SlowStore(Inbox):
        async def __call__(self, message: NormalizedMessage) -> None:
            taking.set()
            await release.wait()
            await super().__call__(message)

    running = await start(inbox=SlowStore())
    queue = running.connector._queue
    read_all = asyncio.Event()
    put = queue.put_nowait

    def counting_put(item: Any) -> None:  # tells when the client has read every frame
        put(item)
        if queue.qsize() >= 3:
            read_all.set()

    queue.put_nowait = counting_put
    alice = peer.person("Alice")
    for text in ("one", "two", "three", "four"):
        peer.dispatch(TOKEN, "MESSAGE_CREATE", peer.message(alice, text, guild=False))
    await taking.wait()
    await read_all.wait()
    stopping = asyncio.create_task(running.stop())
    # The stop closes the gateway before it lets go of the queue's consumer, which is still
    # held by the slow store: the events in hand must reach the router all the same.
    await peer.wait_for(lambda: not peer.connected(TOKEN))
    release.set()
    await stopping
    assert running.inbox.texts == ["one", "two", "three", "four"]


async def test_a_refused_resume_identifies_afresh(
    peer: DiscordPeer, start: Callable[..., Any]
) -> None:
    running = await start()
    peer.refuse_next_resume(TOKEN)
    await peer.drop(TOKEN)
    await peer.wait_for(lambda: len(peer.identifies) == 2 and peer.connected(TOKEN))
    assert peer.resumes == [(TOKEN, False)]
    peer.dispatch(TOKEN, "MESSAGE_CREATE", peer.message(peer.person("A"), "after", guild=False))
    assert (await running.inbox.wait_count(1))[0].text == "after"


async def test_a_long_reply_is_split_with_balanced_code_fences_and_pings_nobody(
    peer: DiscordPeer, start: Callable[..., Any]
) -> None:
    running = await start()
    code = "\n".join(f"line_{i} = {i} * 2  # keep going" for i in range(100))
    text = "@everyone look: <@&1> and <@2>\n\n" + "intro " * 100 + f"\n\n```python\n{code}\n```\n"
    assert 3000 <= len(text) < 4000
    result = await running.connector.send(
        OutboundMessage(thread_id=GENERAL, text=text, reply_to=f"{GENERAL}:42")
    )
    bodies = peer.sent(TOKEN, GENERAL)
    assert len(bodies) == len(result.message_ids) == 2
    for body in bodies:
        assert len(body["content"]) <= 2000
        assert body["content"].count("```") % 2 == 0
        mentions = body["allowed_mentions"]
        assert mentions["parse"] == [] and not mentions.get("replied_user", False)
        assert not mentions.get("users") and not mentions.get("roles")
    assert str(bodies[0]["message_reference"]["message_id"]) == "42"
    assert "message_reference" not in bodies[1]
    assert bodies[1]["content"].startswith("```python\n")
    joined = "".join(b["content"] for b in bodies)
    assert all(f"line_{i} = " in joined for i in range(100))  # nothing lost at the cut


async def test_a_long_emphasised_reply_is_sent_in_pieces_that_each_show_their_marks(
    peer: DiscordPeer, start: Callable[..., Any]
) -> None:
    running = await start()
    text = "**Summary:** " + "all good " * 50 + "\n\n**very" + " important words" * 200 + "**"
    result = await running.connector.send(OutboundMessage(thread_id=GENERAL, text=text))
    bodies = [body["content"] for body in peer.sent(TOKEN, GENERAL)]
    assert len(bodies) == len(result.message_ids) >= 2
    for body in bodies:
        assert len(body) <= 2000
        assert "*" not in shown(body), body[-40:]  # every bold closed where it is opened
    assert all(body.startswith("**") and body.endswith("**") for body in bodies[1:])
    assert "".join(shown(body) for body in bodies) == shown(text)


async def test_a_429_on_one_route_delays_only_that_route(
    peer: DiscordPeer, start: Callable[..., Any]
) -> None:
    running = await start()
    route = "/channels/{channel_id}/messages"
    peer.rate_limit("POST", route, channel_id=GENERAL, retry_after=1.5)
    slow = asyncio.create_task(
        running.connector.send(OutboundMessage(thread_id=GENERAL, text="slow"))
    )
    await peer.wait_for(lambda: bool(peer.calls_of("POST", route, answered=429)))
    await running.connector.send(OutboundMessage(thread_id=THREAD, text="fast"))
    assert not slow.done()  # the other channel's bucket went ahead
    await slow
    assert [c.status for c in peer.calls_of("POST", route, answered=None)] == [429, 200, 200]
    assert [b["content"] for b in peer.sent(TOKEN)] == ["fast", "slow"]


async def test_a_long_rate_limit_is_handed_to_the_router(
    peer: DiscordPeer, start: Callable[..., Any]
) -> None:
    running = await start()
    peer.rate_limit("POST", "/channels/{channel_id}/messages", retry_after=45.0)
    with pytest.raises(RateLimitedError) as caught:
        await running.connector.send(OutboundMessage(thread_id=GENERAL, text="later"))
    assert caught.value.retry_after == 45.0 and caught.value.scope == "thread"
    await running.connector.send(OutboundMessage(thread_id=THREAD, text="now"))  # another route
    assert [b["content"] for b in peer.sent(TOKEN)] == ["now"]


async def test_a_long_global_429_pauses_every_channel_and_asks_discord_no_more(
    peer: DiscordPeer, start: Callable[..., Any]
) -> None:
    """Discord's global limit is the bot's, across routes: each further request would earn a
    429 of its own (and count toward Cloudflare's ban of the IP address)."""
    running = await start()
    route = "/channels/{channel_id}/messages"
    peer.rate_limit("POST", route, channel_id=GENERAL, retry_after=45.0, is_global=True)
    with pytest.raises(RateLimitedError) as caught:
        await running.connector.send(OutboundMessage(thread_id=GENERAL, text="later"))
    assert caught.value.scope == "connection" and 44.0 < caught.value.retry_after <= 45.0
    for thread in (THREAD, GENERAL):
        with pytest.raises(RateLimitedError) as again:  # at once: Discord is not asked
            await running.connector.send(OutboundMessage(thread_id=thread, text="later"))
        assert again.value.scope == "connection" and 0 < again.value.retry_after <= 45.0
    with pytest.raises(RateLimitedError, match="global rate limit"):
        await running.connector.typing(THREAD)
    assert [c.status for c in peer.calls_of("POST", route, answered=None)] == [429]
    assert peer.calls_of("POST", "/channels/{channel_id}/typing", answered=None) == []


async def test_a_429_from_a_proxy_waits_what_its_retry_after_says(
    peer: DiscordPeer, start: Callable[..., Any]
) -> None:
    running = await start()
    peer.rate_limit("POST", "/channels/{channel_id}/messages", retry_after=3.0, proxy=True)
    with pytest.raises(RateLimitedError) as caught:
        await running.connector.send(OutboundMessage(thread_id=GENERAL, text="later"))
    assert caught.value.retry_after == 3.0 and caught.value.scope == "connection"


async def test_an_invalid_token_fails_with_a_clear_reason(
    peer: DiscordPeer, start: Callable[..., Any]
) -> None:
    peer.revoke(TOKEN)
    with pytest.raises(UnauthorizedError) as caught:
        await start()
    assert "Developer Portal" in str(caught.value) and TOKEN not in str(caught.value)


async def test_features_edit_delete_react_typing_history_directory(
    peer: DiscordPeer, start: Callable[..., Any]
) -> None:
    running = await start()
    connector = running.connector
    alice = peer.person("Alice")
    earlier = peer.message(alice, "earlier words")
    sent = await connector.send(OutboundMessage(thread_id=GENERAL, text="draft"))
    await connector.edit(GENERAL, sent.message_id, "final @everyone")
    [patch] = peer.calls_of("PATCH", "/channels/{channel_id}/messages/{message_id}")
    assert patch.json["content"] == "final @everyone"
    assert patch.json["allowed_mentions"]["parse"] == []
    await connector.react(GENERAL, f"{GENERAL}:{earlier['id']}", "👍")
    assert peer.calls_of(
        "PUT", "/channels/{channel_id}/messages/{message_id}/reactions/{emoji}/@me", answered=204
    )
    await connector.typing(GENERAL)
    assert peer.calls_of("POST", "/channels/{channel_id}/typing", answered=204)
    history = await connector.fetch(GENERAL, limit=10)
    assert [m.text for m in history] == ["earlier words", "final @everyone"]
    older = await connector.fetch(GENERAL, limit=10, before=sent.message_id)
    assert [m.text for m in older] == ["earlier words"]
    who = await connector.user(alice["id"])
    assert who is not None and who.name == "Alice"
    assert await connector.user("999") is None
    where = await connector.thread(THREAD)
    assert where is not None and where.name == "printer on fire"
    assert where.extra == {"type": "public_thread", "parent_id": FORUM}
    await connector.delete(GENERAL, sent.message_id)
    assert [m["content"] for m in peer.messages[GENERAL]] == ["earlier words"]
    with pytest.raises(NotFoundError):
        await connector.delete(GENERAL, sent.message_id)


async def test_an_edit_longer_than_a_message_is_cut_between_lines_with_its_code_closed(
    peer: DiscordPeer, start: Callable[..., Any]
) -> None:
    running = await start()
    sent = await running.connector.send(OutboundMessage(thread_id=GENERAL, text="draft"))
    # Its first 2,000-character chunk ends with the closing fence, the chunk being 1,999 long.
    code = "\n".join(f"x = {i}  " for i in range(400))
    await running.connector.edit(GENERAL, sent.message_id, f"```py\n{code}\n```")
    [patch] = peer.calls_of("PATCH", "/channels/{channel_id}/messages/{message_id}")
    content = patch.json["content"]
    assert len(content) <= 2000 and content.endswith("\n```\n…"), content[-20:]
    body = content.removeprefix("```py\n").removesuffix("\n```\n…").split("\n")
    assert body == [f"x = {i}  " for i in range(len(body))]  # whole lines, none cut


async def test_buttons_are_sent_and_a_click_arrives_as_a_message(
    peer: DiscordPeer, start: Callable[..., Any]
) -> None:
    running = await start()
    sent = await running.connector.send_buttons(
        GENERAL, "Pick", [("Yes", "vote:yes"), ("No", "no")]
    )
    [body] = peer.sent(TOKEN)
    buttons = body["components"][0]["components"]
    assert [(b["label"], b["custom_id"]) for b in buttons] == [("Yes", "vote:yes"), ("No", "no")]
    alice = peer.person("Alice")
    _, message_id = sent.message_id.split(":")
    interaction = {
        "id": "846462639134605312", "application_id": peer.bots[TOKEN].application_id,
        "type": 3, "token": "interaction-token", "version": 1, "guild_id": GUILD_ID,
        "channel_id": GENERAL, "data": {"custom_id": "vote:yes", "component_type": 2},
        "member": {"user": alice, "roles": [], "joined_at": "2024-01-01T00:00:00+00:00",
                   "deaf": False, "mute": False, "flags": 0, "permissions": "1024"},
        "message": peer.messages[GENERAL][-1], "locale": "en-US", "guild_locale": "en-US",
        "app_permissions": "1024", "entitlements": [], "authorizing_integration_owners": {},
        "context": 0, "attachment_size_limit": 10485760,
    }  # fmt: skip
    peer.dispatch(TOKEN, "INTERACTION_CREATE", interaction)
    [click] = await running.inbox.wait_count(1)
    assert click.text == "vote:yes" and click.id == "ia:846462639134605312"
    assert click.reply_to is not None and click.reply_to.message_id == sent.message_id
    assert message_id
    callback = "/interactions/{interaction_id}/{interaction_token}/callback"
    await peer.wait_for(lambda: bool(peer.calls_of("POST", callback)))
    assert peer.calls_of("POST", callback)[0].json["type"] == 6  # acknowledged, no new message


async def test_an_edit_keeps_the_buttons_or_replaces_them_or_takes_them_off(
    peer: DiscordPeer, start: Callable[..., Any]
) -> None:
    running = await start()
    sent = await running.connector.send_buttons(GENERAL, "Refund 5 EUR?", [("Approve", "ok")])
    [message] = peer.messages[GENERAL]

    def buttons() -> list[tuple[str, str]]:
        rows = message["components"]
        return [(b["label"], b["custom_id"]) for row in rows for b in row["components"]]

    await running.connector.edit(GENERAL, sent.message_id, "Refund 7 EUR?")
    assert message["content"] == "Refund 7 EUR?" and buttons() == [("Approve", "ok")]
    await running.connector.edit(GENERAL, sent.message_id, "Approved", buttons=[("Undo", "u")])
    assert message["content"] == "Approved" and buttons() == [("Undo", "u")]
    await running.connector.edit(GENERAL, sent.message_id, "Approved.", buttons=())
    assert message["content"] == "Approved." and message["components"] == []
    with pytest.raises(PermanentError):
        await running.connector.edit(GENERAL, sent.message_id, "x", buttons=[("", "u")])


async def test_a_deleted_question_takes_our_reply_along(
    peer: DiscordPeer, start: Callable[..., Any], sqlite_store: SqliteStore
) -> None:
    running = await start()
    question = peer.message(peer.person("Alice"), "q", guild=False)
    reply = await running.connector.send(
        OutboundMessage(thread_id=question["channel_id"], text="answer")
    )
    await sqlite_store.map_id("dc", f"{question['channel_id']}:{question['id']}", reply.message_id)
    peer.dispatch(
        TOKEN,
        "MESSAGE_DELETE",
        {"id": question["id"], "channel_id": question["channel_id"]},
    )
    route = "/channels/{channel_id}/messages/{message_id}"
    await peer.wait_for(lambda: bool(peer.calls_of("DELETE", route, answered=204)))
    assert peer.calls_of("DELETE", route, answered=204)[0].path.endswith(
        reply.message_id.split(":")[1]
    )


async def test_two_bots_share_one_process_but_not_two_api_bases(
    peer: DiscordPeer, start: Callable[..., Any]
) -> None:
    first = await start()
    second = await start(id="dc2", token=TOKEN_B)
    peer.dispatch(TOKEN_B, "MESSAGE_CREATE", peer.message(peer.person("B"), "hi", guild=False))
    assert (await second.inbox.wait_count(1))[0].connection_id == "dc2"
    assert first.inbox.messages == []
    with pytest.raises(PermanentError, match="one REST base and gateway URL per process"):
        await start(id="dc3", token=TOKEN_B, api_base="http://127.0.0.1:1/api/v10")


async def test_a_send_retried_after_its_answer_was_lost_posts_the_message_once(
    peer: DiscordPeer, start: Callable[..., Any]
) -> None:
    running = await start()
    route = "/channels/{channel_id}/messages"
    peer.lose_next_answer("POST", route, channel_id=GENERAL)
    reply = OutboundMessage(thread_id=GENERAL, text="only once", idempotency_key="reply-1")
    with pytest.raises(TransientError):
        await running.connector.send(reply)  # Discord created it; the answer never came
    result = await running.connector.send(reply)  # the router's retry, with the same key
    posted = [m for m in peer.messages[GENERAL] if m["author"]["id"] == peer.bots[TOKEN].id]
    assert [m["content"] for m in posted] == ["only once"]
    assert result.message_ids == (f"{GENERAL}:{posted[0]['id']}",)


@pytest.mark.parametrize(
    ("code", "says"), [(4011, "too many servers"), (4012, "API version"), (4013, "intents")]
)
async def test_a_gateway_closing_for_good_says_why_in_plain_words(
    peer: DiscordPeer, start: Callable[..., Any], code: int, says: str
) -> None:
    peer.close_on_identify(TOKEN, code)
    with pytest.raises(PermanentError) as caught:
        await start()
    assert f"close code {code}" in str(caught.value) and says in str(caught.value)
    assert "Shard ID" not in str(caught.value)  # discord.py's words, not the user's
    assert len(peer.identifies) == 0 and len(peer.resumes) == 0  # nothing retried


async def test_questions_deleted_in_bulk_take_our_replies_along(
    peer: DiscordPeer, start: Callable[..., Any], sqlite_store: SqliteStore
) -> None:
    running = await start()
    alice = peer.person("Alice")
    questions = [peer.message(alice, text) for text in ("spam", "more spam", "fine")]
    replies = []
    for question in questions:
        reply = await running.connector.send(OutboundMessage(thread_id=GENERAL, text="answer"))
        await sqlite_store.map_id("dc", f"{GENERAL}:{question['id']}", reply.message_id)
        replies.append(reply.message_id.split(":")[1])
    # a moderator's purge: one event for the first two (and for anything not ours)
    ids = [questions[0]["id"], questions[1]["id"], "1100000000000000999"]
    peer.dispatch(
        TOKEN, "MESSAGE_DELETE_BULK", {"ids": ids, "channel_id": GENERAL, "guild_id": GUILD_ID}
    )
    route = "/channels/{channel_id}/messages/{message_id}"
    await peer.wait_for(lambda: len(peer.calls_of("DELETE", route, answered=204)) == 2)
    deleted = {c.path.rsplit("/", 1)[1] for c in peer.calls_of("DELETE", route, answered=204)}
    assert deleted == set(replies[:2])  # the answer to "fine" stays


async def test_a_message_waits_for_a_store_that_is_out_for_a_while(
    peer: DiscordPeer, start: Callable[..., Any]
) -> None:
    # The gateway never sends an event again: a store out for longer than a few quick
    # retries (a Redis restarting) must not cost the messages that arrive meanwhile.
    back = asyncio.Event()

    class OutStore(Inbox):
        refused = 0

        async def __call__(self, message: NormalizedMessage) -> None:
            if not back.is_set():
                OutStore.refused += 1
                self._notify()
                raise StoreError("redis store at 127.0.0.1:6379: Connection refused")
            await super().__call__(message)

    running = await start(inbox=OutStore())
    alice = peer.person("Alice")
    for text in ("while the store is out", "and after it"):
        peer.dispatch(TOKEN, "MESSAGE_CREATE", peer.message(alice, text, guild=False))
    await running.inbox.wait(lambda: OutStore.refused >= 6, timeout=30)
    back.set()
    await running.inbox.wait_count(2)
    assert running.inbox.texts == ["while the store is out", "and after it"]


async def test_a_long_reply_cut_off_is_finished_by_the_next_process_not_repeated(
    peer: DiscordPeer, start: Callable[..., Any]
) -> None:
    """The bridge died after part 2 of 4 and answers the message again at its next start, when
    Discord no longer holds the nonces of parts 1 and 2: they must not come twice."""
    text = "\n\n".join(f"Part {i}. " + "word " * 300 for i in range(4))
    message = OutboundMessage(
        thread_id=GENERAL, text=text, reply_to=f"{GENERAL}:42", idempotency_key="reply:42"
    )
    first = await start()
    peer.rate_limit("POST", "/channels/{channel_id}/messages", retry_after=45.0, after=2)
    with pytest.raises(RateLimitedError):
        await first.connector.send(message)
    await first.stop()
    peer.nonces_expire()
    second = await start()  # a new process: the same store, nothing in memory
    result = await second.connector.send(message)
    bodies = peer.sent(TOKEN, GENERAL)
    assert [body["content"][:6] for body in bodies] == ["Part 0", "Part 1", "Part 2", "Part 3"]
    assert len(result.message_ids) == 4
    assert str(bodies[0]["message_reference"]["message_id"]) == "42"
    assert all("message_reference" not in body for body in bodies[1:])
