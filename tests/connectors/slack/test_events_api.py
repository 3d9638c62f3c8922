"""The Events API over HTTP: signatures, freshness, replays, url_verification, retries."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from talkbridge.connectors.slack.events_api import RequestCheck
from tests.connectors.slack.conftest import SIGNING_SECRET, Running
from tests.peers.http import send_and_stall
from tests.peers.slack import SlackPeer, message_event
from tests.support import running


@pytest.fixture
async def events(start: Callable[..., Any]) -> Running:
    running: Running = await start(app_token=None, signing_secret=SIGNING_SECRET, events_port=0)
    return running


async def test_url_verification_is_answered_with_the_challenge(
    peer: SlackPeer, events: Running
) -> None:
    status, body = await peer.post_event(
        events.events_url,
        {"token": "x", "challenge": "3eZbrw1aBm2rZgRNFdxV", "type": "url_verification"},
        secret=SIGNING_SECRET,
    )
    assert status == 200 and '"challenge": "3eZbrw1aBm2rZgRNFdxV"' in body


async def test_a_signed_event_is_delivered_and_acknowledged(
    peer: SlackPeer, events: Running
) -> None:
    payload = peer.event_callback(message_event("U0ADA0001", "over http"))
    status, _ = await peer.post_event(events.events_url, payload, secret=SIGNING_SECRET)
    assert status == 200
    assert events.inbox.texts == ["over http"]  # accepted before the 200
    assert events.connector.team == "Acme"


@pytest.mark.parametrize(
    ("tamper", "reason"),
    [
        ({"signature": "v0=" + "0" * 64}, "bad signature"),
        ({"secret": "not-the-signing-secret"}, "bad signature"),
        ({"timestamp": int(time.time()) - 6 * 60}, "stale request"),
        ({"timestamp": int(time.time()) + 6 * 60}, "stale request"),
    ],
)
async def test_forged_and_stale_requests_are_refused(
    peer: SlackPeer, events: Running, tamper: dict[str, Any], reason: str
) -> None:
    payload = peer.event_callback(message_event("U0ADA0001", "forged"))
    options: dict[str, Any] = {"secret": SIGNING_SECRET, **tamper}
    if "timestamp" in tamper:  # an offset: the request is stale when it is sent, not collected
        options["timestamp"] = int(time.time()) + tamper["timestamp"]
    status, body = await peer.post_event(events.events_url, payload, **options)
    assert status == 401 and reason in body
    assert events.inbox.messages == []


async def test_a_replayed_request_is_refused(peer: SlackPeer, events: Running) -> None:
    payload = peer.event_callback(message_event("U0ADA0001", "once"))
    stamp = int(time.time())
    first, _ = await peer.post_event(
        events.events_url, payload, secret=SIGNING_SECRET, timestamp=stamp
    )
    replay, body = await peer.post_event(
        events.events_url, payload, secret=SIGNING_SECRET, timestamp=stamp
    )
    assert (first, replay) == (200, 401) and "replayed" in body
    assert events.inbox.texts == ["once"]


async def test_slack_retries_of_one_event_are_delivered_once(
    peer: SlackPeer, events: Running
) -> None:
    payload = peer.event_callback(message_event("U0ADA0001", "retried"))
    statuses = []
    for retry in (None, 1, 2):  # Slack re-signs every retry with a fresh timestamp
        status, _ = await peer.post_event(
            events.events_url,
            payload,
            secret=SIGNING_SECRET,
            timestamp=int(time.time()) - (retry or 0),
            retry_num=retry,
        )
        statuses.append(status)
    assert statuses == [200, 200, 200]
    assert events.inbox.texts == ["retried"]


async def test_an_event_not_accepted_is_answered_500_so_slack_retries_it(
    peer: SlackPeer, events: Running
) -> None:
    event = message_event("U0ADA0001", "flaky store", ts="1700000000.000100")
    events.inbox.fail_on.add("D0DM00001:1700000000.000100")
    payload = peer.event_callback(event)
    first, _ = await peer.post_event(events.events_url, payload, secret=SIGNING_SECRET)
    second, _ = await peer.post_event(
        events.events_url,
        payload,
        secret=SIGNING_SECRET,
        timestamp=int(time.time()) - 1,
        retry_num=1,
    )
    assert (first, second) == (500, 200)
    assert events.inbox.texts == ["flaky store"]


async def test_a_retry_signed_in_the_same_second_as_a_refused_attempt_is_taken(
    peer: SlackPeer, events: Running
) -> None:
    # Slack retries a 500 at once with the same body; signed within the same second, it has the
    # same signature. That is no replay: the first attempt was not accepted.
    event = message_event("U0ADA0001", "quick retry", ts="1700000000.000200")
    events.inbox.fail_on.add("D0DM00001:1700000000.000200")
    payload = peer.event_callback(event)
    stamp = int(time.time())
    first, _ = await peer.post_event(
        events.events_url, payload, secret=SIGNING_SECRET, timestamp=stamp
    )
    retry, body = await peer.post_event(
        events.events_url, payload, secret=SIGNING_SECRET, timestamp=stamp, retry_num=1
    )
    assert (first, retry) == (500, 200), body
    assert events.inbox.texts == ["quick retry"]
    replay, body = await peer.post_event(  # once accepted, the same request is a replay
        events.events_url, payload, secret=SIGNING_SECRET, timestamp=stamp, retry_num=1
    )
    assert replay == 401 and "replayed" in body


async def test_a_button_click_arrives_as_a_signed_interactivity_form(
    peer: SlackPeer, events: Running
) -> None:
    click = {
        "type": "block_actions",
        "user": {"id": "U0ADA0001", "name": "ada"},
        "trigger_id": "1.2.3",
        "channel": {"id": "C0GENERAL1", "name": "general"},
        "container": {"type": "message", "message_ts": "1700000000.000100"},
        "actions": [{"type": "button", "value": "approve", "action_ts": "1700000001.000100"}],
    }
    status, _ = await peer.post_event(events.events_url, click, secret=SIGNING_SECRET, form=True)
    assert status == 200 and events.inbox.texts == ["approve"]


async def test_bodies_that_are_not_slack_requests_are_refused(
    peer: SlackPeer, events: Running
) -> None:
    status, body = await peer.post_event(
        events.events_url, {}, secret=SIGNING_SECRET, body=b"not json"
    )
    assert status == 400 and "neither JSON" in body
    status, body = await peer.post_event(
        events.events_url, {}, secret=SIGNING_SECRET, body=b"\xff binary"
    )
    assert status == 401 and "UTF-8" in body


def test_the_request_check_on_its_own_with_a_fixed_clock() -> None:
    now = 1_700_000_000.0
    check = RequestCheck(SIGNING_SECRET, clock=lambda: now)
    body = b'{"type":"event_callback"}'
    signature = SlackPeer.sign(SIGNING_SECRET, str(int(now)), body)
    assert check.refuse(body, None, signature) is not None
    assert check.refuse(body, "soon", signature) == "X-Slack-Request-Timestamp is not a number"
    assert check.refuse(body + b" ", str(int(now)), signature) == "bad signature"
    assert check.refuse(body, str(int(now)), signature) is None
    assert "replayed" in (check.refuse(body, str(int(now)), signature) or "")
    stale = str(int(now) - 301)
    assert "stale" in (check.refuse(body, stale, SlackPeer.sign(SIGNING_SECRET, stale, body)) or "")


def test_a_request_signed_ahead_of_our_clock_cannot_be_replayed_while_it_is_fresh() -> None:
    # Slack's clock four minutes ahead of ours: its request stays fresh until our clock is
    # nine minutes on, so it must be remembered as used until then, not for five minutes.
    now = [1_700_000_000.0]
    check = RequestCheck(SIGNING_SECRET, clock=lambda: now[0])
    body = b'{"type":"event_callback"}'
    stamp = str(int(now[0]) + 240)
    signature = SlackPeer.sign(SIGNING_SECRET, stamp, body)
    assert check.refuse(body, stamp, signature) is None
    now[0] += 400  # past five minutes since it came, still within the window of its timestamp
    assert "replayed" in (check.refuse(body, stamp, signature) or "")


@pytest.mark.parametrize("signature", ["v0=\u00e9", "v0=" + "\u00ff" * 64])
async def test_a_signature_that_is_not_ascii_is_refused_as_bad(
    peer: SlackPeer, events: Running, signature: str
) -> None:
    payload = peer.event_callback(message_event("U0ADA0001", "forged"))
    status, body = await peer.post_event(
        events.events_url, payload, secret=SIGNING_SECRET, signature=signature
    )
    assert (status, body) == (401, "bad signature")
    assert events.inbox.messages == []


@pytest.mark.parametrize(
    ("start", "answer"),
    [
        (b"POST /slack/events HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slack", b""),
        (b"POST /slack/events HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 99\r\n\r\n{", b"408"),
    ],
)
async def test_a_client_that_sends_slowly_is_cut_off(
    start: bytes,
    answer: bytes,
    make_connector: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A head or a body trickling in (slowloris) held a connection for an hour, or for good.
    monkeypatch.setattr("talkbridge.connectors.slack.transport.READ_TIMEOUT", 0.2)
    starter = running.Starter(make_connector, running=Running)
    try:
        events = await starter(app_token=None, signing_secret=SIGNING_SECRET, events_port=0)
        assert events.connector.events is not None and events.connector.events.port
        got = await send_and_stall(events.connector.events.port, start)
    finally:
        await starter.stop_all()
    assert got.split(b" ")[1:2] == ([answer] if answer else [])
    assert events.inbox.messages == []


async def test_conversation_names_are_cached_until_a_rename_or_they_expire(
    peer: SlackPeer, events: Running, make_connector: Callable[..., Any]
) -> None:
    """The directory names a conversation from `conversations.info` (tier 3: about 50 calls a
    minute): asked once, reused, asked again once Slack says the channel was renamed."""
    lookups = peer.calls_of
    peer.add_conversation("C0GENERAL1", "general")
    peer.add_conversation("G0SECRET01", "secret", is_private=True)
    connector = events.connector
    for _ in range(3):
        general = await connector.thread("C0GENERAL1")
        assert general is not None and general.name == "#general"
    thread = await connector.thread("C0GENERAL1:1700000000.000100")
    assert thread is not None and thread.name == "#general (thread)"
    assert len(lookups("conversations.info")) == 1

    # A public channel renamed (the `channel_rename` event, for a bot subscribed to it).
    peer.add_conversation("C0GENERAL1", "town-square")
    rename = {"type": "channel_rename", "channel": {"id": "C0GENERAL1", "name": "town-square",
              "created": 1360782804}}  # fmt: skip
    status, _ = await peer.post_event(
        events.events_url, peer.event_callback(rename), secret=SIGNING_SECRET
    )
    assert status == 200
    renamed = await connector.thread("C0GENERAL1")
    assert renamed is not None and renamed.name == "#town-square"
    assert len(lookups("conversations.info")) == 2

    # A private channel renamed, told in the channel itself (a `channel_name` message, which
    # a bot in it gets with `message.groups`, no other subscription needed).
    assert (await connector.thread("G0SECRET01")).name == "#secret"  # type: ignore[union-attr]
    peer.add_conversation("G0SECRET01", "hush", is_private=True)
    said = message_event(
        "U0ADA0001", 'renamed the channel from "secret" to "hush"', channel="G0SECRET01",
        channel_type="group", subtype="channel_name", old_name="secret", name="hush",
    )  # fmt: skip
    await peer.post_event(events.events_url, peer.event_callback(said), secret=SIGNING_SECRET)
    assert (await connector.thread("G0SECRET01")).name == "#hush"  # type: ignore[union-attr]
    assert len(lookups("conversations.info")) == 4
    assert events.inbox.texts == []  # the notice is no message for the agent

    # Kept `channel_cache_seconds`: 0 asks Slack every time.
    uncached = make_connector(channel_cache_seconds=0)
    await uncached.thread("C0GENERAL1")
    await uncached.thread("C0GENERAL1")
    assert len(lookups("conversations.info")) == 6
    await uncached.close()
