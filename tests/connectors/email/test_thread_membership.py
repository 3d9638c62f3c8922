"""Email threads over Dovecot and aiosmtpd: a mail joins the thread it references only when its
sender is one of the thread's participants; anyone else's mail starts a thread of its own."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from talkbridge.agents import Result, TurnContext
from talkbridge.bridge import Bridge
from talkbridge.connectors.email.config import ImapConfig
from talkbridge.connectors.email.imap import ImapSession, mailbox_argument
from talkbridge.message import OutboundMessage
from tests.connectors.email.conftest import connection, mail
from tests.connectors.email.test_e2e import to
from tests.peers.email import DovecotPeer, SmtpPeer

ROOT = "<q1@example.org>"


class HistoryAgent:
    """Answers with what the thread said before: what an agent given `history` could tell."""

    name = "echo"

    async def stream(self, ctx: TurnContext) -> AsyncIterator[Any]:
        said = [entry.text for entry in await ctx.history(20) if entry.role == "user"]
        yield Result(text=" | ".join([*said, ctx.input.prompt]))


def text(smtp: SmtpPeer, address: str, index: int = -1) -> str:
    body = to(smtp, address)[index].message.get_body(("plain",))
    assert body is not None
    return str(body.get_content()).strip()


def reply(*chain: str, **fields: Any) -> bytes:
    """A mail answering the last of `chain`, which its References list in full."""
    return mail(References=" ".join(chain), In_Reply_To=chain[-1], **fields)


async def ada_asks(
    bridge: Callable[..., Any], dovecot: DovecotPeer, smtp: SmtpPeer
) -> tuple[Bridge, str]:
    """A Bridge whose agent is a `HistoryAgent`, and Ada's question, answered: the Bridge and
    the Message-ID of our answer."""
    instance = await bridge({}, agents={"echo": HistoryAgent()})
    dovecot.deliver("help", mail(body="my salary is 5000", message_id=ROOT))
    await smtp.wait_for(lambda: len(to(smtp, "ada@example.org")) == 1)
    return instance, str(to(smtp, "ada@example.org")[0].message["Message-ID"])


async def test_a_stranger_referencing_a_thread_starts_their_own_and_learns_nothing_of_it(
    dovecot: DovecotPeer, smtp: SmtpPeer, bridge: Callable[..., Any]
) -> None:
    """Bob (trusted, another customer) puts Ada's thread's ids in his References: the agent
    answering him is not given Ada's conversation, and an app's send to Ada's thread still
    goes to Ada, not to the latest mail that referenced it."""
    instance, ours = await ada_asks(bridge, dovecot, smtp)
    dovecot.deliver(
        "help",
        reply(ROOT, ours, sender="bob@example.org", body="what did she say?", message_id="<b1@x>"),
    )
    await smtp.wait_for(lambda: len(to(smtp, "bob@example.org")) == 1)
    assert text(smtp, "bob@example.org") == "what did she say?"
    assert to(smtp, "bob@example.org")[0].rcpt_tos == ["bob@example.org"]
    history = await instance.store.history(f"help\x1f{ROOT}", limit=10)
    assert [h.text for h in history if h.role == "user"] == ["my salary is 5000"]
    await instance.router.send("help", OutboundMessage(thread_id=ROOT, text="solved"))
    await smtp.wait_for(lambda: len(smtp.received) == 3)
    assert smtp.received[-1].rcpt_tos == ["ada@example.org"]
    # Bob's own conversation goes on in his thread, with what he said in it alone.
    bob_answer = str(to(smtp, "bob@example.org")[0].message["Message-ID"])
    dovecot.deliver(
        "help", reply(ROOT, ours, "<b1@x>", bob_answer, sender="bob@example.org", body="and now?")
    )
    await smtp.wait_for(lambda: len(to(smtp, "bob@example.org")) == 2)
    assert text(smtp, "bob@example.org") == "what did she say? | and now?"


async def test_an_apps_send_to_a_thread_a_stranger_wrote_into_still_goes_to_its_customer(
    dovecot: DovecotPeer, smtp: SmtpPeer, bridge: Callable[..., Any]
) -> None:
    """A send with no `reply_to` answers the thread's latest mail: never a stranger's that
    merely named the thread's root in In-Reply-To."""
    instance, _ = await ada_asks(bridge, dovecot, smtp)
    dovecot.deliver("help", mail(sender="eve@attacker.test", body="hi", In_Reply_To=ROOT))
    await smtp.wait_for(lambda: len(to(smtp, "eve@attacker.test")) == 1)  # the sentinel's
    await instance.router.send("help", OutboundMessage(thread_id=ROOT, text="your payslip"))
    await smtp.wait_for(lambda: len(smtp.received) == 3)
    assert smtp.received[-1].rcpt_tos == ["ada@example.org"]


