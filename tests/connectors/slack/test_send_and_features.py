"""Sending and the optional features against the peer's Web API."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from talkbridge.connectors.slack.mrkdwn import plain_text, render_markdown
from talkbridge.errors import (
    NotFoundError,
    PermanentError,
    RateLimitedError,
    TransientError,
    UnauthorizedError,
)
from talkbridge.message import Attachment, OutboundMessage
from talkbridge.store import SqliteStore
from talkbridge.talk import History
from tests.connectors.slack.conftest import BOT_TOKEN
from tests.peers.slack import SlackPeer, buttons_of, shown

DM = "D0DM00001"


async def test_markdown_is_posted_as_mrkdwn_to_the_conversation(
    peer: SlackPeer, make_connector: Callable[..., Any]
) -> None:
    connector = make_connector()
    result = await connector.send(OutboundMessage(thread_id=DM, text="**hi** & <bye>"))
    [post] = peer.posted()
    assert post["channel"] == DM and post["text"] == "*hi* &amp; &lt;bye&gt;"
    assert "thread_ts" not in post
    assert result.message_ids == (f"{DM}:{peer.messages[DM][0]['ts']}",)
    await connector.close()


async def test_a_reply_in_a_thread_stays_in_that_thread(
    peer: SlackPeer, make_connector: Callable[..., Any]
) -> None:
    connector = make_connector()
    await connector.send(OutboundMessage(thread_id="C0GENERAL1:1700000000.000100", text="ok"))
    [post] = peer.posted()
    assert post["channel"] == "C0GENERAL1" and post["thread_ts"] == "1700000000.000100"
    await connector.close()


async def test_reply_in_thread_starts_a_thread_under_a_channel_message_but_not_in_dms(
    peer: SlackPeer, make_connector: Callable[..., Any]
) -> None:
    connector = make_connector(reply_in_thread=True)
    await connector.send(
        OutboundMessage(thread_id="C0GENERAL1", text="a", reply_to="C0GENERAL1:1700000000.000100")
    )
    await connector.send(
        OutboundMessage(thread_id=DM, text="b", reply_to=f"{DM}:1700000000.000200")
    )
    first, second = peer.posted()
    assert first["thread_ts"] == "1700000000.000100"
    assert "thread_ts" not in second
    await connector.close()


async def test_long_replies_are_split_and_every_part_is_posted_in_order(
    peer: SlackPeer, make_connector: Callable[..., Any]
) -> None:
    connector = make_connector()
    text = "\n\n".join(f"Part {i}. " + "lorem ipsum " * 100 for i in range(12))
    result = await connector.send(OutboundMessage(thread_id=DM, text=text))
    posts = peer.posted()
    assert len(posts) == len(result.message_ids) > 1
    assert all(len(p["text"]) <= 4000 for p in posts)
    assert posts[0]["text"].startswith("Part 0.") and "Part 11." in posts[-1]["text"]
    await connector.close()


async def test_a_long_emphasised_reply_is_posted_in_pieces_that_each_show_their_marks(
    peer: SlackPeer, make_connector: Callable[..., Any]
) -> None:
    connector = make_connector()
    text = "**Summary:** " + "all good " * 50 + "\n\n**very" + " important words" * 300 + "**"
    result = await connector.send(OutboundMessage(thread_id=DM, text=text))
    posts = [p["text"] for p in peer.posted()]
    assert len(posts) == len(result.message_ids) >= 2
    for post in posts:
        assert len(post) <= 4000
        assert "*" not in plain_text(post), post[-40:]  # every bold closed where it is opened
    assert all(post.startswith("*") and post.endswith("*") for post in posts[1:])
    assert (
        " ".join(plain_text(p) for p in posts).split() == plain_text(render_markdown(text)).split()
    )
    await connector.close()


async def test_a_retry_after_a_failure_mid_split_resumes_without_repeating(
    peer: SlackPeer, make_connector: Callable[..., Any]
) -> None:
    connector = make_connector()
    text = "\n\n".join(f"Part {i}. " + "lorem ipsum " * 100 for i in range(8))
    message = OutboundMessage(thread_id=DM, text=text, idempotency_key="reply:1")
    peer.fail_next("chat.postMessage", status=500, after=1)
    with pytest.raises(TransientError, match="internal_error"):
        await connector.send(message)
    result = await connector.send(message)
    texts = [p["text"] for p in peer.posted()]
    assert len(texts) == len(set(texts)) == len(result.message_ids)
    await connector.close()


async def test_a_reply_cut_off_is_finished_by_the_next_process_in_its_thread_not_repeated(
    peer: SlackPeer, make_connector: Callable[..., Any]
) -> None:
    """The bridge died after part 2 of 4 and answers the message again at its next start."""
    first = make_connector(reply_in_thread=True)
    text = "\n\n".join(f"Part {i}. " + "lorem ipsum " * 300 for i in range(4))
    asked = "C0GENERAL1:1700000000.000100"
    message = OutboundMessage(
        thread_id="C0GENERAL1", text=text, reply_to=asked, idempotency_key="reply:1"
    )
    peer.fail_next("chat.postMessage", status=429, retry_after=30, after=2)
    with pytest.raises(RateLimitedError):
        await first.send(message)
    await first.close()
    second = make_connector(reply_in_thread=True)  # the same store, nothing in memory
    result = await second.send(message)
    posts = peer.posted()
    assert [post["text"][:6] for post in posts] == ["Part 0", "Part 1", "Part 2", "Part 3"]
    assert {post["thread_ts"] for post in posts} == {"1700000000.000100"}
    assert len(result.message_ids) == 4
    await second.close()


async def test_an_answer_that_is_not_json_is_a_transient_failure_the_retry_gets_past(
    peer: SlackPeer, make_connector: Callable[..., Any]
) -> None:
    connector = make_connector()
    peer.fail_next("chat.postMessage", not_json=True)  # a proxy's error page, with HTTP 200
    with pytest.raises(TransientError, match=r"chat\.postMessage: the answer was not Slack.s JSON"):
        await connector.send(OutboundMessage(thread_id=DM, text="x"))
    await connector.send(OutboundMessage(thread_id=DM, text="x"))
    assert [p["text"] for p in peer.posted()] == ["x"]
    await connector.close()


async def test_an_api_base_without_the_api_path_is_named_in_the_error(
    peer: SlackPeer, make_connector: Callable[..., Any]
) -> None:
    connector = make_connector(api_base=peer.base_url)  # forgot the /api/
    with pytest.raises(NotFoundError, match="check api_base, which ends in /api/"):
        await connector.check()
    await connector.close()


async def test_a_429_on_posting_pauses_that_channel_only_and_never_sleeps(
    peer: SlackPeer, make_connector: Callable[..., Any]
) -> None:
    """chat.postMessage is limited per channel first (about one message a second, Slack's
    rate-limit docs, "Special Tier"), per workspace besides."""
    connector = make_connector()
    peer.fail_next("chat.postMessage", status=429, retry_after=30)
    with pytest.raises(RateLimitedError) as caught:
        await connector.send(OutboundMessage(thread_id=DM, text="x"))
    assert caught.value.scope == "thread" and caught.value.retry_after == 30
    for thread in (DM, "D0DM00001:1700000000.000100"):  # the channel, or a thread in it
        with pytest.raises(RateLimitedError) as again:  # fails fast: the peer is not asked
            await connector.send(OutboundMessage(thread_id=thread, text="y"))
        assert again.value.scope == "thread" and 0 < again.value.retry_after <= 30
    assert len(peer.calls_of("chat.postMessage", ok=None)) == 1
    await connector.send(OutboundMessage(thread_id="C0GENERAL1", text="z"))  # another channel
    assert [p["text"] for p in peer.posted()] == ["z"]
    assert (await connector.user("U0ADA0001")) is not None  # another tier carries on
    await connector.close()


async def test_a_429_on_posting_in_a_second_channel_meanwhile_pauses_the_workspace(
    peer: SlackPeer, make_connector: Callable[..., Any]
) -> None:
    """Two channels limited at once: that is the workspace-wide limit, which every further
    channel would meet with a 429 of its own."""
    connector = make_connector()
    peer.fail_next("chat.postMessage", 2, status=429, retry_after=30)
    with pytest.raises(RateLimitedError) as first:
        await connector.send(OutboundMessage(thread_id=DM, text="x"))
    with pytest.raises(RateLimitedError) as second:
        await connector.send(OutboundMessage(thread_id="C0GENERAL1", text="y"))
    assert (first.value.scope, second.value.scope) == ("thread", "connection")
    with pytest.raises(RateLimitedError) as third:  # fails fast: the peer is not asked
        await connector.send(OutboundMessage(thread_id="C0RANDOM01", text="z"))
    assert third.value.scope == "connection" and 0 < third.value.retry_after <= 30
    assert len(peer.calls_of("chat.postMessage", ok=None)) == 2
    await connector.close()


async def test_a_revoked_bot_token_is_unauthorized_and_never_quoted(
    peer: SlackPeer, make_connector: Callable[..., Any]
) -> None:
    connector = make_connector()
    peer.revoke(BOT_TOKEN)
    with pytest.raises(UnauthorizedError) as caught:
        await connector.send(OutboundMessage(thread_id=DM, text="x"))
    assert "token_revoked" in str(caught.value) and BOT_TOKEN not in str(caught.value)
    await connector.close()


async def test_a_missing_bot_scope_is_named_with_where_to_add_it(
    peer: SlackPeer, make_connector: Callable[..., Any]
) -> None:
    connector = make_connector()
    peer.fail_next("chat.postMessage", needed="chat:write")
    with pytest.raises(PermanentError) as caught:
        await connector.send(OutboundMessage(thread_id=DM, text="hi"))
    assert str(caught.value) == (
        "chat.postMessage: Slack refused the call: missing_scope (the bot token lacks the scope "
        "chat:write: add it in the app's settings under OAuth & Permissions > Bot Token Scopes, "
        "then reinstall the app to the workspace)"
    )
    await connector.close()


async def test_bad_targets_are_refused_with_a_clear_error(
    peer: SlackPeer, make_connector: Callable[..., Any]
) -> None:
    connector = make_connector()
    with pytest.raises(PermanentError, match="not a Slack thread id"):
        await connector.send(OutboundMessage(thread_id="general", text="x"))
    with pytest.raises(PermanentError, match="not a Slack message id"):
        await connector.edit(DM, "nope", "x")
    with pytest.raises(NotFoundError, match="message_not_found"):
        await connector.delete(DM, f"{DM}:1.000001")
    assert peer.calls_of("chat.postMessage", ok=None) == []
    await connector.close()


async def test_attachments_go_through_the_upload_flow_into_the_thread(
    peer: SlackPeer, make_connector: Callable[..., Any]
) -> None:
    connector = make_connector()
    result = await connector.send(
        OutboundMessage(
            thread_id="C0GENERAL1:1700000000.000100",
            text="report attached",
            attachments=(Attachment(kind="document", name="r.txt", data=b"numbers"),),
        )
    )
    [file] = [f for f in peer.files.values() if f["shared"]]
    assert file["data"] == b"numbers" and file["name"] == "r.txt"
    assert file["channel"] == "C0GENERAL1" and file["thread_ts"] == "1700000000.000100"
    assert result.message_ids[-1] == f"file:{file['id']}"
    assert [p["text"] for p in peer.posted()] == ["report attached"]
    await connector.close()


async def test_inbound_files_download_with_the_bot_token_only_to_slack_hosts(
    peer: SlackPeer, make_connector: Callable[..., Any]
) -> None:
    connector = make_connector()
    file_id = peer.add_file(b"hello file")
    data = await connector.download(Attachment(kind="document", ref=file_id))
    assert data == b"hello file"
    with pytest.raises(PermanentError, match="over the 4-byte limit"):
        await connector.download(Attachment(kind="document", ref=file_id), max_bytes=4)
    peer.files[file_id]["url_private_download"] = "https://evil.example/steal"
    with pytest.raises(NotFoundError, match="may use"):
        await connector.download(Attachment(kind="document", ref=file_id))
    await connector.close()


async def test_edit_delete_and_react_on_a_sent_message(
    peer: SlackPeer, make_connector: Callable[..., Any]
) -> None:
    connector = make_connector()
    sent = await connector.send(OutboundMessage(thread_id=DM, text="draft"))
    await connector.edit(DM, sent.message_id, "**final**")
    assert peer.messages[DM][0]["text"] == "*final*"
    await connector.react(DM, sent.message_id, "👍")
    await connector.react(DM, sent.message_id, ":eyes:")
    assert [r["name"] for r in peer.reactions] == ["+1", "eyes"]
    with pytest.raises(PermanentError, match="reaction name"):
        await connector.react(DM, sent.message_id, "🦜🦜")
    await connector.delete(DM, sent.message_id)
    assert peer.messages[DM] == []
    await connector.close()


async def test_history_of_a_channel_and_of_a_thread_oldest_first(
    peer: SlackPeer, make_connector: Callable[..., Any]
) -> None:
    connector = make_connector()
    await connector.check()
    channel = "C0GENERAL1"
    root = {"type": "message", "user": "U0ADA0001", "text": "root", "ts": "1700000000.000100"}
    reply = {
        "type": "message",
        "user": "U0GRACE01",
        "text": "in thread",
        "ts": "1700000000.000200",
        "thread_ts": root["ts"],
    }
    later = {"type": "message", "user": "U0ADA0001", "text": "later", "ts": "1700000000.000300"}
    peer.messages[channel] = [root, reply, later]
    history: History = connector.feature("history")
    top = await history.fetch(channel)
    assert [m.text for m in top] == ["root", "later"]
    assert top[0].display_name == "ada"
    thread = await history.fetch(f"{channel}:{root['ts']}")
    assert [m.text for m in thread] == ["root", "in thread"]
    before = await history.fetch(channel, before=f"{channel}:{later['ts']}")
    assert [m.text for m in before] == ["root"]
    await connector.close()


async def test_directory_names_users_and_conversations_and_caches_users(
    peer: SlackPeer, make_connector: Callable[..., Any]
) -> None:
    connector = make_connector()
    peer.add_conversation("C0GENERAL1", "general")
    peer.add_conversation(DM, user="U0GRACE01")
    ada = await connector.user("U0ADA0001")
    again = await connector.user("U0ADA0001")
    assert ada is not None and ada == again and ada.name == "ada"
    assert len(peer.calls_of("users.info")) == 1
    assert await connector.user("U0NOBODY1") is None
    general = await connector.thread("C0GENERAL1")
    assert general is not None and general.name == "#general"
    dm = await connector.thread(DM)
    assert dm is not None and dm.name == "DM with Grace Hopper"
    await connector.close()


async def test_typing_sets_an_assistant_thread_status_and_stops_where_not_allowed(
    peer: SlackPeer, make_connector: Callable[..., Any]
) -> None:
    connector = make_connector()
    await connector.typing(DM)  # not a thread: nothing to show, nothing asked
    await connector.typing(f"{DM}:1700000000.000100")
    assert peer.statuses[0]["thread_ts"] == "1700000000.000100"
    peer.fail_next("assistant.threads.setStatus", status=200, error="not_allowed")
    with pytest.raises(PermanentError):
        await connector.typing(f"{DM}:1700000000.000100")
    await connector.typing(f"{DM}:1700000000.000100")
    assert len(peer.calls_of("assistant.threads.setStatus", ok=None)) == 2
    await connector.close()


async def test_the_text_above_buttons_is_split_to_fit_its_section_not_cut(
    peer: SlackPeer, make_connector: Callable[..., Any]
) -> None:
    connector = make_connector()
    text = "Start. " + "lorem ipsum " * 280 + "THE END"  # over a section's 3,000, under 4,000
    await connector.send(OutboundMessage(thread_id=DM, text=text, buttons=(("Yes", "yes"),)))
    posts = peer.posted()
    # A message with blocks shows its blocks; its `text` is only the notification's fallback.
    shown = [
        " ".join(b["text"]["text"] for b in p["blocks"] if b["type"] == "section")
        if p.get("blocks")
        else p["text"]
        for p in posts
    ]
    assert len(posts) == 2 and shown[0].startswith("Start.") and shown[-1].endswith("THE END")
    assert " ".join(shown).split() == text.split()  # every word shown, once
    assert posts[-1]["blocks"][-1]["type"] == "actions"
    await connector.close()


async def test_mentions_written_above_buttons_notify_nobody(
    peer: SlackPeer, make_connector: Callable[..., Any]
) -> None:
    connector = make_connector()
    text = "@channel and @here: vote <!everyone>"  # an agent quoting a user, say
    await connector.send(
        OutboundMessage(thread_id="C0GENERAL1", text=text, buttons=(("Yes", "yes"),))
    )
    await connector.send(OutboundMessage(thread_id="C0GENERAL1", text=text))
    with_buttons, without = peer.messages["C0GENERAL1"]
    assert with_buttons["blocks"][0]["text"]["text"].startswith("@channel and @here")
    assert with_buttons["pings"] == without["pings"] == []
    await connector.close()


async def test_an_edit_shows_the_new_text_above_the_buttons_also_after_a_restart(
    peer: SlackPeer, make_connector: Callable[..., Any]
) -> None:
    """A message with buttons shows its blocks; `chat.update` with `text` alone takes them off
    (the buttons with them), so the edit sends new blocks around the kept buttons."""
    connector = make_connector()
    choices = [("Approve", "approve"), ("Deny", "deny")]
    sent = await connector.send_buttons(DM, "Refund 5 EUR?", choices)
    await connector.close()
    again = make_connector()  # a new process: what the buttons were is in the store
    await again.edit(DM, sent.message_id, "Refund **7** EUR?")
    [message] = peer.messages[DM]
    assert shown(message) == "Refund *7* EUR?" and buttons_of(message) == choices
    assert message["text"] == "Refund *7* EUR?"  # the notification's fallback follows
    with pytest.raises(PermanentError, match="3000"):
        await again.edit(DM, sent.message_id, "x" * 3500)  # a section holds no more
    assert shown(message) == "Refund *7* EUR?"
    await again.close()


async def test_an_edit_replaces_the_buttons_or_takes_them_off(
    peer: SlackPeer, make_connector: Callable[..., Any]
) -> None:
    connector = make_connector()
    sent = await connector.send_buttons(DM, "Refund 5 EUR?", [("Approve", "approve")])
    [message] = peer.messages[DM]
    await connector.edit(DM, sent.message_id, "Approved by Ada", buttons=[("Undo", "undo")])
    assert shown(message) == "Approved by Ada" and buttons_of(message) == [("Undo", "undo")]
    await connector.edit(DM, sent.message_id, "Approved by Ada.")  # kept: the new ones
    assert buttons_of(message) == [("Undo", "undo")]
    await connector.edit(DM, sent.message_id, "Approved", buttons=())
    assert shown(message) == "Approved" and "blocks" not in message
    await connector.edit(DM, sent.message_id, "Approved.")  # none kept: none come back
    assert shown(message) == "Approved." and "blocks" not in message
    plain = await connector.send(OutboundMessage(thread_id=DM, text="Pick later"))
    await connector.edit(DM, plain.message_id, "Pick now", buttons=[("Now", "now")])
    assert buttons_of(peer.messages[DM][1]) == [("Now", "now")]
    with pytest.raises(PermanentError, match="label, value"):
        await connector.edit(DM, plain.message_id, "x", buttons=None)
    await connector.close()


async def test_an_edit_of_buttons_no_longer_known_fails_naming_the_message_not_dropping_them(
    peer: SlackPeer, make_connector: Callable[..., Any], sqlite_store: SqliteStore
) -> None:
    """Which buttons a message has is kept for `dedupe_days`: an edit keeping them after that
    took them off without a word (Slack drops the blocks of an update sending text alone)."""
    connector = make_connector()
    choices = [("Approve", "approve"), ("Deny", "deny")]
    asked = await connector.send_buttons(DM, "Refund 5 EUR?", choices)
    later = await connector.send(OutboundMessage(thread_id=DM, text="Any news?"))
    now = sqlite_store.wall_clock
    sqlite_store.wall_clock = lambda: now() + 8 * 86400  # past the 7 days records are kept
    with pytest.raises(PermanentError, match=f"buttons of message {asked.message_id}") as exc:
        await connector.edit(DM, asked.message_id, "Refund 7 EUR?")
    assert "\n" not in str(exc.value) and "buttons=()" in str(exc.value)
    [message, _] = peer.messages[DM]
    assert shown(message) == "Refund 5 EUR?" and buttons_of(message) == choices  # untouched
    assert peer.calls_of("chat.update") == []
    # What surely had none is edited as before: a message sent after the last one with
    # buttons, and one sent since (a new window); and a choice given is a choice made.
    await connector.edit(DM, later.message_id, "Any news? (edited)")
    fresh = await connector.send(OutboundMessage(thread_id=DM, text="Hello again"))
    await connector.edit(DM, fresh.message_id, "Hello again!")
    await connector.edit(DM, asked.message_id, "Refund withdrawn", buttons=())
    assert shown(message) == "Refund withdrawn" and "blocks" not in message
    await connector.edit(DM, asked.message_id, "Refund withdrawn.")  # none since: none kept
    assert [shown(m) for m in peer.messages[DM]] == [
        "Refund withdrawn.",
        "Any news? (edited)",
        "Hello again!",
    ]
    await connector.close()


async def test_buttons_on_a_message_of_files_alone_are_posted_after_the_files(
    peer: SlackPeer, make_connector: Callable[..., Any]
) -> None:
    connector = make_connector()
    report = Attachment(kind="document", name="r.txt", data=b"numbers")
    result = await connector.send(
        OutboundMessage(thread_id=DM, attachments=(report,), buttons=(("Approve", "approve"),))
    )
    [file] = [f for f in peer.files.values() if f["shared"]]
    [post] = peer.messages[DM]
    assert buttons_of(post) == [("Approve", "approve")] and post["text"] == "Approve"
    assert result.message_ids == (f"file:{file['id']}", f"{DM}:{post['ts']}")
    await connector.close()
