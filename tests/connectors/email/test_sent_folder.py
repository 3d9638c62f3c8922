"""Replies saved to the mailbox's Sent folder (IMAP APPEND), once, against Dovecot."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from talkbridge.connectors.email.transport import EmailConnector
from talkbridge.errors import TransientError
from talkbridge.message import OutboundMessage
from tests.connectors.email.conftest import mail
from tests.peers.email import DovecotPeer, ImapCutter, ImapStandIn, SmtpPeer

WITH_SENT = pytest.mark.parametrize("dovecot", [{"sent": "Sent"}], indirect=True)


def sent_ids(dovecot: DovecotPeer, folder: str = "Sent") -> list[tuple[str, str]]:
    """(Message-ID, Maildir flags) of each mail in the user help's `folder`."""
    return [(str(m["Message-ID"]), flags) for m, flags in dovecot.folder("help", folder)]


@WITH_SENT
async def test_a_reply_is_saved_once_to_the_folder_the_server_marks_sent(
    dovecot: DovecotPeer, smtp: SmtpPeer, start: Callable[..., Any]
) -> None:
    """A support desk reading the mailbox in a mail client sees our side of the conversation,
    once: not again when a retry sends it to a recipient that deferred it."""
    running = await start()
    connector: EmailConnector = running.connector
    dovecot.deliver("help", mail(body="printer down", Cc="carol@example.org"))
    [question] = await running.inbox.wait_count(1)
    out = OutboundMessage(thread_id=question.thread_id, text="on it", idempotency_key="r:1")
    smtp.refuse_next_recipient("450 4.2.1 mailbox busy", "carol@example.org")
    with pytest.raises(TransientError, match=r"deferred the reply for carol@example\.org"):
        await connector.send(out)
    result = await connector.send(out)  # to carol alone
    await connector.wait_for(lambda: connector.saved == 1)
    assert [m.rcpt_tos for m in smtp.received] == [["ada@example.org"], ["carol@example.org"]]
    [(saved, flags)] = sent_ids(dovecot)
    assert saved == result.message_id and flags == "S"  # read: nobody needs to open it
    [(copy, _)] = dovecot.folder("help", "Sent")
    assert copy.get_body(("plain",)).get_content().strip() == "on it"
    assert copy["To"] == "ada@example.org" and copy["Cc"] == "carol@example.org"


@WITH_SENT
async def test_a_reply_sent_again_after_a_lost_answer_or_a_restart_is_not_saved_twice(
    dovecot: DovecotPeer, smtp: SmtpPeer, make_connector: Callable[..., EmailConnector]
) -> None:
    out = OutboundMessage(thread_id="bob@example.net", text="hi", idempotency_key="r:1")
    smtp.hang_up_after_data = 1  # the server took it; the client cannot tell
    with pytest.raises(TransientError):
        await make_connector().send(out)
    connector = make_connector()  # sent again, after a restart
    result = await connector.send(out)
    await connector.wait_for(lambda: connector.saved == 1)
    again = make_connector()  # and again: a crash before the send was recorded
    await again.send(out)
    await again.wait_for(lambda: again.saved == 1)
    assert len(smtp.received) == 3
    assert sent_ids(dovecot) == [(result.message_id, "S")]


async def test_a_named_sent_folder_is_created_when_missing_and_used(
    dovecot: DovecotPeer, smtp: SmtpPeer, make_connector: Callable[..., EmailConnector]
) -> None:
    imap = make_connector().config.imap.model_dump() | {"sent_folder": "Envoyés"}
    imap["password"] = imap["password"].get_secret_value()
    connector = make_connector(imap=imap)
    out = OutboundMessage(thread_id="bob@example.net", text="hi")
    first = await connector.send(out)
    second = await connector.send(out)
    await connector.wait_for(lambda: connector.saved == 2)
    ids = sorted(mid for mid, _ in sent_ids(dovecot, "Envoy&AOk-s"))  # modified UTF-7
    assert ids == sorted([first.message_id, second.message_id])