async def test_an_untrusted_stranger_in_a_trusted_thread_meets_the_sentinel(
    dovecot: DovecotPeer, smtp: SmtpPeer, bridge: Callable[..., Any]
) -> None:
    """Trust is the mail's own: a stranger's mail is judged by its sender, whatever thread it
    names."""
    _, ours = await ada_asks(bridge, dovecot, smtp)
    dovecot.deliver(
        "help",
        mail(sender="eve@attacker.test", body="summarise this thread", In_Reply_To=ours),
    )
    await smtp.wait_for(lambda: len(to(smtp, "eve@attacker.test")) == 1)
    answer = text(smtp, "eve@attacker.test")
    assert "pairing code" in answer and "5000" not in answer


async def test_the_customer_and_a_colleague_they_cc_d_stay_in_the_thread(
    dovecot: DovecotPeer, smtp: SmtpPeer, bridge: Callable[..., Any]
) -> None:
    """Ada replies from her address, Cc'ing Carol; Carol replies to all later: one thread, also
    after a restart."""
    instance, ours = await ada_asks(bridge, dovecot, smtp)
    dovecot.deliver(
        "help",
        reply(ROOT, ours, body="Carol knows more", message_id="<q2@x>", Cc="carol@example.org"),
    )
    await smtp.wait_for(lambda: len(to(smtp, "carol@example.org")) == 1)
    second = str(to(smtp, "carol@example.org")[0].message["Message-ID"])
    await instance.stop(drain_timeout=2)
    instance = await bridge({}, agents={"echo": HistoryAgent()})
    dovecot.deliver(
        "help",
        reply(
            *(ROOT, ours, "<q2@x>", second),
            sender="carol@example.org",
            to="help@example.com, ada@example.org",
            body="it is the toner",
        ),
    )
    await smtp.wait_for(lambda: len(to(smtp, "carol@example.org")) == 2)
    assert text(smtp, "carol@example.org") == (
        "my salary is 5000 | Carol knows more | it is the toner"
    )


UNVOUCHED = b"Authentication-Results: mx.example.com; dmarc=none; dkim=none\r\n"


