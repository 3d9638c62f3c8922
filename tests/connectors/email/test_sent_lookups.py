"""The Sent folder looked for mail a person wrote from the mailbox (`written`), as an attacker
would use it: anyone can send mail answering ids the bridge does not know, and write what they
like in References. Dovecot behind a recorder of the connections and commands the bridge makes;
crafted mail through aiosmtpd."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import aiosmtplib
import pytest

from tests.connectors.email.conftest import SMTP_USERS, connection, mail
from tests.connectors.email.test_thread_membership import ROOT, reply, written_in_a_mail_client
from tests.peers.email import DovecotPeer, ImapCutter, ImapRecorder, SmtpPeer

DESK = "<desk-1@example.com>"
BY_ID = "HEADER Message-ID"


async def recorded(
    dovecot: DovecotPeer, smtp: SmtpPeer, start: Callable[..., Any], recorder: ImapRecorder
) -> Any:
    """A connector reaching Dovecot through `recorder`, with Ada's thread (ROOT) read."""
    running = await start(imap={**connection(dovecot, smtp)["imap"], "port": recorder.port})
    dovecot.deliver("help", mail(body="first", message_id=ROOT))
    await running.inbox.wait_count(1)
    return running


async def the_desk_writes(dovecot: DovecotPeer, smtp: SmtpPeer) -> None:
    """A person answers Ada from a mail client, Cc'ing Carol: `DESK`, in Sent."""
    await written_in_a_mail_client(
        dovecot,
        smtp,
        reply(
            ROOT,
            sender="Help Desk <help@example.com>",
            to="ada@example.org",
            Cc="carol@example.org",
            message_id=DESK,
        ),
    )


@pytest.mark.parametrize("dovecot", [{"sent": "Sent"}], indirect=True)
async def test_a_flood_of_mail_answering_unknown_ids_costs_no_login_per_mail(
    dovecot: DovecotPeer, smtp: SmtpPeer, start: Callable[..., Any]
) -> None:
    """Each mail answering unknown ids used to cost an IMAP login: a flood of them could use up
    the server's connections of the user. Now one session does all lookups, and still finds
    what a person wrote from the mailbox after it was opened."""
    async with ImapRecorder(dovecot.port) as recorder:
        running = await recorded(dovecot, smtp, start, recorder)
        for i in range(12):
            refs = " ".join(f"<r{i}.{n}@attacker.test>" for n in range(4))
            sender = f"s{i}@example.org"
            dovecot.deliver("help", mail(sender=sender, body=f"flood {i}", References=refs))
        await running.inbox.wait_count(13)
        await the_desk_writes(dovecot, smtp)  # (straight to Dovecot: not recorded)
        dovecot.deliver("help", mail(sender="carol@example.org", body="to all", In_Reply_To=DESK))
        await running.inbox.wait_count(14)
    threads = {m.text: m.thread_id for m in running.inbox.messages}
    assert threads["to all"] == ROOT
    assert len({threads[f"flood {i}"] for i in range(12)}) == 12
    assert recorder.connections == 2  # the bridge's own, and its lookups'
    searches = recorder.searches(BY_ID)
    assert len(searches) == 12 * 3 + 1 and all(verdict == "OK" for _, verdict in searches)


@pytest.mark.parametrize("dovecot", [{"sent": "Sent"}], indirect=True)
async def test_lookups_are_capped_per_sender_and_an_id_not_found_is_not_looked_for_again(
    dovecot: DovecotPeer, smtp: SmtpPeer, start: Callable[..., Any]
) -> None:
    """One sender's mail answering unknown ids is looked up `PER_SENDER` times in a window;
    an id found missing is not searched again; another sender is still looked up for."""
    async with ImapRecorder(dovecot.port) as recorder:
        running = await recorded(dovecot, smtp, start, recorder)
        for i in range(8):
            dovecot.deliver(
                "help", mail(sender="eve@example.org", body=f"eve {i}", In_Reply_To=f"<e{i}@x>")
            )
        for i in range(3):
            dovecot.deliver(
                "help", mail(sender=f"b{i}@example.org", body=f"same {i}", In_Reply_To="<s@x>")
            )
        await running.inbox.wait_count(12)
        await the_desk_writes(dovecot, smtp)
        dovecot.deliver("help", mail(sender="carol@example.org", body="to all", In_Reply_To=DESK))
        await running.inbox.wait_count(13)
    searched = [command for command, _ in recorder.searches(BY_ID)]
    assert searched == [
        *(f'UID SEARCH HEADER Message-ID "<e{i}@x>"' for i in range(5)),
        'UID SEARCH HEADER Message-ID "<s@x>"',
        f'UID SEARCH HEADER Message-ID "{DESK}"',
    ]
    threads = {m.text: m.thread_id for m in running.inbox.messages}
    assert threads["to all"] == ROOT  # Eve's flood did not cost Carol her lookup
    assert threads["eve 7"] == "<e7@x>"  # not looked for: threaded as before, not lost


