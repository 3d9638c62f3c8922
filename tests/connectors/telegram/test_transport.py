"""The Telegram transport with the real aiogram client against the local Bot API peer."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from talkbridge.connectors.telegram.render import (
    html_text,
    render_markdown,
    visible_length,
)
from talkbridge.connectors.telegram.transport import TelegramConnector
from talkbridge.errors import (
    NotFoundError,
    PermanentError,
    RateLimitedError,
    TransientError,
    UnauthorizedError,
)
from talkbridge.message import Attachment, OutboundMessage
from talkbridge.store import SqliteStore
from tests.connectors.telegram.conftest import TOKEN, webhook_on
from tests.connectors.telegram.test_render import balanced
from tests.peers.http import free_port, send_and_stall
from tests.peers.telegram import TelegramBotAPIPeer, group_text, private_text
from tests.support.running import Inbox, Starter

Start = Callable[..., Any]


# ---- inbound: polling ---------------------------------------------------------------------


async def test_polling_delivers_a_private_message(peer: TelegramBotAPIPeer, start: Start) -> None:
    running = await start()
    peer.push_update(private_text(777, "hello there", first_name="Ada", message_id=5))
    [message] = await running.inbox.wait_count(1)
    assert message.id == "777:5"
    assert message.text == "hello there"
    assert message.channel_user_id == "777" and message.display_name == "Ada"
    assert message.thread_id == "777" and message.thread_type == "private"
    assert message.connection_id == "tg"
    methods = [c.method for c in peer.calls]
    assert methods.index("getme") < methods.index("getupdates")
    polls = peer.calls_of("getUpdates", answered=None)
    assert "callback_query" in polls[0].params["allowed_updates"]
    assert await running.connector.check() == "@talkbridge_test_bot"


async def test_the_bots_own_messages_are_not_delivered(
    peer: TelegramBotAPIPeer, start: Start
) -> None:
    running = await start()
    own = private_text(777, "echo of my own reply")
    own["message"]["from"] = peer.bot_user()
    peer.push_update(own)
    peer.push_update(private_text(777, "real"))
    await running.inbox.wait_count(1)
    await peer.wait_for(lambda: not peer.updates[TOKEN])  # both confirmed
    assert running.inbox.texts == ["real"]


async def test_a_hidden_links_url_reaches_the_bridge(
    peer: TelegramBotAPIPeer, start: Start
) -> None:
    running = await start()
    update = private_text(777, "😀 see the docs", message_id=6)
    update["message"]["entities"] = [
        {"type": "text_link", "offset": 7, "length": 8, "url": "https://example.com/docs"}
    ]
    peer.push_update(update)
    [message] = await running.inbox.wait_count(1)
    assert message.text == "😀 see the docs (https://example.com/docs)"


async def test_edited_message_arrives_as_an_edit(peer: TelegramBotAPIPeer, start: Start) -> None:
    running = await start()
    original = private_text(777, "helo", message_id=9)
    peer.push_update(original)
    edited = private_text(777, "hello", message_id=9)["message"]
    edited["edit_date"] = edited["date"] + 30
    peer.push_update({"edited_message": edited})
    first, second = await running.inbox.wait_count(2)
    assert second.edit_of == first.id == "777:9"
    assert second.id == f"777:9:edit:{edited['edit_date']}" and second.text == "hello"


async def test_callback_query_is_delivered_and_answered(
    peer: TelegramBotAPIPeer, start: Start
) -> None:
    running = await start()
    peer.push_update(
        {
            "callback_query": {
                "id": "cbq-1",
                "from": {"id": 777, "is_bot": False, "first_name": "Ada"},
                "chat_instance": "1",
                "data": "yes",
                "message": private_text(777, "Proceed?", message_id=3)["message"],
            }
        }
    )
    [click] = await running.inbox.wait_count(1)
    assert click.text == "yes" and click.thread_id == "777" and click.id == "cb:cbq-1"
    [answer] = peer.calls_of("answerCallbackQuery")
    assert answer.params["callback_query_id"] == "cbq-1"


async def test_restart_resumes_at_the_stored_offset(
    peer: TelegramBotAPIPeer, start: Start, sqlite_store: SqliteStore
) -> None:
    first = await start()
    ids = [peer.push_update(private_text(777, f"m{i}")) for i in range(2)]
    await first.inbox.wait_count(2)
    # The next poll confirms the batch; it is only made once the offset is stored.
    await peer.wait_for(
        lambda: any(
            c.params.get("offset") == ids[-1] + 1
            for c in peer.calls_of("getUpdates", answered=None)
        )
    )
    assert await sqlite_store.get_state("telegram:tg:offset") == str(ids[-1] + 1)
    await first.stop()
    # Telegram never heard the confirmation (a crash right after the store write): it offers
    # the delivered updates again, plus one that arrived while the bridge was down.
    delivered = [private_text(777, f"m{i}") | {"update_id": ids[i]} for i in range(2)]
    peer.updates[TOKEN] = delivered
    peer.push_update(private_text(777, "while down"))
    second = await start()
    await second.inbox.wait_count(1)
    await peer.wait_for(lambda: not peer.updates[TOKEN])
    assert second.inbox.texts == ["while down"]  # nothing replayed, nothing lost
    assert first.inbox.texts == ["m0", "m1"]


async def test_update_ids_that_start_again_below_the_offset_are_followed(
    peer: TelegramBotAPIPeer, start: Start, sqlite_store: SqliteStore
) -> None:
    running = await start()
    peer.push_update(private_text(777, "before", message_id=1))
    await running.inbox.wait_count(1)
    await peer.wait_for(lambda: not peer.updates[TOKEN])
    # After a quiet week Telegram picks the next update id at random (a self-hosted Bot API
    # server has its own sequence): the server ignores the offset, now far ahead of its ids.
    peer.restart_update_ids(5)
    ids = [peer.push_update(private_text(777, f"after {i}", message_id=2 + i)) for i in range(2)]
    await running.inbox.wait_count(3)
    await peer.wait_for(lambda: not peer.updates[TOKEN])  # confirmed, not offered forever
    assert await sqlite_store.get_state("telegram:tg:offset") == str(ids[-1] + 1)
    peer.push_update(private_text(777, "later", message_id=9))
    await running.inbox.wait_count(4)
    assert running.inbox.texts == ["before", "after 0", "after 1", "later"]


async def test_polling_leaves_a_webhook_set_elsewhere_and_says_how_to_resolve_it(
    peer: TelegramBotAPIPeer,
    make_connector: Callable[..., TelegramConnector],
    start: Start,
) -> None:
    # Another deployment of the bot takes updates by webhook: Telegram refuses getUpdates
    # (409 Conflict) while it is set. Deleting it would take its updates away without a word.
    hook = f"https://bot.example/hook/{TOKEN}"
    peer.webhooks[TOKEN] = {"url": hook}
    with pytest.raises(TransientError) as checked:
        await make_connector().check()
    with pytest.raises(TransientError) as ran:
        await start()
    for caught in (checked, ran):
        said = str(caught.value)
        assert "409 Conflict" in said and "https://bot.example/hook/***" in said
        assert "deleteWebhook" in said and "`mode: webhook`" in said
        assert "`delete_webhook: true`" in said
        assert TOKEN.split(":")[1] not in said
    assert peer.webhooks[TOKEN]["url"] == hook  # still there
    assert peer.calls_of("deleteWebhook", answered=None) == []
    assert peer.calls_of("getUpdates", answered=None) == []  # a 409 would say nothing more

    # Webhook mode replaces it: the config says where updates go.
    hooked = make_connector(
        mode="webhook", webhook_url="https://new.example/hook", webhook_secret="s"
    )
    assert await hooked.check() == (
        "@talkbridge_test_bot (updates go to another webhook now, https://bot.example/hook/***: "
        "run replaces it)"
    )
    await hooked.close()


async def test_a_webhook_set_elsewhere_while_polling_is_named_with_the_fix(
    peer: TelegramBotAPIPeer, start: Start
) -> None:
    running = await start(poll_timeout=1)  # the poll under way ends within a second
    peer.webhooks[TOKEN] = {"url": "https://bot.example/hook"}  # set by something else

    def degraded() -> list[str]:
        return [r for kind, r in running.status.reports if kind == "degraded"]

    await running.status.wait(lambda: bool(degraded()))
    said = degraded()[0]
    assert "409 Conflict" in said and "a webhook is set for this bot" in said
    assert "deleteWebhook" in said and "`mode: webhook`" in said
    assert "another process is polling" not in said
    assert peer.webhooks[TOKEN]["url"] == "https://bot.example/hook"
    del peer.webhooks[TOKEN]  # deleted by whoever set it: polling goes on by itself
    peer.push_update(private_text(777, "polled again"))
    await running.inbox.wait_count(1)


async def test_polling_deletes_a_webhook_when_the_config_says_so_or_this_connection_set_it(
    peer: TelegramBotAPIPeer,
    make_connector: Callable[..., TelegramConnector],
    start: Start,
    caplog: pytest.LogCaptureFixture,
) -> None:
    peer.webhooks[TOKEN] = {"url": f"https://bot.example/hook/{TOKEN}"}
    assert await make_connector(delete_webhook=True).check() == (
        "@talkbridge_test_bot (a webhook is set, https://bot.example/hook/***: polling deletes "
        "it, as delete_webhook says)"
    )
    running = await start(delete_webhook=True)
    assert "a webhook was set (https://bot.example/hook/***): deleting it" in caplog.text
    assert TOKEN.split(":")[1] not in caplog.text
    peer.push_update(private_text(777, "now polled"))
    await running.inbox.wait_count(1)
    await running.stop()

    # This connection's own webhook (webhook mode, then switched to polling) is its to delete.
    port = free_port()
    hooked = await start(**webhook_on(port))
    await hooked.stop()
    assert peer.webhooks[TOKEN]["url"] == f"http://127.0.0.1:{port}/telegram/webhook"
    polling = await start()
    assert TOKEN not in peer.webhooks
    peer.push_update(private_text(777, "polled after webhook mode"))
    await polling.inbox.wait_count(1)


def _without_text(update: dict[str, Any], **content: Any) -> dict[str, Any]:
    """`update`'s message with `content` (a dice, a poll, …) in place of its text."""
    del update["message"]["text"]
    update["message"].update(content)
    return update