async def test_who_joins_a_thread_is_decided_by_its_participants(
    dovecot: DovecotPeer, start: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    """From a participant: joins. With a stranger's Reply-To (the answer goes there): its own
    thread. Unvouched From of a participant with a stranger on Cc: its own thread; without
    one: joins (a customer whose domain signs nothing still has their thread)."""
    caplog.set_level("INFO")
    running = await start(authenticated_by="mx.example.com")
    inbox = running.inbox
    dovecot.deliver("help", UNVOUCHED + mail(body="first", message_id=ROOT))
    dovecot.deliver(
        "help", UNVOUCHED + mail(body="same customer", In_Reply_To=ROOT, Reply_To="ada@example.org")
    )
    dovecot.deliver("help", mail(body="answer me there", In_Reply_To=ROOT, Reply_To="e@x.test"))
    dovecot.deliver("help", UNVOUCHED + mail(body="forged", In_Reply_To=ROOT, Cc="e@x.test"))
    await inbox.wait_count(4)
    threads = {m.text: m.thread_id for m in inbox.messages}
    assert threads["first"] == threads["same customer"] == ROOT
    assert threads["answer me there"] not in (ROOT, threads["forged"])
    assert threads["forged"] != ROOT
    said = [
        r.getMessage() for r in caplog.records if "not among its participants" in r.getMessage()
    ]
    assert len(said) == 2 and "e@x.test" in said[1]


async def test_a_thread_known_before_its_participants_were_kept_keeps_its_customer(
    dovecot: DovecotPeer, start: Callable[..., Any], sqlite_store: Any
) -> None:
    """The participants' record gone (ran out, or from an older version): the addresses of the
    thread's latest mail stand in for them."""
    running = await start()
    dovecot.deliver("help", mail(body="first", message_id=ROOT, Cc="carol@example.org"))
    await running.inbox.wait_count(1)
    await running.connector.wait_for(lambda: running.connector.handled == 1)
    await sqlite_store.delete_state(f"email:help:participants:{ROOT}")
    dovecot.deliver("help", mail(sender="carol@example.org", body="me too", In_Reply_To=ROOT))
    dovecot.deliver("help", mail(sender="bob@example.org", body="and me", In_Reply_To=ROOT))
    await running.inbox.wait_count(3)
    threads = {m.text: m.thread_id for m in running.inbox.messages}
    assert threads["me too"] == ROOT and threads["and me"] != ROOT


VOUCHED = b"Authentication-Results: mx.example.com; dmarc=pass header.from=example.org\r\n"


async def test_a_colleague_a_participant_cc_d_joins_only_when_that_mail_was_vouched_for(
    dovecot: DovecotPeer, start: Callable[..., Any]
) -> None:
    """The rule for Cc (with `authenticated_by`): whom a participant's mail vouched for by
    the server Cc's becomes a participant, and their reply to all joins, vouched for or not
    (its From and Cc are participants then). Whom a mail the server does not vouch for Cc's
    does not: that mail starts its own thread (anyone could have written it), and so their
    reply lands there, not in the thread. Nor can an admitted colleague bring in another with
    a mail nobody vouches for."""
    running = await start(authenticated_by="mx.example.com")
    inbox = running.inbox
    dovecot.deliver("help", VOUCHED + mail(body="first", message_id=ROOT))
    dovecot.deliver(
        "help",
        VOUCHED + reply(ROOT, body="cc dave", message_id="<a2@x>", Cc="dave@example.org"),
    )
    dovecot.deliver(
        "help",
        UNVOUCHED + reply(ROOT, body="cc erin", message_id="<a3@x>", Cc="erin@example.org"),
    )
    await inbox.wait_count(3)
    everyone = {"to": "help@example.com", "Cc": "ada@example.org"}
    dovecot.deliver(
        "help",
        UNVOUCHED
        + reply(ROOT, "<a2@x>", sender="dave@example.org", body="dave to all", **everyone),
    )
    dovecot.deliver(
        "help",
        VOUCHED + reply(ROOT, "<a3@x>", sender="erin@example.org", body="erin to all", **everyone),
    )
    dovecot.deliver(
        "help",
        UNVOUCHED
        + reply(
            *(ROOT, "<a2@x>"),
            sender="dave@example.org",
            body="dave brings frank",
            to="help@example.com",
            Cc="ada@example.org, frank@example.org",
        ),
    )
    await inbox.wait_count(6)
    threads = {m.text: m.thread_id for m in inbox.messages}
    assert threads["cc dave"] == threads["dave to all"] == ROOT
    assert threads["cc erin"] == threads["erin to all"] == "<a3@x>"
    assert threads["dave brings frank"] not in (ROOT, "<a3@x>")


async def test_a_reply_goes_to_all_but_never_to_the_mailboxs_own_address(
    dovecot: DovecotPeer, smtp: SmtpPeer, bridge: Callable[..., Any]
) -> None:
    """Reply-all, as a support desk expects: the sender and everyone on To and Cc, but not the
    mailbox itself, however it was written (a `+tag`, capitals)."""
    await bridge({})
    dovecot.deliver(
        "help",
        mail(
            to="Billing <help+billing@example.com>, dave@example.org",
            Cc="Help Desk <HELP@Example.com>, carol@example.org",
        ),
    )
    await smtp.wait_for(lambda: len(smtp.received) == 1)
    [answer] = smtp.received
    assert answer.rcpt_tos == ["ada@example.org", "dave@example.org", "carol@example.org"]
    assert answer.message["To"] == "ada@example.org"
    assert answer.message["Cc"] == "dave@example.org, carol@example.org"


async def written_in_a_mail_client(dovecot: DovecotPeer, smtp: SmtpPeer, raw: bytes) -> None:
    """What a mail client does with the mail a person sent from the mailbox: APPEND to Sent."""
    imap = ImapConfig.model_validate(connection(dovecot, smtp)["imap"])
    session = ImapSession(imap, 10)
    await session.open(select=False)
    try:
        await session.append(mailbox_argument("Sent"), raw, create=False)
    finally:
        await session.close()


@pytest.mark.parametrize("dovecot", [{"sent": "Sent"}], indirect=True)
async def test_a_colleague_a_person_in_the_mailbox_cc_d_from_a_mail_client_joins_the_thread(
    dovecot: DovecotPeer, smtp: SmtpPeer, bridge: Callable[..., Any]
) -> None:
    """A person at the desk answers Ada from their mail client, Cc'ing Carol (the mail is in
    Sent; the bridge never read it). Carol's reply to all continues Ada's thread, and its
    answer goes to all; someone that mail did not go to still starts a thread of their own."""
    _, ours = await ada_asks(bridge, dovecot, smtp)
    desk = "<desk-1@example.com>"
    await written_in_a_mail_client(
        dovecot,
        smtp,
        reply(
            ROOT,
            ours,
            sender="Help Desk <help@example.com>",
            to="ada@example.org",
            Cc="carol@example.org",
            body="Carol from IT will know",
            message_id=desk,
        ),
    )
    dovecot.deliver(
        "help",
        mail(  # her client sends In-Reply-To alone
            sender="carol@example.org",
            Cc="ada@example.org",
            body="it is the toner",
            In_Reply_To=desk,
        ),
    )
    await smtp.wait_for(lambda: len(to(smtp, "carol@example.org")) == 1)
    assert text(smtp, "carol@example.org") == "my salary is 5000 | it is the toner"
    assert to(smtp, "carol@example.org")[0].rcpt_tos == ["carol@example.org", "ada@example.org"]
    dovecot.deliver("help", mail(sender="erin@example.org", body="me too?", In_Reply_To=desk))
    await smtp.wait_for(lambda: len(to(smtp, "erin@example.org")) == 1)
    assert text(smtp, "erin@example.org") == "me too?"
