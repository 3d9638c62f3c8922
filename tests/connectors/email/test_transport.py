"""The email transport against real Dovecot (IMAP) and aiosmtpd (SMTP) on 127.0.0.1."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from email.message import EmailMessage
from typing import Any

import pytest

from talkbridge.connectors.email.transport import EmailConnector
from talkbridge.errors import NotFoundError, PermanentError, TransientError, UnauthorizedError
from talkbridge.message import OutboundMessage
from tests.connectors.email.conftest import Inbox, mail
from tests.peers.email import DovecotPeer, ImapStandIn, SmtpPeer


async def test_a_delivered_mail_arrives_and_is_marked_seen_only_after_delivery(
    dovecot: DovecotPeer, start: Callable[..., Any]
) -> None:
    gate = asyncio.Event()
    seen_during_delivery: list[list[str]] = []

    entered = asyncio.Event()

    async def slow(message: Any) -> None:
        seen_during_delivery.append(dovecot.flags("help"))
        entered.set()
        await gate.wait()

    inbox = Inbox()
    running = await start(inbox=inbox)
    running.connector.subscribe(slow)
    dovecot.deliver("help", mail(body="first", message_id="<m1@example.org>"))
    [msg] = await inbox.wait_count(1)
    assert msg.id == "<m1@example.org>" and msg.thread_id == "<m1@example.org>"
    assert msg.text == "first" and msg.channel_user_id == "ada@example.org"
    await asyncio.wait_for(entered.wait(), 15)
    assert seen_during_delivery == [[""]]  # not \Seen while the subscriber works
    gate.set()
    await running.connector.wait_for(lambda: running.connector.handled == 1)
    assert dovecot.flags("help") == ["S"]


async def test_a_refused_delivery_is_retried_after_reconnect_not_lost(
    dovecot: DovecotPeer, start: Callable[..., Any]
) -> None:
    inbox = Inbox(fail_on={"fragile"})
    running = await start(inbox=inbox)
    dovecot.deliver("help", mail(body="fragile"))
    with pytest.raises(TransientError, match="not accepted"):  # the registry reconnects
        await asyncio.wait_for(running.task, 15)
    assert dovecot.flags("help") == [""]  # neither \Seen nor past the cursor
    again = await start(inbox=inbox)
    [msg] = await again.inbox.wait_count(1)
    assert msg.text == "fragile"
    await again.connector.wait_for(lambda: again.connector.handled == 1)
    assert dovecot.flags("help") == ["S"]


async def test_restart_catches_up_on_mail_that_arrived_while_down_without_replays(
    dovecot: DovecotPeer, start: Callable[..., Any]
) -> None:
    first = await start()
    dovecot.deliver("help", mail(body="before"))
    await first.inbox.wait_count(1)
    await first.stop()
    for n in range(3):
        dovecot.deliver("help", mail(body=f"while down {n}"))
    second = await start()
    messages = await second.inbox.wait_count(3)
    assert [m.text for m in messages] == ["while down 0", "while down 1", "while down 2"]
    dovecot.deliver("help", mail(body="after"))
    messages = await second.inbox.wait_count(4)
    assert [m.text for m in messages][3:] == ["after"]  # "before" was never replayed


class LandsMailOnReceipt(Inbox):
    """Has `land` called the moment a mail with text `trigger` is handed over."""

    def __init__(self, trigger: str, land: Callable[[], object]) -> None:
        super().__init__()
        self.trigger, self.land = trigger, land

    async def __call__(self, message: Any) -> None:
        await super().__call__(message)
        if message.text == self.trigger:
            self.land()


async def test_mail_landing_during_a_catch_up_is_handled_without_waiting_for_idle(
    dovecot: DovecotPeer, start: Callable[..., Any]
) -> None:
    """The server announces such a mail (EXISTS) in the answer to a command of the catch-up,
    which aioimaplib drops, and never again in IDLE: it waited for the next IDLE renewal (25
    minutes by default)."""
    for n in range(2):
        dovecot.deliver("help", mail(body=f"queued {n}"))
    inbox = LandsMailOnReceipt("queued 1", lambda: dovecot.deliver("help", mail(body="landed")))
    await start(inbox=inbox)
    await inbox.wait_count(3)
    assert inbox.texts == ["queued 0", "queued 1", "landed"]


async def test_a_server_without_idle_is_polled(
    smtp: SmtpPeer, make_connector: Callable[..., EmailConnector]
) -> None:
    async with DovecotPeer({"help": "imap-pw-help"}, no_idle=True) as plain:
        from talkbridge.connectors.email.config import EmailConfig
        from talkbridge.connectors.email.transport import create
        from tests.connectors.email.conftest import connection
        from tests.support.running import Status

        base = make_connector()
        config = EmailConfig.model_validate(connection(plain, smtp, poll_interval=0.1))
        connector = create(config, base.context)
        inbox = Inbox()
        connector.subscribe(inbox)
        task = asyncio.create_task(connector.run(Status()))
        try:
            plain.deliver("help", mail(body="polled"))
            [msg] = await inbox.wait_count(1)
            assert msg.text == "polled"
            assert connector.idle_renewals == 0
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def test_idle_is_reissued_before_the_server_timeout(
    dovecot: DovecotPeer, start: Callable[..., Any]
) -> None:
    running = await start(idle_renew=0.2)
    await running.connector.wait_for(lambda: running.connector.idle_renewals >= 2)
    dovecot.deliver("help", mail(body="after renewals"))
    [msg] = await running.inbox.wait_count(1)
    assert msg.text == "after renewals"


async def test_the_server_dropping_idle_ends_run_with_a_transient_error(
    dovecot: DovecotPeer, start: Callable[..., Any]
) -> None:
    running = await start(idle_renew=0.2)
    await running.connector.wait_for(lambda: running.connector.idle_renewals >= 1)
    dovecot.kick("help")
    with pytest.raises(TransientError, match="closed the connection"):
        await asyncio.wait_for(running.task, 15)


async def test_a_wrong_imap_password_is_unauthorized_and_names_no_secret(
    dovecot: DovecotPeer, start: Callable[..., Any]
) -> None:
    dovecot.set_password("help", "changed-by-admin")
    running = await start()
    with pytest.raises(UnauthorizedError) as caught:
        await asyncio.wait_for(running.task, 15)
    assert "refused the login for 'help'" in str(caught.value)
    assert "imap-pw-help" not in str(caught.value)


async def test_send_translates_smtp_failures(
    dovecot: DovecotPeer, smtp: SmtpPeer, make_connector: Callable[..., EmailConnector]
) -> None:
    connector = make_connector()
    out = OutboundMessage(thread_id="bob@example.net", text="hi", meta={"subject": "Hello"})
    smtp.fail_next("451 4.7.1 slow down")
    with pytest.raises(TransientError, match="451"):
        await connector.send(out)
    smtp.fail_next("554 5.7.1 rejected")
    with pytest.raises(PermanentError, match="554"):
        await connector.send(out)
    smtp.refuse_next_recipient("450 4.2.1 mailbox busy, try later")  # retried, like a 451
    with pytest.raises(TransientError, match=r"deferred the recipients: bob@example\.net \(450\)"):
        await connector.send(out)
    smtp.refuse_next_recipient("550 5.1.1 no such user")
    with pytest.raises(NotFoundError, match="refused the recipients"):
        await connector.send(out)
    result = await connector.send(out)
    [received] = smtp.received
    assert received.rcpt_tos == ["bob@example.net"] and received.login == "help"
    assert received.message["Message-ID"] == result.message_id
    assert received.message["Subject"] == "Hello"
    smtp.users["help"] = "rotated"
    with pytest.raises(UnauthorizedError, match="refused the login") as caught:
        await connector.send(out)
    assert "smtp-pw-help" not in str(caught.value)
    # No connection is left open by any of those, the refused login's included.
    await smtp.wait_for(lambda: smtp.open_connections == 0)


async def test_a_mail_to_an_address_beyond_ascii_goes_with_smtputf8_or_fails_for_good(
    dovecot: DovecotPeer, smtp: SmtpPeer, make_connector: Callable[..., EmailConnector]
) -> None:
    connector = make_connector()
    out = OutboundMessage(thread_id="jürgen@example.org", text="hi", meta={"subject": "Hallo"})
    with pytest.raises(PermanentError, match="does not offer SMTPUTF8") as caught:
        await connector.send(out)  # never retried: the server lacks it on every try
    assert "127.0.0.1" in str(caught.value)
    smtp.smtputf8 = True
    await connector.send(out)
    [received] = smtp.received
    assert received.rcpt_tos == ["jürgen@example.org"]
    assert received.message["To"] == "jürgen@example.org"


async def test_a_reply_sent_again_after_a_lost_answer_keeps_its_message_id(
    dovecot: DovecotPeer, smtp: SmtpPeer, make_connector: Callable[..., EmailConnector]
) -> None:
    # The server took the mail, then the link went: the retry is the same mail, so the
    # recipient's server or client can tell the copy (a new Message-ID made it a new mail).
    connector = make_connector()
    out = OutboundMessage(thread_id="bob@example.net", text="hi", idempotency_key="reply:1")
    smtp.hang_up_after_data = 1
    with pytest.raises(TransientError):
        await connector.send(out)
    result = await connector.send(out)
    first, again = (m.message for m in smtp.received)
    assert first["Message-ID"] == again["Message-ID"] == result.message_id
    other = await connector.send(out.model_copy(update={"idempotency_key": "reply:2"}))
    assert other.message_id != result.message_id


async def test_a_reply_deferred_for_one_recipient_goes_to_them_alone_after_a_restart(
    dovecot: DovecotPeer,
    smtp: SmtpPeer,
    start: Callable[..., Any],
    make_connector: Callable[..., EmailConnector],
) -> None:
    """The bridge died while it waited to send the reply again to the recipient whose server
    deferred it; at its next start the message is answered again, with the same key."""
    inbox = Inbox()
    running = await start(inbox=inbox)
    dovecot.deliver("help", mail(body="for both", Cc="Bob <bob@example.org>"))
    [asked] = await inbox.wait_count(1)
    reply = OutboundMessage(
        thread_id=asked.thread_id, text="answered", reply_to=asked.id, idempotency_key="reply:1"
    )
    smtp.refuse_next_recipient("450 4.2.0 mailbox busy, try later", "bob@example.org")
    with pytest.raises(TransientError, match=r"deferred the reply for bob@example\.org"):
        await running.connector.send(reply)
    await running.stop()
    again = make_connector()  # a new process: the same store, nothing in memory
    result = await again.send(reply)
    assert [m.rcpt_tos for m in smtp.received] == [["ada@example.org"], ["bob@example.org"]]
    first, second = (m.message for m in smtp.received)
    assert first["Message-ID"] == second["Message-ID"] == result.message_id
    await again.send(reply.model_copy(update={"idempotency_key": "reply:2"}))
    assert smtp.received[-1].rcpt_tos == ["ada@example.org", "bob@example.org"]


async def test_the_reply_limit_stops_a_thread_after_n_replies(
    dovecot: DovecotPeer, smtp: SmtpPeer, make_connector: Callable[..., EmailConnector]
) -> None:
    connector = make_connector(max_replies_per_thread=2)
    out = OutboundMessage(thread_id="bob@example.net", text="hi", markup="plain")
    await connector.send(out)
    await connector.send(out)
    with pytest.raises(PermanentError, match="reply limit"):
        await connector.send(out)
    assert len(smtp.received) == 2
    other = OutboundMessage(thread_id="carol@example.net", text="hi", markup="plain")
    await connector.send(other)  # other threads are not affected


def mail_with_file(sender: str, message_id: str, data: bytes) -> bytes:
    msg = EmailMessage()
    msg["From"] = sender
    msg["To"] = "help@example.com"
    msg["Subject"] = "log"
    msg["Message-ID"] = message_id
    msg.set_content("see attached")
    msg.add_attachment(data, maintype="application", subtype="octet-stream", filename="log.bin")
    return msg.as_bytes()


async def test_inbound_media_downloads_an_attachment_over_imap(
    dovecot: DovecotPeer, start: Callable[..., Any]
) -> None:
    running = await start()
    dovecot.deliver(
        "help", mail_with_file("ada@example.org", "<att@example.org>", b"\x00\x01binary")
    )
    [received] = await running.inbox.wait_count(1)
    [attachment] = received.attachments
    media = running.connector.feature("inbound_media")
    assert await media.download(attachment) == b"\x00\x01binary"
    with pytest.raises(PermanentError, match="limit"):
        await media.download(attachment, max_bytes=3)


async def test_a_later_mail_reusing_a_message_id_does_not_stand_in_for_its_attachments(
    dovecot: DovecotPeer, start: Callable[..., Any]
) -> None:
    """Anyone who saw a mail's Message-ID (on its Cc, say) can send one with the same id: the
    attachment of the mail that was read is what a download returns, not the stranger's."""
    running = await start()
    dovecot.deliver("help", mail_with_file("boss@example.org", "<att@example.org>", b"real"))
    [received] = await running.inbox.wait_count(1)
    dovecot.deliver("help", mail_with_file("eve@example.net", "<att@example.org>", b"evil"))
    connector: EmailConnector = running.connector
    await connector.wait_for(lambda: connector.handled + len(connector.skipped) == 2)
    [attachment] = received.attachments
    assert await connector.feature("inbound_media").download(attachment) == b"real"