async def test_kinds_without_text_arrive_as_text_or_are_logged_as_skipped(
    peer: TelegramBotAPIPeer, start: Start, caplog: pytest.LogCaptureFixture
) -> None:
    # Shapes as the Bot API reference gives them (Dice, Poll, Checklist, Contact, Venue, Story).
    caplog.set_level("DEBUG", logger="test")
    running = await start()
    poll = {
        "id": "5",
        "question": "Lunch?",
        "options": [{"text": "Pizza", "voter_count": 0}, {"text": "Sushi", "voter_count": 0}],
        "total_voter_count": 0,
        "is_closed": False,
        "is_anonymous": True,
        "type": "regular",
        "allows_multiple_answers": False,
    }
    checklist = {
        "title": "Trip",
        "tasks": [
            {"id": 1, "text": "Tickets", "completion_date": 1716907500},
            {"id": 2, "text": "Bags"},
        ],
    }
    contact = {"phone_number": "+15551234567", "first_name": "Ada", "last_name": "Lovelace"}
    place = {"latitude": 52.52, "longitude": 13.405}
    venue = {"location": place, "title": "Alexanderplatz", "address": "Berlin"}
    story = {"chat": {"id": 99, "type": "channel", "title": "News"}, "id": 7}
    for content in (
        {"dice": {"emoji": "🎯", "value": 6}},
        {"poll": poll},
        {"checklist": checklist},
        {"contact": contact},
        {"venue": venue, "location": place},
        {"story": story},
        {"story": story},
        {"location": {**place, "live_period": 900}},
    ):
        peer.push_update(_without_text(private_text(777, ""), **content))
    moved = _without_text(private_text(777, "", message_id=4242), location=place)
    moved["edited_message"] = {**moved.pop("message"), "edit_date": 1716907600}
    peer.push_update(moved)
    peer.push_update(private_text(777, "after them"))
    await running.inbox.wait_count(7)
    assert running.inbox.texts == [
        "🎯 (dice value 6)",
        "Poll: Lunch?\n- Pizza\n- Sushi",
        "Checklist: Trip\n- [x] Tickets\n- [ ] Bags",
        "Contact: Ada Lovelace, +15551234567",
        "Venue: Alexanderplatz, Berlin",
        "Live location: 52.52, 13.405",
        "after them",
    ]
    skips = [r for r in caplog.records if "not delivered:" in r.getMessage()]
    assert [(r.levelname, r.getMessage().split(": ", 1)[1]) for r in skips] == [
        (
            "INFO",
            "a forwarded story, which the Bot API gives bots as an id only, not its content"
            " (more of this kind are logged at debug level)",
        ),
        (
            "DEBUG",
            "a forwarded story, which the Bot API gives bots as an id only, not its content",
        ),
        (
            "INFO",
            "a live location moved; its first position was delivered"
            " (more of this kind are logged at debug level)",
        ),
    ]
    assert "in chat 777" in skips[0].getMessage()


