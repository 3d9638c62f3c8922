"""Socket Mode against the peer: acks, order, dedupe, disconnects, dropped sockets, bad tokens."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import Any

import pytest

from talkbridge.errors import TransientError, UnauthorizedError
from talkbridge.message import NormalizedMessage
from tests.connectors.slack.conftest import APP_TOKEN, BOT_TOKEN
from tests.peers.slack import SlackPeer, message_event
from tests.support.running import Inbox


async def test_a_dm_is_delivered_with_names_resolved(
    peer: SlackPeer, start: Callable[..., Any]
) -> None:
    run = await start()
    await peer.send_event(message_event("U0ADA0001", "hi <@U0GRACE01>, *look*"))
    [msg] = await run.inbox.wait_count(1)
    assert msg.text == "hi @Grace Hopper, look"
    assert msg.display_name == "ada" and msg.thread_type == "private"
    assert len(peer.calls_of("auth.test")) == 1


async def test_a_forwarded_message_without_a_comment_is_delivered_readably(
    peer: SlackPeer, start: Callable[..., Any]
) -> None:
    # Slack's "Forward message" (or sharing a message's link) without a comment: the event's
    # `text` is empty and the message shared is an attachment. It was dropped without a word.
    run = await start()
    shared = {
        "is_msg_unfurl": True,
        "is_share": True,
        "author_id": "U0GRACE01",
        "author_name": "Grace Hopper",
        "channel_id": "C0GENERAL1",
        "text": "the build is *red* again, see <https://ci.example/42|run 42>",
        "fallback": "[April 5th] Grace Hopper: the build is red again",
        "from_url": "https://acme.slack.com/archives/C0GENERAL1/p1712345678000100",
        "mrkdwn_in": ["text"],
    }
    await peer.send_event(message_event("U0ADA0001", "", attachments=[shared]))
    await peer.send_event(
        message_event("U0ADA0001", "what do you make of this?", attachments=[shared])
    )
    [forwarded, commented] = await run.inbox.wait_count(2)
    quoted = "Shared message from Grace Hopper:\n> the build is red again, see run 42 (https://ci.example/42)"
    assert forwarded.text == quoted
    assert commented.text == "what do you make of this?\n\n" + quoted


async def test_a_message_of_blocks_only_is_delivered_with_their_text(
    peer: SlackPeer, start: Callable[..., Any]
) -> None:
    run = await start()
    blocks = [
        {
            "type": "rich_text",
            "elements": [
                {
                    "type": "rich_text_section",
                    "elements": [
                        {"type": "text", "text": "deploy "},
                        {"type": "user", "user_id": "U0GRACE01"},
                        {"type": "text", "text": " please "},
                        {"type": "emoji", "name": "rocket", "unicode": "1f680"},
                    ],
                },
                {
                    "type": "rich_text_list",
                    "style": "bullet",
                    "elements": [
                        {"type": "rich_text_section", "elements": [{"type": "text", "text": "a"}]},
                        {"type": "rich_text_section", "elements": [{"type": "text", "text": "b"}]},
                    ],
                },
            ],
        }
    ]
    await peer.send_event(message_event("U0ADA0001", "", blocks=blocks))
    [msg] = await run.inbox.wait_count(1)
    assert msg.text == "deploy @Grace Hopper please 🚀\n- a\n- b"


async def test_with_require_mention_off_every_channel_message_is_taken(
    peer: SlackPeer, start: Callable[..., Any]
) -> None:
    run = await start(require_mention=False)
    await peer.send_event(message_event("U0ADA0001", "lunch anyone?", channel="C0GENERAL1"))
    [msg] = await run.inbox.wait_count(1)
    assert msg.text == "lunch anyone?" and msg.thread_type == "group"


async def test_a_forwarded_message_that_mentioned_the_bot_does_not_mention_it_again(
    peer: SlackPeer, start: Callable[..., Any]
) -> None:
    """Forwarding someone's `@bot …` into a channel addresses the channel, not the bot (Slack
    sends no app_mention for it): with require_mention it is left alone."""
    run = await start()
    shared = {
        "is_share": True,
        "author_id": "U0GRACE01",
        "author_name": "Grace Hopper",
        "text": "<@U0BOT0001> restart the runners",
        "fallback": "Grace Hopper: @bot restart the runners",
    }
    for text in ("", "fyi"):
        event = message_event("U0ADA0001", text, channel="C0GENERAL1", attachments=[shared])
        await peer.send_event(event)
    await peer.send_event(message_event("U0ADA0001", "<@U0BOT0001> hi", channel="C0GENERAL1"))
    await run.inbox.wait_count(1)
    assert run.inbox.texts == ["hi"]


async def test_an_envelope_is_acknowledged_only_once_the_bridge_has_taken_it(
    peer: SlackPeer, start: Callable[..., Any]
) -> None:
    taking = asyncio.Event()
    release = asyncio.Event()

    class SlowStore(Inbox):
        async def __call__(self, message: NormalizedMessage) -> None:
            taking.set()
            await release.wait()  # the router still writing the message to its store
            await super().__call__(message)

    run = await start(inbox=SlowStore())
    envelope = await peer.send_event(message_event("U0ADA0001", "first"))
    await taking.wait()
    # Acknowledged now, the message would be lost if the bridge stopped: Slack does not
    # deliver an acknowledged envelope again.
    assert peer.acks == []
    release.set()
    await peer.wait_ack(envelope)
    assert run.inbox.texts == ["first"]


async def test_an_envelope_the_bridge_could_not_take_is_delivered_again_and_taken(
    peer: SlackPeer, start: Callable[..., Any]
) -> None:
    run = await start()
    refused = message_event("U0ADA0001", "refused once")
    run.inbox.fail_on.add(f"{refused['channel']}:{refused['ts']}")  # the store was down
    first = await peer.send_event(refused)
    later = await peer.send_event(message_event("U0ADA0001", "later"))
    await peer.wait_ack(later)  # taken in order: the refused one was handled before it
    assert first not in peer.acks and run.inbox.texts == ["later"]
    await peer.redeliver(first)  # what Slack does with an envelope it saw no ack for
    await peer.wait_ack(first)
    assert run.inbox.texts == ["later", "refused once"]


async def test_a_slow_name_lookup_does_not_hold_the_message_back(
    peer: SlackPeer, start: Callable[..., Any]
) -> None:
    run = await start()
    peer.hold("users.info")  # Slack wants its ack within 3 s, and the lookup never answers
    envelopes = [await peer.send_event(message_event("U0ADA0001", f"m{i}")) for i in range(3)]
    for envelope in envelopes:
        await peer.wait_ack(envelope)
    assert [m.display_name for m in run.inbox.messages] == ["U0ADA0001"] * 3  # ids stand in
    # One lookup for the three: an envelope does not wait again for a lookup already slow
    # (each waiting its second, the third envelope's ack would come after Slack's 3 s).
    assert len(peer.calls_of("users.info", ok=None)) == 1
    peer.release("users.info")
    await peer.send_event(message_event("U0ADA0001", "again"))
    await run.inbox.wait_count(4)
    assert run.inbox.messages[3].display_name == "ada"


async def test_envelopes_are_processed_in_arrival_order(
    peer: SlackPeer, start: Callable[..., Any]
) -> None:
    run = await start()
    for i in range(8):
        await peer.send_event(message_event("U0ADA0001", f"m{i}"))
    await run.inbox.wait_count(8)
    assert run.inbox.texts == [f"m{i}" for i in range(8)]


async def test_a_redelivered_envelope_is_processed_once(
    peer: SlackPeer, start: Callable[..., Any]
) -> None:
    run = await start()
    envelope = await peer.send_event(message_event("U0ADA0001", "once"))
    await run.inbox.wait_count(1)
    await peer.redeliver(envelope)
    await peer.wait_ack(envelope, count=2)
    await peer.send_event(message_event("U0ADA0001", "next"))
    await run.inbox.wait_count(2)
    assert run.inbox.texts == ["once", "next"]


async def test_a_disconnect_message_leads_to_exactly_one_new_socket(
    peer: SlackPeer, start: Callable[..., Any]
) -> None:
    run = await start()
    first = await peer.wait_socket(1)
    await peer.send_disconnect("refresh_requested")
    second = await peer.wait_socket(2)
    await run.status.wait_up(2)
    assert first.closed and not second.closed
    await peer.send_event(message_event("U0ADA0001", "after refresh"))
    await run.inbox.wait_count(1)
    assert len(peer.sockets) == 2 and peer.max_open_sockets == 1
    assert len(peer.calls_of("apps.connections.open")) == 2
    assert not any(kind == "degraded" for kind, _ in run.status.reports)  # planned, not a fault


async def test_an_envelope_redelivered_after_a_reconnect_is_processed_once(
    peer: SlackPeer, start: Callable[..., Any]
) -> None:
    run = await start()
    envelope = await peer.send_event(message_event("U0ADA0001", "before"))
    await run.inbox.wait_count(1)
    await peer.send_disconnect("warning")
    await peer.wait_socket(2)
    await run.status.wait_up(2)
    await peer.redeliver(envelope)
    await peer.wait_ack(envelope, count=2)
    await peer.send_event(message_event("U0ADA0001", "after"))
    await run.inbox.wait_count(2)
    assert run.inbox.texts == ["before", "after"]


async def test_socket_mode_switched_off_ends_the_run_saying_so_instead_of_reconnecting(
    peer: SlackPeer, start: Callable[..., Any]
) -> None:
    run = await start()
    await peer.wait_socket(1)
    await peer.switch_socket_mode_off()
    await asyncio.wait({run.task}, timeout=peer.wait_timeout)
    assert run.task.done(), f"still reconnecting: {len(peer.sockets)} sockets opened"
    with pytest.raises(TransientError, match=r"switched Socket Mode off.*link_disabled"):
        run.task.result()
    # the registry retries with its backoff; the socket is not reopened at once, again and again
    assert len(peer.sockets) == 1 and len(peer.calls_of("apps.connections.open")) == 1


async def test_too_many_websockets_backs_off_saying_why_instead_of_reconnecting_at_once(
    peer: SlackPeer, start: Callable[..., Any]
) -> None:
    # Another deployment holds the sockets Slack allows this app token: reconnecting at once
    # would be told the same at once, for good (or knock the other one off, and back).
    peer.socket_limit = 1
    other = await start()
    run = await start(wait=False)
    await asyncio.wait({run.task}, timeout=peer.wait_timeout)
    assert run.task.done(), f"still reconnecting: {len(peer.sockets)} sockets opened"
    with pytest.raises(TransientError) as caught:
        run.task.result()
    assert "too_many_websockets" in str(caught.value)
    assert "another process or deployment uses this app token" in str(caught.value)
    # the registry retries with its growing backoff; one socket was tried, the other stays
    assert len(peer.sockets) == 2 and len(peer.open_sockets) == 1
    await peer.send_event(message_event("U0ADA0001", "still served"))
    await other.inbox.wait_count(1)


def _attempts(run: Any) -> list[int]:
    """The attempt numbers the degraded reports name (each reconnect's place in its series)."""
    return [
        int(n) for kind, why in run.status.reports for n in re.findall(r"\(attempt (\d+)\)", why)
    ]


@pytest.mark.parametrize(
    ("reason", "attempts"), [(None, [1, 2, 3, 4, 5]), ("refresh_requested", [2, 3, 4, 5])]
)
async def test_sockets_ending_right_after_hello_are_retried_with_growing_waits(
    peer: SlackPeer, start: Callable[..., Any], reason: str | None, attempts: list[int]
) -> None:
    # A Slack host that greets, then closes (or asks for a new socket) at once: each hello
    # reset the backoff, so the bridge reconnected at the first delay (a refresh at once),
    # for as long as the host did it.
    peer.end_after_hello(5, reason)
    run = await start(wait=False)
    await run.status.wait_up(6)
    assert _attempts(run) == attempts  # each wait the next of one series, not its first again
    assert len(peer.sockets) == 6 and peer.max_open_sockets == 1
    await peer.send_event(message_event("U0ADA0001", "served at last"))
    await run.inbox.wait_count(1)


async def test_a_socket_that_brought_an_event_starts_the_backoff_afresh(
    peer: SlackPeer, start: Callable[..., Any]
) -> None:
    peer.end_after_hello(3)
    run = await start(wait=False)
    await run.status.wait_up(4)
    await peer.send_event(message_event("U0ADA0001", "it works"))
    await run.inbox.wait_count(1)
    peer.drop_socket()
    await run.status.wait_up(5)
    assert _attempts(run) == [1, 2, 3, 1]


async def test_a_socket_open_for_a_while_starts_the_backoff_afresh(
    peer: SlackPeer, start: Callable[..., Any]
) -> None:
    now = [0.0]
    peer.end_after_hello(2)
    run = await start(wait=False)
    run.connector.clock = lambda: now[0]  # before it runs: its sockets are timed by it
    await run.status.wait_up(3)
    now[0] += 30.0  # the third socket stays open half a minute, quiet
    peer.drop_socket()
    await run.status.wait_up(4)
    assert _attempts(run) == [1, 2, 1]


async def test_a_dropped_socket_is_replaced_and_traffic_resumes(
    peer: SlackPeer, start: Callable[..., Any]
) -> None:
    run = await start()
    await peer.wait_socket(1)
    peer.drop_socket()
    await peer.wait_socket(2)
    await run.status.wait_up(2)
    assert any(kind == "degraded" and "lost" in why for kind, why in run.status.reports)
    await peer.send_event(message_event("U0ADA0001", "still here"))
    await run.inbox.wait_count(1)
    assert peer.max_open_sockets == 1 and len(peer.open_sockets) == 1


async def test_a_failing_connections_open_is_retried_with_backoff(
    peer: SlackPeer, start: Callable[..., Any]
) -> None:
    peer.fail_next("apps.connections.open", times=2, status=500)
    run = await start()
    assert len(peer.calls_of("apps.connections.open", ok=False)) == 2
    assert sum(1 for kind, _ in run.status.reports if kind == "degraded") == 2
    await peer.send_event(message_event("U0ADA0001", "made it"))
    await run.inbox.wait_count(1)


@pytest.mark.parametrize("revoked", [APP_TOKEN, BOT_TOKEN])
async def test_a_revoked_token_stops_the_connection_without_retrying(
    peer: SlackPeer, start: Callable[..., Any], revoked: str
) -> None:
    peer.revoke(revoked)
    run = await start(wait=False)
    error: BaseException | None = None
    try:
        await run.task
    except UnauthorizedError as exc:
        error = exc
    assert isinstance(error, UnauthorizedError)
    assert "revoked" in str(error) and revoked not in str(error)
    assert ("app token" if revoked == APP_TOKEN else "bot token") in str(error)
    assert len([c for c in peer.calls if c.error == "token_revoked"]) == 1
    assert peer.sockets == []


async def test_deletes_are_reported_as_deletions_and_are_not_turns(
    peer: SlackPeer, start: Callable[..., Any]
) -> None:
    run = await start()
    await peer.send_event(
        {
            "type": "message",
            "subtype": "message_deleted",
            "hidden": True,
            "channel": "C0GENERAL1",
            "ts": "1700000001.000200",
            "deleted_ts": "1700000000.000100",
            "channel_type": "channel",
        }
    )
    await run.inbox.wait(lambda: bool(run.inbox.deletions))
    assert run.inbox.deletions[0].message_id == "C0GENERAL1:1700000000.000100"
    assert run.inbox.messages == []


async def test_a_button_click_arrives_as_a_message(
    peer: SlackPeer, start: Callable[..., Any]
) -> None:
    run = await start()
    sent = await run.connector.send_buttons("D0DM00001", "Pick one", [("Yes", "yes-1")])
    [posted] = peer.posted()
    [button] = posted["blocks"][1]["elements"]
    channel, ts = sent.message_id.split(":")
    await peer.send_envelope(
        "interactive",
        {
            "type": "block_actions",
            "user": {"id": "U0ADA0001", "username": "ada", "name": "ada"},
            "container": {"type": "message", "message_ts": ts, "channel_id": channel},
            "trigger_id": "123.456.abc",
            "channel": {"id": channel, "name": "directmessage"},
            "message": {"type": "message", "text": "Pick one", "ts": ts},
            "actions": [{**button, "action_ts": "1700000002.000300"}],
        },
    )
    [click] = await run.inbox.wait_count(1)
    assert click.text == "yes-1" and click.thread_id == "D0DM00001"
    assert click.reply_to is not None and click.reply_to.message_id == sent.message_id