@pytest.mark.parametrize("dovecot", [{"sent": "Sent"}], indirect=True)
async def test_crafted_references_are_searched_quoted_or_not_at_all(
    dovecot: DovecotPeer, smtp: SmtpPeer, start: Callable[..., Any]
) -> None:
    """Thousands of ids, ids with quotes and backslashes, a NUL, 8-bit letters, a folded id,
    an id too long for a command: each searched for as the text it is (quoted), or not at all,
    and none makes the server refuse a command (which made the lookup give up, and Carol's
    reply to the desk's mail start a thread of its own)."""
    async with ImapRecorder(dovecot.port) as recorder:
        running = await recorded(dovecot, smtp, start, recorder)
        await the_desk_writes(dovecot, smtp)
        junk = "\r\n ".join(f"<j{n}@attacker.test>" for n in range(5000))
        crafted = [
            '<q"uote@x>',
            "<back\\slash@x>",
            '<e"ALL"@x>',
            "<" + "l" * 300 + "@x>",
            "<n\x00ul@x>",
            "<ünï@x>",
        ]
        raw = (
            "From: carol@example.org\r\nTo: help@example.com\r\nSubject: Re: Printer\r\n"
            "Message-ID: <carol-1@example.org>\r\n"
            f"References: {junk}\r\n {' '.join(crafted)}\r\n"
            f"In-Reply-To: {DESK}\r\n\r\nto all\r\n"
        ).encode()
        await aiosmtplib.send(
            raw,
            sender="carol@example.org",
            recipients=["help@example.com"],
            hostname="127.0.0.1",
            port=smtp.port,
            username="other",
            password=SMTP_USERS["other"],
            use_tls=False,
            start_tls=False,
        )
        await running.inbox.wait_count(2)
    carol = running.inbox.messages[-1].thread_id
    assert carol == ROOT
    assert recorder.searches(BY_ID) == [
        (f'UID SEARCH HEADER Message-ID "{DESK}"', "OK"),
        ('UID SEARCH HEADER Message-ID "<e\\"ALL\\"@x>"', "OK"),
        ('UID SEARCH HEADER Message-ID "<back\\\\slash@x>"', "OK"),
    ]


@pytest.mark.parametrize("dovecot", [{"sent": "Sent"}], indirect=True)
async def test_a_failed_lookup_leaves_the_mail_threaded_as_before_and_pauses_lookups(
    dovecot: DovecotPeer, smtp: SmtpPeer, start: Callable[..., Any], caplog: Any
) -> None:
    """The lookup session cut off at its search: the mail starts a thread of its own (said in
    the log), and the mail after it is not made to wait on the server again at once."""
    async with (
        ImapCutter(dovecot.port, "HEADER") as cutter,
        ImapRecorder(cutter.port) as recorder,
    ):
        running = await recorded(dovecot, smtp, start, recorder)
        await the_desk_writes(dovecot, smtp)
        dovecot.deliver("help", mail(sender="carol@example.org", body="one", In_Reply_To=DESK))
        dovecot.deliver("help", mail(sender="dave@example.org", body="two", In_Reply_To="<u@x>"))
        await running.inbox.wait_count(3)
    assert cutter.cut.is_set()
    threads = {m.text: m.thread_id for m in running.inbox.messages}
    assert threads["one"] == DESK and threads["two"] == "<u@x>"
    assert recorder.connections == 2  # no lookup session opened again for the second mail
    said = [r.getMessage() for r in caplog.records if "could not look for" in r.getMessage()]
    assert len(said) == 1 and "no lookups for 60s" in said[0]