async def test_an_update_not_accepted_is_not_skipped(
    peer: TelegramBotAPIPeer, start: Start, sqlite_store: SqliteStore
) -> None:
    failing = Inbox(fail_on={"777:2"})
    first = await start(inbox=failing)
    peer.push_update(private_text(777, "one", message_id=1))
    peer.push_update(private_text(777, "two", message_id=2))
    with pytest.raises(TransientError, match="not accepted") as caught:
        await asyncio.wait_for(first.task, 10)
    assert TOKEN not in str(caught.value)
    await first.stop()
    second = await start()
    await second.inbox.wait_count(1)
    assert failing.texts == ["one"] and second.inbox.texts == ["two"]


async def test_a_malformed_update_is_skipped_and_polling_goes_on(
    peer: TelegramBotAPIPeer, start: Start, caplog: pytest.LogCaptureFixture
) -> None:
    running = await start()
    # aiogram refuses the whole batch for this one; polling must not stop at its offset.
    bad = peer.push_update({"message": {"message_id": 1, "chat": "not an object", "date": 0}})
    peer.push_update(private_text(777, "after it", message_id=2))
    await running.inbox.wait_count(1)
    assert running.inbox.texts == ["after it"]
    assert f"skipping update {bad} that cannot be read" in caplog.text
    peer.push_update(private_text(777, "and on", message_id=3))  # the offset moved past both
    await running.inbox.wait_count(2)
    assert running.inbox.texts == ["after it", "and on"]


async def test_502_and_dropped_connections_recover_without_loss_or_duplicates(
    peer: TelegramBotAPIPeer, start: Start
) -> None:
    running = await start()
    peer.push_update(private_text(777, "before"))
    await running.inbox.wait_count(1)
    # The poll in flight returns the next update; the ones after it fail.
    peer.fail_next("getUpdates", 2, status=502)
    peer.fail_next("getUpdates", drop=True)
    peer.push_update(private_text(777, "during"))
    await peer.wait_for(lambda: len(peer.calls_of("getUpdates", answered=0)) == 1)
    peer.push_update(private_text(777, "after"))
    await running.inbox.wait_count(3)
    await peer.wait_for(lambda: not peer.updates[TOKEN])
    assert running.inbox.texts == ["before", "during", "after"]
    assert len(peer.calls_of("getUpdates", answered=502)) == 2
    degraded = [reason for kind, reason in running.status.reports if kind == "degraded"]
    assert len(degraded) == 3 and "Bad Gateway" in degraded[0]
    assert running.status.reports[-1][0] == "up"
    assert all(TOKEN not in reason for reason in degraded)


async def test_short_polling_asks_once_a_second_while_nothing_comes(
    peer: TelegramBotAPIPeer, start: Start
) -> None:
    # `poll_timeout: 0` is Telegram's short polling: an empty answer comes back at once. Asked
    # again at once, the bot sent over a thousand getUpdates a second, CPU-bound, until
    # Telegram answered 429.
    running = await start(poll_timeout=0)
    peer.push_update(private_text(777, "first"))
    await running.inbox.wait_count(1)
    before = len(peer.calls_of("getUpdates", answered=None))
    await asyncio.sleep(1.5)  # a rate is measured over time: nothing to await instead
    assert len(peer.calls_of("getUpdates", answered=None)) - before <= 3
    peer.push_update(private_text(777, "second"))
    await running.inbox.wait_count(2, timeout=5)  # still delivered, within the interval
    assert running.inbox.texts == ["first", "second"]