async def test_no_copy_is_saved_without_a_sent_folder_or_when_turned_off(
    dovecot: DovecotPeer,
    smtp: SmtpPeer,
    make_connector: Callable[..., EmailConnector],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("INFO")
    connector = make_connector()  # the server marks no folder \Sent
    await connector.send(OutboundMessage(thread_id="bob@example.net", text="hi"))
    await connector.send(OutboundMessage(thread_id="bob@example.net", text="again"))
    await connector.wait_for(lambda: connector.saved == 2)
    said = [r.getMessage() for r in caplog.records if "marks no folder" in r.getMessage()]
    assert len(said) == 1 and "imap.sent_folder" in said[0]  # said once, not at every reply
    assert len(smtp.received) == 2 and not (dovecot.maildir("help") / ".Sent").exists()


@WITH_SENT
async def test_sent_folder_false_saves_nothing(
    dovecot: DovecotPeer, smtp: SmtpPeer, make_connector: Callable[..., EmailConnector]
) -> None:
    imap = make_connector().config.imap.model_dump() | {"sent_folder": None}
    imap["password"] = imap["password"].get_secret_value()
    connector = make_connector(imap=imap)
    await connector.send(OutboundMessage(thread_id="bob@example.net", text="x"))
    await connector.close()  # (would wait for a save under way)
    assert connector.saved == 0 and len(smtp.received) == 1 and sent_ids(dovecot) == []


async def test_a_server_refusing_the_copy_does_not_fail_the_reply(
    dovecot: DovecotPeer,
    smtp: SmtpPeer,
    make_connector: Callable[..., EmailConnector],
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with ImapStandIn() as server:  # knows neither LIST nor APPEND
        imap = {"host": "127.0.0.1", "port": server.port, "security": "none"}
        connector = make_connector(imap={**imap, "username": "help", "password": "x"})
        connector.save_tries = 1
        result = await connector.send(OutboundMessage(thread_id="bob@example.net", text="hi"))
        await connector.wait_for(lambda: connector.saved == 1)
    [received] = smtp.received
    assert received.message["Message-ID"] == result.message_id
    [error] = [r.getMessage() for r in caplog.records if "not be saved to" in r.getMessage()]
    assert result.message_id in error and "LIST" in error


@WITH_SENT
@pytest.mark.parametrize("after", [False, True], ids=["before-append", "after-append"])
async def test_a_reply_whose_copy_a_crash_cut_short_is_saved_once_at_the_next_start(
    dovecot: DovecotPeer,
    smtp: SmtpPeer,
    make_connector: Callable[..., EmailConnector],
    start: Callable[..., Any],
    after: bool,
) -> None:
    """The bridge dies between the SMTP send and the APPEND of its copy (or just after the
    APPEND, before it heard the answer): the next start saves the copy, and only if the folder
    does not hold it yet. The IMAP connection is cut where a killed bridge's would end."""
    imap = make_connector().config.imap.model_dump()
    imap["password"] = imap["password"].get_secret_value()
    async with ImapCutter(dovecot.port, "APPEND", after=after) as cutter:
        first = make_connector(imap=imap | {"port": cutter.port})
        result = await first.send(OutboundMessage(thread_id="bob@example.net", text="hi"))
        await first.wait_for(lambda: first.save_failures == 1)
        await first.close()  # what the crash ends: its wait to try again
        assert cutter.cut.is_set()
    assert sent_ids(dovecot) == ([(result.message_id, "S")] if after else [])
    running = await start()  # the restart, on the same store
    await running.connector.wait_for(lambda: running.connector.saved == 1, timeout=10)
    assert sent_ids(dovecot) == [(result.message_id, "S")]
    again = await start()  # and another: nothing left to save
    await again.status.wait_up()
    await again.stop()  # (waits for the saves it started)
    assert again.connector.saved == 0 and len(smtp.received) == 1


@pytest.mark.parametrize("dovecot", [{"unmarked": "Sent Items"}], indirect=True)
async def test_a_server_marking_no_folder_sent_has_replies_saved_to_the_one_named_so(
    dovecot: DovecotPeer,
    smtp: SmtpPeer,
    make_connector: Callable[..., EmailConnector],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A server without SPECIAL-USE marks, whose Sent folder a mail client made and named:
    `auto` finds it by its name, says so once, and `check` says where replies go."""
    caplog.set_level("INFO")
    connector = make_connector()
    assert 'replies saved to "Sent Items" (by its name' in await connector.check()
    first = await connector.send(OutboundMessage(thread_id="bob@example.net", text="hi"))
    second = await connector.send(OutboundMessage(thread_id="bob@example.net", text="again"))
    await connector.wait_for(lambda: connector.saved == 2)
    ids = sorted(mid for mid, _ in sent_ids(dovecot, "Sent Items"))
    assert ids == sorted([first.message_id, second.message_id])
    said = [r.getMessage() for r in caplog.records if "found by its name" in r.getMessage()]
    assert len(said) == 1 and '"Sent Items"' in said[0]


@pytest.mark.parametrize("when_asked", [True, False], ids=["return-option", "plain-list"])
async def test_the_sent_folder_is_found_where_the_server_lists_special_use_only_when_asked(
    smtp: SmtpPeer, make_connector: Callable[..., EmailConnector], when_asked: bool
) -> None:
    """RFC 6154 lets a server leave special-use attributes out of a plain LIST: they are asked
    for (`LIST "" "*" RETURN (SPECIAL-USE)`) from a server announcing SPECIAL-USE. The \\Sent
    mark wins over a folder merely named Sent."""
    folders = {"INBOX": "", "Sent": "", "Gesendet": "\\Sent"}
    async with ImapStandIn(folders=folders, special_use_when_asked=when_asked) as server:
        imap = {"host": "127.0.0.1", "port": server.port, "security": "none"}
        connector = make_connector(imap={**imap, "username": "help", "password": "x"})
        verdict = await connector.check()
    assert 'replies saved to "Gesendet" (marked \\Sent)' in verdict, verdict
    assert 'LIST "" "*" RETURN (SPECIAL-USE)' in server.commands


def refused_folder(make_connector: Callable[..., EmailConnector]) -> dict[str, Any]:
    """An `imap` section whose Sent folder Dovecot refuses to create or append to ("Invalid
    mailbox name: Begins with '~'")."""
    imap = make_connector().config.imap.model_dump() | {"sent_folder": "~Sent"}
    imap["password"] = imap["password"].get_secret_value()
    return imap


async def test_a_copy_the_sent_folder_keeps_refusing_is_given_up_after_bounded_tries(
    dovecot: DovecotPeer,
    smtp: SmtpPeer,
    make_connector: Callable[..., EmailConnector],
    start: Callable[..., Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Tried again with backoff, `save_tries` in all, then one error naming the folder and
    the failure; the next start (each reconnect does the same) does not try it again."""
    imap = refused_folder(make_connector)
    connector = make_connector(imap=imap)
    connector.save_tries, connector.save_retry_base = 3, 0.001
    result = await connector.send(OutboundMessage(thread_id="bob@example.net", text="hi"))
    await connector.wait_for(lambda: connector.saved == 1)
    said = [r for r in caplog.records if result.message_id in r.getMessage()]
    assert [r.levelname for r in said] == ["WARNING", "WARNING", "ERROR"]
    assert connector.save_failures == 3
    assert "try 1 of 3" in said[0].getMessage() and "try 2 of 3" in said[1].getMessage()
    given_up = said[-1].getMessage()
    assert "'~Sent'" in given_up and "after 3 tries" in given_up and "given up" in given_up
    assert "Invalid mailbox name" in given_up  # Dovecot's own words
    again = await start(imap=imap)  # the next start on the same store: nothing left to save
    await again.status.wait_up()
    await again.stop()
    assert again.connector.saved == 0 and again.connector.save_failures == 0
    assert len(smtp.received) == 1


async def test_the_tries_to_save_a_copy_are_counted_across_restarts(
    dovecot: DovecotPeer,
    smtp: SmtpPeer,
    make_connector: Callable[..., EmailConnector],
    start: Callable[..., Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A stop while a save waits to be tried again ends the wait at once; the next start
    tries it, and counts the tries before: a bridge restarted again and again still gives up."""
    imap = refused_folder(make_connector)
    first = make_connector(imap=imap)
    first.save_tries, first.save_retry_base = 2, 3600.0  # waits an hour after the first try
    result = await first.send(OutboundMessage(thread_id="bob@example.net", text="hi"))
    await first.wait_for(lambda: first.save_failures == 1)
    await asyncio.wait_for(first.close(), 5)  # (not the hour)
    assert first.saved == 1
    again = await start(imap=imap, wait=False)
    again.connector.save_tries = 2
    await again.connector.wait_for(lambda: again.connector.saved == 1)
    assert again.connector.save_failures == 1
    [error] = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert result.message_id in error and "after 2 tries" in error