async def test_an_imap_login_refused_for_now_is_retried_not_a_wrong_password(
    dovecot: DovecotPeer, smtp: SmtpPeer, make_connector: Callable[..., EmailConnector]
) -> None:
    # What Dovecot answers while its password database is unreachable (RFC 5530).
    async def server(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"* OK [CAPABILITY IMAP4rev1] ready\r\n")
        while line := await reader.readline():
            tag, _, command = line.decode().partition(" ")
            if command.upper().startswith("CAPABILITY"):
                writer.write(f"* CAPABILITY IMAP4rev1\r\n{tag} OK done\r\n".encode())
            elif command.upper().startswith("LOGOUT"):
                writer.write(f"* BYE\r\n{tag} OK bye\r\n".encode())
            else:
                writer.write(
                    f"{tag} NO [UNAVAILABLE] Temporary authentication failure.\r\n".encode()
                )
            await writer.drain()
        writer.close()

    listener = await asyncio.start_server(server, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    imap = {"host": "127.0.0.1", "port": port, "security": "none", "username": "help"}
    connector = make_connector(imap={**imap, "password": "x"})
    async with listener:
        with pytest.raises(TransientError, match=r"cannot log in for now: \[UNAVAILABLE\]"):
            await connector.check()
    await connector.close()


async def test_an_smtp_login_refused_for_now_is_retried_not_a_wrong_password(
    dovecot: DovecotPeer, smtp: SmtpPeer, make_connector: Callable[..., EmailConnector]
) -> None:
    # RFC 4954: 454 is the server's authentication backend being down, not a wrong password.
    smtp.auth_answer = "454 4.7.0 Temporary authentication failure"
    connector = make_connector()
    out = OutboundMessage(thread_id="bob@example.net", text="hi", meta={"subject": "Hello"})
    with pytest.raises(TransientError, match=r"cannot log in for now \(454 4\.7\.0"):
        await connector.send(out)
    with pytest.raises(TransientError, match=r"SMTP failed: .*cannot log in for now"):
        await connector.check()
    smtp.auth_answer = None
    await connector.send(out)  # the retry goes through once the server can log in again
    assert [m.rcpt_tos for m in smtp.received] == [["bob@example.net"]]


async def test_a_login_set_for_a_server_that_offers_none_is_a_clear_permanent_error(
    dovecot: DovecotPeer, smtp: SmtpPeer, make_connector: Callable[..., EmailConnector]
) -> None:
    # No AUTH in the EHLO answer: no retry will change that. The client's own error was taken
    # for a passing failure, and each send retried for minutes before giving up.
    smtp.offers_auth = False
    connector = make_connector()
    out = OutboundMessage(thread_id="bob@example.net", text="hi", meta={"subject": "Hello"})
    said = r"offers no login \(no AUTH in its EHLO answer\), but smtp.username is set"
    with pytest.raises(PermanentError, match=said):
        await connector.send(out)
    with pytest.raises(PermanentError, match=said):
        await connector.check()
    assert smtp.received == []


@pytest.mark.parametrize(
    ("greeting", "error", "says"),
    [
        # A server at its connection limit says BYE and hangs up: try again later.
        (b"* BYE Too many connections\r\n", TransientError, "turned the connection away: \\* BYE"),
        # The SMTP port by mistake: a banner that stays open. Said at once, not after a timeout.
        (b"220 mail.example.org ESMTP\r\n", PermanentError, "not an IMAP server: it greeted"),
    ],
)
async def test_a_greeting_that_is_not_imaps_ok_fails_at_once_naming_it(
    dovecot: DovecotPeer,
    smtp: SmtpPeer,
    make_connector: Callable[..., EmailConnector],
    greeting: bytes,
    error: type[Exception],
    says: str,
) -> None:
    async def server(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(greeting)
        await writer.drain()
        if not greeting.startswith(b"* BYE"):
            await reader.read()  # open until the client gives up
        writer.close()

    listener = await asyncio.start_server(server, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    imap = {"host": "127.0.0.1", "port": port, "security": "none", "username": "help"}
    connector = make_connector(imap={**imap, "password": "x"}, timeout=60)
    async with listener:
        with pytest.raises(error, match=says):
            await asyncio.wait_for(connector.check(), 30)  # well inside the 60 s timeout
    await connector.close()


# ---- the first start: which unread mail it answers ------------------------------------------

MONTH_AGO = timedelta(days=30)


def left_alone(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "left" in r.getMessage()]


async def test_a_first_start_answers_recent_unread_mail_only_and_never_the_old_later(
    dovecot: DovecotPeer, start: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    dovecot.deliver("help", mail(body="old"), received=datetime.now(UTC) - MONTH_AGO)
    dovecot.deliver("help", mail(body="fresh"))
    first = await start(wait=True)  # up: the first catch-up is through
    assert first.inbox.texts == ["fresh"]
    assert first.connector.handled == 1
    [line] = left_alone(caplog)
    assert "left 1 unread mail(s)" in line and "backlog_days (now 1)" in line
    await first.stop()
    second = await start(wait=True)
    dovecot.deliver("help", mail(body="after"))
    await second.connector.wait_for(lambda: second.connector.handled == 1)
    assert second.inbox.texts == ["after"]  # the restart did not answer the old mail either
    assert sorted(dovecot.flags("help")) == ["", "S", "S"]  # the old mail is still unread


async def test_backlog_days_all_answers_every_unread_mail_however_old(
    dovecot: DovecotPeer, start: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    dovecot.deliver("help", mail(body="old"), received=datetime.now(UTC) - MONTH_AGO)
    dovecot.deliver("help", mail(body="fresh"))
    running = await start(wait=True, backlog_days="all")
    assert running.inbox.texts == ["old", "fresh"]
    assert dovecot.flags("help") == ["S", "S"]
    assert left_alone(caplog) == []


async def test_backlog_days_0_answers_only_mail_arriving_after_the_start(
    dovecot: DovecotPeer, start: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    dovecot.deliver(
        "help", mail(body="an hour ago"), received=datetime.now(UTC) - timedelta(hours=1)
    )
    dovecot.deliver("help", mail(body="just before"))
    running = await start(wait=True, backlog_days=0)
    assert running.inbox.texts == []
    dovecot.deliver("help", mail(body="after"))
    await running.connector.wait_for(lambda: running.connector.handled == 1)
    assert running.inbox.texts == ["after"]
    assert "left 2 unread mail(s)" in left_alone(caplog)[0]
    assert sorted(dovecot.flags("help")) == ["", "", "S"]


async def test_a_delivery_failing_mid_first_start_does_not_open_old_mail_to_the_restart(
    dovecot: DovecotPeer, start: Callable[..., Any]
) -> None:
    """A cursor stored at the first mail handled made the restart answer every mail above it,
    the old unread one (and any read one) among them."""
    dovecot.deliver("help", mail(body="fresh 0"))
    dovecot.deliver("help", mail(body="old"), received=datetime.now(UTC) - MONTH_AGO)
    dovecot.deliver("help", mail(body="fresh 1"))
    inbox = Inbox(fail_on={"fresh 1"})
    first = await start(inbox=inbox)
    with pytest.raises(TransientError, match="not accepted"):  # the registry reconnects
        await asyncio.wait_for(first.task, 15)
    assert inbox.texts == ["fresh 0"]
    second = await start(inbox=inbox, wait=True)
    assert inbox.texts == ["fresh 0", "fresh 1"]
    dovecot.deliver("help", mail(body="after"))
    await second.connector.wait_for(lambda: second.connector.handled == 2)
    assert inbox.texts == ["fresh 0", "fresh 1", "after"]


def stand_in_imap(server: ImapStandIn, **overrides: Any) -> dict[str, Any]:
    imap = {"host": "127.0.0.1", "port": server.port, "security": "none", "username": "help"}
    return {"imap": {**imap, "password": "x"}, "poll_interval": 60, **overrides}


@pytest.mark.parametrize("refusal", ["BAD", "NO"])
async def test_a_server_refusing_search_since_falls_back_to_the_date_of_each_unread_mail(
    dovecot: DovecotPeer,
    start: Callable[..., Any],
    caplog: pytest.LogCaptureFixture,
    refusal: str,
) -> None:
    now = datetime.now(UTC)
    async with ImapStandIn(refuse_since=refusal) as server:
        old = server.add(mail(body="old"), received=now - MONTH_AGO)
        fresh = server.add(mail(body="fresh"), received=now - timedelta(minutes=5))
        running = await start(wait=True, **stand_in_imap(server))
        assert running.inbox.texts == ["fresh"]
        assert (old.seen, fresh.seen) == (False, True)
        assert any(c.startswith("UID SEARCH UNSEEN SINCE") for c in server.commands)
        assert any("refused UID SEARCH UNSEEN SINCE" in r.getMessage() for r in caplog.records)
        assert "left 1 unread mail(s)" in left_alone(caplog)[0]
        assert not running.task.done()  # the connection stays up, polling
        await running.stop()


@pytest.mark.parametrize("refuse_since", [None, "BAD"])
async def test_a_server_without_internaldate_still_has_its_recent_unread_mail_answered(
    dovecot: DovecotPeer,
    start: Callable[..., Any],
    caplog: pytest.LogCaptureFixture,
    refuse_since: str | None,
) -> None:
    """A stand-in that knows neither FETCH INTERNALDATE nor, at worst, SEARCH SINCE: the
    connection must not fail over it; its SINCE search is trusted to the day, and with no
    way to tell old from new, the unread mail is answered as it was before `backlog_days`."""
    now = datetime.now(UTC)
    async with ImapStandIn(refuse_internaldate=True, refuse_since=refuse_since) as server:
        old = server.add(mail(body="old"), received=now - MONTH_AGO)
        fresh = server.add(mail(body="fresh"), received=now - timedelta(minutes=5))
        running = await start(wait=True, **stand_in_imap(server))
        expected = ["fresh"] if refuse_since is None else ["old", "fresh"]
        assert running.inbox.texts == expected
        assert (old.seen, fresh.seen) == (refuse_since is not None, True)
        assert any("refused UID FETCH (INTERNALDATE)" in r.getMessage() for r in caplog.records)
        assert not running.task.done()
        await running.stop()


async def test_after_a_uidvalidity_change_old_unread_mail_is_left_alone_too(
    dovecot: DovecotPeer, start: Callable[..., Any]
) -> None:
    now = datetime.now(UTC)
    async with ImapStandIn() as server:
        server.add(mail(body="first"), received=now - timedelta(minutes=5))
        running = await start(wait=True, **stand_in_imap(server))
        assert running.inbox.texts == ["first"]
        await running.stop()
        # The folder was rebuilt (a migration): new UIDs, and an old unread mail among them.
        server.uidvalidity += 1
        old = server.add(mail(body="old"), received=now - MONTH_AGO)
        fresh = server.add(mail(body="fresh"), received=now - timedelta(minutes=1))
        again = await start(wait=True, **stand_in_imap(server))
        assert again.inbox.texts == ["fresh"]
        assert (old.seen, fresh.seen) == (False, True)
        await again.stop()


async def test_a_server_without_uidnext_does_not_have_old_mail_answered_after_a_restart(
    dovecot: DovecotPeer, start: Callable[..., Any]
) -> None:
    """RFC 3501 requires UIDNEXT in SELECT's answer; without it the cursor stayed at 0, and the
    restart answered every mail in the folder, old unread and read alike."""
    now = datetime.now(UTC)
    async with ImapStandIn(uidnext=False) as server:
        server.add(mail(body="old"), received=now - MONTH_AGO)
        server.add(mail(body="read"), received=now - timedelta(minutes=5), seen=True)
        first = await start(wait=True, **stand_in_imap(server))
        assert first.inbox.texts == []
        await first.stop()
        second = await start(wait=True, **stand_in_imap(server, poll_interval=0.05))
        server.add(mail(body="new"), received=now)
        await second.inbox.wait_count(1)
        assert second.inbox.texts == ["new"]
        await second.stop()