async def test_two_instances_polling_one_token_back_off_instead_of_cutting_each_other_off(
    peer: TelegramBotAPIPeer, make_connector: Callable[..., TelegramConnector]
) -> None:
    # Each getUpdates ends the other's long poll with a 409. A quick poll after each 409 went
    # through, so the backoff started again from its base: two polls a second, and a warning
    # each, for as long as both ran.
    def make(**overrides: Any) -> TelegramConnector:
        connector = make_connector(**overrides)
        connector.retry_base = 0.05
        return connector

    starter = Starter(make)
    try:
        running = await starter()
        await starter()

        def conflicts() -> list[str]:
            return [r for kind, r in running.status.reports if kind == "degraded"]

        await running.status.wait(lambda: len(conflicts()) >= 4)
    finally:
        await starter.stop_all()
    assert "another process is polling with this token" in conflicts()[0]
    delays = [float(r.rsplit("retrying in ", 1)[1].split()[0]) for r in conflicts()]
    assert delays[3] >= 0.2  # 0.05 doubled thrice, jitter keeping at least half


async def test_a_proxys_error_page_is_named_as_such_and_polling_recovers(
    peer: TelegramBotAPIPeer, start: Start
) -> None:
    running = await start()
    peer.fail_next("getUpdates", status=502, html=True)  # the poll after the one in flight
    peer.push_update(private_text(777, "before"))
    await running.inbox.wait_count(1)
    await peer.wait_for(lambda: len(peer.calls_of("getUpdates", answered=502)) == 1)
    peer.push_update(private_text(777, "after"))
    await running.inbox.wait_count(2)
    [reason] = [r for kind, r in running.status.reports if kind == "degraded"]
    assert "not JSON (a proxy's error page?): <html><body><h1>502 Bad Gateway" in reason


async def test_a_5xx_without_description_degrades_polling_which_recovers(
    peer: TelegramBotAPIPeer, start: Start
) -> None:
    # The Bot API documents `description` as optional; aiogram read a 5xx without one as a
    # TypeError of its own, which restarted the connection with that TypeError as the reason.
    running = await start()
    peer.fail_next("getUpdates", status=502, body={"ok": False, "error_code": 502})
    peer.push_update(private_text(777, "before"))
    await running.inbox.wait_count(1)
    await peer.wait_for(lambda: len(peer.calls_of("getUpdates", answered=502)) == 1)
    peer.push_update(private_text(777, "after"))
    await running.inbox.wait_count(2)
    assert not running.task.done()
    [reason] = [r for kind, r in running.status.reports if kind == "degraded"]
    assert "HTTP 502 with no description" in reason and "NoneType" not in reason


@pytest.mark.parametrize(
    ("status", "body", "error", "said"),
    [
        (502, {"ok": False, "error_code": 502}, TransientError, "HTTP 502 with no description"),
        (503, {"ok": False}, TransientError, "HTTP 503 with no description"),
        (400, {"ok": False, "error_code": 400}, PermanentError, "HTTP 400 with no description"),
        (200, {"ok": False}, TransientError, "ok: false with HTTP 200"),
        (200, {"ok": False, "description": "Proxy says no"}, TransientError, "(Proxy says no)"),
    ],
)
async def test_an_error_answer_without_words_is_translated_with_some(
    peer: TelegramBotAPIPeer,
    start: Start,
    status: int,
    body: dict[str, Any],
    error: type[Exception],
    said: str,
) -> None:
    running = await start()
    peer.fail_next("sendMessage", status=status, body=body)
    with pytest.raises(error) as caught:
        await running.connector.send(OutboundMessage(thread_id="777", text="x"))
    assert said in str(caught.value) and "None" not in str(caught.value)


async def test_a_revoked_token_raises_unauthorized_without_the_token(
    peer: TelegramBotAPIPeer, start: Start, make_connector: Callable[..., TelegramConnector]
) -> None:
    peer.revoke(TOKEN)
    with pytest.raises(UnauthorizedError) as caught:
        await start()
    text = str(caught.value)
    assert "401" in text and "revoked" in text
    assert TOKEN not in text and TOKEN.split(":")[1] not in text
    assert caught.value.__cause__ is None and caught.value.__suppress_context__
    connector = make_connector()
    with pytest.raises(UnauthorizedError):
        await connector.check()
    await connector.close()


async def test_a_token_revoked_while_polling_stops_the_run(
    peer: TelegramBotAPIPeer, start: Start
) -> None:
    running = await start()
    peer.revoke(TOKEN)
    peer.push_update(private_text(777, "wake the poll"))  # the poll in flight still answers
    with pytest.raises(UnauthorizedError):
        await asyncio.wait_for(running.task, 10)
    assert len(peer.calls_of("getUpdates", answered=401)) == 1  # no retry storm


# ---- inbound: webhook ---------------------------------------------------------------------


async def test_webhook_accepts_only_the_right_secret(
    peer: TelegramBotAPIPeer, start: Start
) -> None:
    port = free_port()
    running = await start(
        **webhook_on(port),
    )
    [hook] = peer.calls_of("setWebhook")
    assert hook.params["secret_token"] == "s3cret-Token_1"
    assert running.connector.webhook_port == port
    update = private_text(777, "via webhook", message_id=11)
    assert await peer.post_to_webhook(update, secret="wrong") == 401
    assert await peer.post_to_webhook(update, secret=None) == 401
    assert running.inbox.messages == []
    assert await peer.post_to_webhook(update) == 200
    [message] = running.inbox.messages  # delivered before the POST was answered
    assert message.text == "via webhook" and message.id == "777:11"
    assert peer.calls_of("getUpdates", answered=None) == []


@pytest.mark.parametrize("secret", [b"\xff", "s3cret-Token_\u00e9".encode()])
async def test_webhook_refuses_a_secret_header_that_is_not_ascii(
    peer: TelegramBotAPIPeer, start: Start, secret: bytes
) -> None:
    # Anyone can send a header byte that is not UTF-8: it was a 500 with a traceback logged.
    port = free_port()
    running = await start(
        **webhook_on(port),
    )
    body = b'{"update_id": 1}'
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST /telegram/webhook HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        b"X-Telegram-Bot-Api-Secret-Token: " + secret + b"\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    )
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    assert answer.startswith(b"HTTP/1.1 401 ") and answer.endswith(b"wrong or missing secret token")
    assert running.inbox.messages == []


@pytest.mark.parametrize(
    ("start_of_request", "answer"),
    [
        (b"POST /telegram/webhook HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Tele", b""),
        (
            b"POST /telegram/webhook HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 99\r\n"
            b"X-Telegram-Bot-Api-Secret-Token: s3cret-Token_1\r\n\r\n{",
            b"408",
        ),
    ],
)
async def test_webhook_cuts_off_a_client_that_sends_slowly(
    peer: TelegramBotAPIPeer,
    start: Start,
    start_of_request: bytes,
    answer: bytes,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A head or a body trickling in (slowloris) held a connection for an hour, or for good.
    monkeypatch.setattr("talkbridge.connectors.telegram.transport.READ_TIMEOUT", 0.2)
    port = free_port()
    running = await start(
        **webhook_on(port),
    )
    got = await send_and_stall(port, start_of_request)
    assert got.split(b" ")[1:2] == ([answer] if answer else [])
    assert running.inbox.messages == []


async def test_webhook_asks_for_a_retry_when_the_update_is_not_accepted(
    peer: TelegramBotAPIPeer, start: Start
) -> None:
    port = free_port()
    inbox = Inbox(fail_on={"777:12"})
    await start(
        inbox=inbox,
        **webhook_on(port, secret="abc"),
    )
    update = private_text(777, "retry me", message_id=12) | {"update_id": 99}
    assert await peer.post_to_webhook(update) == 500
    assert await peer.post_to_webhook(update) == 200
    assert await peer.post_to_webhook(update) == 200  # a redelivery is deduped by update_id
    assert inbox.texts == ["retry me"]


async def test_webhook_acknowledges_a_malformed_update_and_points_other_paths_to_itself(
    peer: TelegramBotAPIPeer, start: Start, caplog: pytest.LogCaptureFixture
) -> None:
    port = free_port()
    running = await start(
        mode="webhook",
        webhook_url=f"http://127.0.0.1:{port}/bot/updates",  # the path follows the URL's
        webhook_secret="abc",
        webhook_port=port,
    )
    assert running.connector.config.webhook_path == "/bot/updates"
    poison = {"update_id": 41, "message": {"message_id": 1, "chat": 7, "from": "x", "date": 0}}
    # Answered 500, Telegram would deliver it again and again.
    assert await peer.post_to_webhook(poison, path="/bot/updates") == 200
    assert "skipping update 41 that cannot be read" in caplog.text
    ok = private_text(777, "fine", message_id=2)
    assert await peer.post_to_webhook(ok, path="/bot/updates") == 200
    assert running.inbox.texts == ["fine"]
    assert await peer.post_to_webhook(ok, path="/telegram/webhook") == 404
    assert "is not the webhook, which is POST /bot/updates" in caplog.text


async def test_the_webhook_server_tells_no_stranger_its_path_nor_logs_the_token_in_it(
    peer: TelegramBotAPIPeer, start: Start, caplog: pytest.LogCaptureFixture
) -> None:
    # Telegram's docs suggest a secret path, e.g. the bot token, in the webhook URL. Any
    # request to another path was answered "the webhook is POST /tg/<the token>".
    port = free_port()
    running = await start(
        mode="webhook",
        webhook_url=f"http://127.0.0.1:{port}/tg/{TOKEN}",
        webhook_secret="abc",
        webhook_port=port,
    )
    secret_part = TOKEN.partition(":")[2]
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}/") as response,
    ):
        body = await response.text()
    assert response.status == 404
    assert secret_part not in body and "/tg/" not in body
    assert "GET / is not the webhook, which is POST /tg/" in caplog.text
    assert secret_part not in caplog.text
    ok = private_text(777, "through the secret path", message_id=2)
    assert await peer.post_to_webhook(ok) == 200
    assert running.inbox.texts == ["through the secret path"]


# ---- outbound -----------------------------------------------------------------------------


async def test_send_renders_markdown_to_html(peer: TelegramBotAPIPeer, start: Start) -> None:
    running = await start()
    result = await running.connector.send(
        OutboundMessage(thread_id="777", text="**hi** <there> & _you_")
    )
    [sent] = peer.sent_messages
    assert sent["text"] == "<b>hi</b> &lt;there&gt; &amp; <i>you</i>"
    assert sent["parse_mode"] == "HTML" and sent["chat_id"] == 777
    assert result.message_ids == ("777:1",)


async def test_forum_topic_reply_lands_in_its_topic(peer: TelegramBotAPIPeer, start: Start) -> None:
    running = await start()
    peer.push_update(group_text(-100123, 42, "question", topic_id=77, message_id=500))
    [question] = await running.inbox.wait_count(1)
    assert question.thread_id == "-100123:77"
    await running.connector.send(
        OutboundMessage(thread_id=question.thread_id, text="answer", reply_to=question.id)
    )
    [sent] = peer.sent_messages
    assert sent["chat_id"] == -100123 and sent["message_thread_id"] == 77
    assert sent["reply_parameters"]["message_id"] == 500


async def test_a_long_reply_is_split_and_only_the_first_part_replies(
    peer: TelegramBotAPIPeer, start: Start
) -> None:
    running = await start()
    text = "\n\n".join(f"Paragraph {i}. " + "Some **bold** words here. " * 40 for i in range(12))
    result = await running.connector.send(
        OutboundMessage(thread_id="777", text=text, reply_to="777:3")
    )
    sent = peer.sent_messages
    assert len(sent) == len(result.message_ids) >= 3
    assert all(visible_length(s["text"]) <= 4096 for s in sent)
    assert "reply_parameters" in sent[0] and all("reply_parameters" not in s for s in sent[1:])
    assert "".join(html_text(s["text"]) for s in sent) == html_text(render_markdown(text))


async def test_a_long_emphasised_reply_arrives_in_pieces_each_whole_and_balanced(
    peer: TelegramBotAPIPeer, start: Start
) -> None:
    running = await start()
    # No space in the bold run of thumbs: it is cut between two of them, never inside one.
    text = "**Summary:** " + "_all good_ " * 50 + "\n\n**xyz" + "👍🏽" * 1500 + "** done"
    result = await running.connector.send(OutboundMessage(thread_id="777", text=text))
    sent = [s["text"] for s in peer.sent_messages]
    assert len(sent) == len(result.message_ids) >= 2
    for piece in sent:
        assert visible_length(piece) <= 4096
        assert balanced(piece), piece[:80]
        shown = html_text(piece).replace("👍🏽", "")
        assert "👍" not in shown and "🏽" not in shown  # no thumb without its skin tone
    assert sent[-2].endswith("👍🏽</b>") and sent[-1].startswith("<b>👍🏽")  # bold on both sides
    assert "".join(html_text(s) for s in sent) == html_text(render_markdown(text))


async def test_a_photo_goes_up_with_its_caption(peer: TelegramBotAPIPeer, start: Start) -> None:
    running = await start()
    picture = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4
    result = await running.connector.send(
        OutboundMessage(
            thread_id="-100123:77",
            text="**Look** at this",
            attachments=(Attachment(kind="image", name="shot.png", data=picture),),
        )
    )
    [call] = peer.calls_of("sendPhoto")
    assert call.files["photo"].data == picture and call.files["photo"].filename == "shot.png"
    assert call.params["caption"] == "<b>Look</b> at this" and call.params["parse_mode"] == "HTML"
    assert call.params["message_thread_id"] == 77
    assert peer.sent_messages == [] and len(result.message_ids) == 1


async def test_pictures_go_as_albums_of_at_most_ten_with_the_caption_on_the_first(
    peer: TelegramBotAPIPeer, start: Start
) -> None:
    running = await start()
    pictures = [
        Attachment(kind="image", name=f"p{i}.png", data=b"\x89PNG" + bytes([i]) * 64)
        for i in range(11)
    ]
    clip = Attachment(kind="video", ref="known-video-id")
    sheet = Attachment(kind="document", name="a.pdf", data=b"%PDF-1.4")
    result = await running.connector.send(
        OutboundMessage(
            thread_id="-100123",
            text="**Holiday**",
            attachments=(*pictures[:9], clip, pictures[9], sheet, pictures[10]),
        )
    )
    # photos and the video: one album of 10, then one photo left over; the document and the
    # last photo cannot share an album with each other.
    [album] = peer.calls_of("sendMediaGroup")
    media = album.params["media"]
    assert [m["type"] for m in media] == ["photo"] * 9 + ["video"]
    assert media[0]["caption"] == "<b>Holiday</b>" and "caption" not in media[1]
    first = media[0]["media"]
    assert album.files[first.removeprefix("attach://")].data == pictures[0].data
    assert media[9]["media"] == "known-video-id"
    sends = [c.method for c in peer.calls if c.method.startswith("send")]
    assert sends == ["sendmediagroup", "sendphoto", "senddocument", "sendphoto"]
    assert "caption" not in peer.calls_of("sendPhoto")[0].params
    assert len(result.message_ids) == 13 and peer.sent_messages == []
    grouped = [m for m in peer.messages.values() if "media_group_id" in m]
    assert len(grouped) == 10 and len({m["media_group_id"] for m in grouped}) == 1


async def test_with_buttons_attachments_go_one_by_one(
    peer: TelegramBotAPIPeer, start: Start
) -> None:
    running = await start()
    photos = tuple(Attachment(kind="image", ref=f"photo-{i}") for i in range(2))
    await running.connector.send(
        OutboundMessage(thread_id="-100123", text="pick", attachments=photos, buttons=(("A", "a"),))
    )
    assert peer.calls_of("sendMediaGroup") == []  # Telegram puts no buttons on an album
    assert len(peer.calls_of("sendPhoto")) == 2


async def test_an_inbound_photo_with_caption_downloads(
    peer: TelegramBotAPIPeer, start: Start
) -> None:
    running = await start(max_download_bytes=1000)
    small = peer.add_file(b"small image bytes", file_path="photos/file_1.jpg")
    big = peer.add_file(b"x" * 2000, file_path="photos/file_2.jpg")
    update = group_text(-100123, 42, "", message_id=8)
    del update["message"]["text"]
    update["message"]["caption"] = "broken button"
    update["message"]["photo"] = [
        {"file_id": small, "file_unique_id": "u1", "width": 9, "height": 9}
    ]
    peer.push_update(update)
    [message] = await running.inbox.wait_count(1)
    assert message.text == "broken button"
    media = running.connector.feature("inbound_media")
    assert await media.download(message.attachments[0]) == b"small image bytes"
    too_big = Attachment(kind="image", ref=big)
    with pytest.raises(PermanentError, match="1000-byte limit"):
        await media.download(too_big)
    with pytest.raises(PermanentError, match="invalid file_id"):
        await media.download(Attachment(kind="image", ref="nope"))


async def test_429_is_raised_with_its_retry_after(peer: TelegramBotAPIPeer, start: Start) -> None:
    running = await start()
    peer.fail_next("sendMessage", status=429, retry_after=7)
    with pytest.raises(RateLimitedError) as caught:
        await running.connector.send(OutboundMessage(thread_id="-100123", text="hi"))
    assert caught.value.retry_after == 7.0 and caught.value.scope == "thread"
    assert TOKEN not in str(caught.value)
    # One line, in Telegram's words, as `check` and /healthz show it.
    assert str(caught.value) == (
        "Telegram rate limit: retry after 7 s (Too Many Requests: retry after 7)"
    )
    await running.connector.send(OutboundMessage(thread_id="-100123", text="hi"))
    assert [s["text"] for s in peer.sent_messages] == ["hi"]


async def test_a_send_to_a_group_that_became_a_supergroup_goes_to_the_new_chat(
    peer: TelegramBotAPIPeer, start: Start
) -> None:
    running = await start()
    peer.fail_next(
        "sendMessage",
        status=400,
        description="Bad Request: group chat was upgraded to a supergroup chat",
        migrate_to=-1009999,
    )
    await running.connector.send(OutboundMessage(thread_id="-4242", text="first"))
    await running.connector.send(OutboundMessage(thread_id="-4242", text="second"))
    chats = [str(c.params["chat_id"]) for c in peer.calls_of("sendMessage", answered=None)]
    assert chats == ["-4242", "-1009999", "-1009999"]  # asked once, then remembered
    assert [s["text"] for s in peer.sent_messages] == ["first", "second"]


async def test_a_group_that_became_a_supergroup_is_remembered_across_restarts_and_parts(
    peer: TelegramBotAPIPeer, start: Start, make_connector: Callable[..., TelegramConnector]
) -> None:
    peer.migrate_chat(-4242, -1009999)
    first = await start()
    long_text = "\n\n".join("Paragraph. " * 300 for _ in range(3))
    await first.connector.send(OutboundMessage(thread_id="-4242", text=long_text))
    chats = [c.params["chat_id"] for c in peer.calls_of("sendMessage", answered=None)]
    assert chats == [-4242, -1009999, -1009999, -1009999]  # the later parts go there at once
    await first.stop()
    peer.calls.clear()
    second = await start()  # a restart: the store remembers, not the connector
    await second.connector.send(OutboundMessage(thread_id="-4242", text="after the restart"))
    await second.connector.feature("activity").typing("-4242")
    assert [c.params["chat_id"] for c in peer.calls_of("sendMessage", answered=None)] == [-1009999]
    assert [c.params["chat_id"] for c in peer.calls_of("sendChatAction", answered=None)] == [
        -1009999
    ]


async def test_the_upgrade_service_message_moves_replies_before_any_400(
    peer: TelegramBotAPIPeer, start: Start
) -> None:
    running = await start()
    # Telegram's service message in the old group (Message.migrate_to_chat_id).
    upgrade = group_text(-4242, 555, "")
    del upgrade["message"]["text"]
    upgrade["message"]["chat"]["type"] = "group"
    upgrade["message"]["migrate_to_chat_id"] = -1009999
    peer.migrate_chat(-4242, -1009999)
    peer.push_update(upgrade)
    peer.push_update(group_text(-1009999, 555, "hello from the supergroup"))
    await running.inbox.wait_count(1)
    await running.connector.send(OutboundMessage(thread_id="-4242", text="late answer"))
    assert [c.params["chat_id"] for c in peer.calls_of("sendMessage", answered=None)] == [-1009999]


async def test_a_retry_after_a_failure_mid_split_does_not_repeat_parts(
    peer: TelegramBotAPIPeer, start: Start
) -> None:
    running = await start()
    text = "\n\n".join("Paragraph. " * 300 for _ in range(3))
    message = OutboundMessage(thread_id="777", text=text, idempotency_key="turn-1")
    peer.fail_next("sendMessage", status=429, retry_after=1, after=1)
    with pytest.raises(RateLimitedError):
        await running.connector.send(message)
    assert len(peer.sent_messages) == 1
    result = await running.connector.send(message)
    assert len(peer.sent_messages) == len(result.message_ids) == 3
    assert len(set(result.message_ids)) == 3


@pytest.mark.parametrize(
    ("failure", "error"),
    [
        ({"status": 502}, TransientError),
        ({"drop": True}, TransientError),
        ({"status": 403}, PermanentError),
        ({"status": 400, "description": "Bad Request: chat not found"}, NotFoundError),
        ({"status": 400, "description": "Bad Request: can't parse entities"}, PermanentError),
    ],
)
async def test_send_failures_are_translated(
    peer: TelegramBotAPIPeer, start: Start, failure: dict[str, Any], error: type[Exception]
) -> None:
    running = await start()
    peer.fail_next("sendMessage", **failure)
    with pytest.raises(error) as caught:
        await running.connector.send(OutboundMessage(thread_id="777", text="x"))
    assert TOKEN not in str(caught.value)


# ---- features -----------------------------------------------------------------------------


async def test_features(peer: TelegramBotAPIPeer, start: Start) -> None:
    running = await start()
    conn = running.connector
    assert conn.feature("history") is None and conn.feature("directory") is None
    await conn.feature("activity").typing("-100123:77")
    [action] = peer.calls_of("sendChatAction")
    assert action.params["action"] == "typing" and action.params["message_thread_id"] == 77

    sent = await conn.feature("interactions").send_buttons("777", "Pick", [("Yes", "y")])
    [message] = peer.sent_messages
    assert message["reply_markup"] == {"inline_keyboard": [[{"text": "Yes", "callback_data": "y"}]]}
    await conn.feature("edit").edit("777", sent.message_id, "**Picked**")
    [edit] = peer.calls_of("editMessageText")
    assert edit.params["text"] == "<b>Picked</b>" and edit.params["message_id"] == 1
    await conn.feature("edit").edit("777", sent.message_id, "**Picked**")  # the same: done
    await conn.feature("reactions").react("777", sent.message_id, "👍")
    assert peer.reactions[(777, 1)] == [{"type": "emoji", "emoji": "👍"}]
    await conn.feature("delete").delete("777", sent.message_id)
    assert (777, 1) not in peer.messages
    with pytest.raises(NotFoundError):
        await conn.feature("delete").delete("777", sent.message_id)


async def test_an_edit_keeps_the_buttons_a_message_was_sent_with_also_after_a_restart(
    peer: TelegramBotAPIPeer, start: Start
) -> None:
    """Telegram takes the inline keyboard off a message whose text is edited without it."""
    running = await start()
    text = "Part one. " * 500 + "\n\nPick one"  # two messages: the buttons are on the second
    sent = await running.connector.feature("interactions").send_buttons(
        "777", text, [("Yes", "y"), ("No", "n")]
    )
    keyboard = {
        "inline_keyboard": [
            [{"text": "Yes", "callback_data": "y"}],
            [{"text": "No", "callback_data": "n"}],
        ]
    }
    first, last = sent.message_ids
    await running.connector.feature("edit").edit("777", last, "Pick one, quickly")
    assert peer.messages[(777, 2)]["text"] == "Pick one, quickly"
    assert peer.messages[(777, 2)]["reply_markup"] == keyboard
    await running.stop()
    again = await start()  # a new process: what the buttons were is in the store
    await again.connector.feature("edit").edit("777", last, "Pick one, now")
    assert peer.messages[(777, 2)]["reply_markup"] == keyboard
    await again.connector.feature("edit").edit("777", first, "Part one.")
    assert "reply_markup" not in peer.messages[(777, 1)]  # it had none: none is added


async def test_an_edit_replaces_the_buttons_or_takes_them_off_also_after_a_restart(
    peer: TelegramBotAPIPeer, start: Start
) -> None:
    running = await start()
    edit = running.connector.feature("edit")
    sent = await running.connector.feature("interactions").send_buttons(
        "777", "Refund 5 EUR?", [("Approve", "approve")]
    )
    undo = {"inline_keyboard": [[{"text": "Undo", "callback_data": "undo"}]]}
    await edit.edit("777", sent.message_id, "Approved by Ada", buttons=[("Undo", "undo")])
    assert peer.messages[(777, 1)]["reply_markup"] == undo
    await running.stop()
    again = await start()  # a new process: the buttons it now has are the ones kept
    edit = again.connector.feature("edit")
    await edit.edit("777", sent.message_id, "Approved by Ada.")
    assert peer.messages[(777, 1)]["reply_markup"] == undo
    await edit.edit("777", sent.message_id, "Approved", buttons=())
    assert peer.messages[(777, 1)]["text"] == "Approved"
    assert "reply_markup" not in peer.messages[(777, 1)]
    await edit.edit("777", sent.message_id, "Approved.")  # none kept: none come back
    assert "reply_markup" not in peer.messages[(777, 1)]


async def test_an_edit_of_buttons_no_longer_known_fails_naming_the_message_not_dropping_them(
    peer: TelegramBotAPIPeer, start: Start, sqlite_store: SqliteStore
) -> None:
    """Which buttons a message has is kept for `dedupe_days`; Telegram has no way to ask. An
    edit keeping them after that took the keyboard off without a word."""
    running = await start()
    edit = running.connector.feature("edit")
    before = await running.connector.send(OutboundMessage(thread_id="777", text="Hi"))
    asked = await running.connector.feature("interactions").send_buttons(
        "777", "Refund 5 EUR?", [("Approve", "approve")]
    )
    after = await running.connector.send(OutboundMessage(thread_id="777", text="Any news?"))
    await edit.edit("777", before.message_id, "Hi!")  # within the kept time: surely none
    keyboard = peer.messages[(777, 2)]["reply_markup"]
    now = sqlite_store.wall_clock
    sqlite_store.wall_clock = lambda: now() + 8 * 86400  # past the 7 days records are kept
    with pytest.raises(PermanentError, match=f"buttons of message {asked.message_id}") as exc:
        await edit.edit("777", asked.message_id, "Refund 7 EUR?")
    assert "\n" not in str(exc.value) and "buttons=()" in str(exc.value)
    assert peer.messages[(777, 2)]["reply_markup"] == keyboard  # untouched
    assert [c.params["message_id"] for c in peer.calls_of("editMessageText")] == [1]
    await edit.edit("777", after.message_id, "Any news?!")  # sent after the last buttons
    await edit.edit("777", asked.message_id, "Refund withdrawn", buttons=())
    assert "reply_markup" not in peer.messages[(777, 2)]
    await edit.edit("777", asked.message_id, "Refund withdrawn.")  # taken off: known
    assert peer.messages[(777, 2)]["text"] == "Refund withdrawn."


async def test_an_edited_reply_keeps_its_link_without_a_preview(
    peer: TelegramBotAPIPeer, start: Start
) -> None:
    running = await start()
    sent = await running.connector.send(
        OutboundMessage(thread_id="777", text="see https://a.example")
    )
    await running.connector.feature("edit").edit("777", sent.message_id, "see https://b.example")
    # Telegram shows a link preview unless told not to, on an edit as on a send.
    for call in [*peer.calls_of("sendMessage"), *peer.calls_of("editMessageText")]:
        assert call.params.get("link_preview_options") == {"is_disabled": True}, call.method


def test_album_runs_follow_telegram_rules() -> None:
    from talkbridge.connectors.telegram.transport import _albums

    def kinds(*names: str) -> list[list[str]]:
        attachments = [Attachment(kind=k, ref=f"r{i}") for i, k in enumerate(names)]  # type: ignore[arg-type]
        return [[a.kind for a in run] for run in _albums(attachments)]

    assert kinds("image", "video", "image") == [["image", "video", "image"]]
    assert kinds("document", "document", "image") == [["document", "document"], ["image"]]
    assert kinds("audio", "voice", "audio") == [["audio"], ["voice"], ["audio"]]
    assert kinds("image", "sticker", "image") == [["image"], ["sticker"], ["image"]]
    assert [len(r) for r in kinds(*["image"] * 23)] == [10, 10, 3]
