"""Mail loops with an auto-responder that marks nothing (no Auto-Submitted, no vendor header),
end to end over two mailboxes: ours (a Bridge) and the responder's (answers every mail it gets,
in the same thread, as a person would write). Only the reply limits can stop such a loop; they
must stop it, and a restart of the bridge must not start it over."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from talkbridge.connectors.email.transport import EmailConnector
from tests.connectors.email.conftest import mail
from tests.connectors.email.test_e2e import to
from tests.peers.email import DovecotPeer, ReceivedMail, SmtpPeer

RESPONDER = "other@example.com"


class Responder:
    """The other mailbox's agent: each mail delivered to it (kept in its own Maildir) is
    answered at once, replying to all with In-Reply-To and References, marking nothing.
    While `held`, its answers wait in `waiting` (the test delivers them)."""

    def __init__(self, dovecot: DovecotPeer) -> None:
        self.dovecot = dovecot
        self.answered = 0
        self.held = False
        self.waiting: list[bytes] = []

    def __call__(self, raw: bytes) -> None:
        self.dovecot.deliver("other", raw)
        got = ReceivedMail("", [], raw, None).message
        self.answered += 1
        chain = f"{got.get('References', '')} {got['Message-ID']}".strip()
        answer = mail(
            sender=f"Other desk <{RESPONDER}>",
            to="help@example.com",
            subject=f"Re: {got['Subject']}".replace("Re: Re: ", "Re: "),
            body=f"Thank you for your message (answer {self.answered}).",
            References=chain,
            In_Reply_To=str(got["Message-ID"]),
        )
        if self.held:
            self.waiting.append(answer)
        else:
            self.dovecot.deliver("help", answer)


async def looping(
    dovecot: DovecotPeer, smtp: SmtpPeer, bridge: Callable[..., Any]
) -> tuple[Any, EmailConnector, Responder]:
    responder = Responder(dovecot)
    smtp.route[RESPONDER] = responder
    instance = await bridge({"max_replies_per_thread": 3, "trusted": ["*@example.com"]})
    connector = instance.registry.get("help")
    assert isinstance(connector, EmailConnector)
    return instance, connector, responder


async def test_the_reply_limit_stops_a_loop_with_a_responder_that_marks_nothing(
    dovecot: DovecotPeer, smtp: SmtpPeer, bridge: Callable[..., Any]
) -> None:
    instance, connector, responder = await looping(dovecot, smtp, bridge)
    dovecot.deliver("help", mail(sender=RESPONDER, subject="Order 17", body="where is it?"))
    # Ours answers the first mail and the responder's first three answers: the fourth reply
    # is refused, so the responder gets nothing more to answer and the loop is over.
    await connector.wait_for(lambda: connector.handled == 4, timeout=20)
    await asyncio.wait_for(instance.router.join(), 15)
    assert len(to(smtp, RESPONDER)) == 3 and responder.answered == 3
    [failure] = await instance.store.failed_sends()
    assert "reply limit" in failure.reason
    assert len(dovecot.flags("other")) == 3  # the responder's mailbox got three, no more


async def test_a_restart_does_not_start_the_count_over(
    dovecot: DovecotPeer, smtp: SmtpPeer, bridge: Callable[..., Any]
) -> None:
    """The bridge restarts (a deploy, a crash) in the middle of the loop: the replies it
    made before still count, and the loop stops at the same limit. The responder's answers
    are held and handed on one by one, so the restart falls between two of them."""
    instance, connector, responder = await looping(dovecot, smtp, bridge)
    responder.held = True
    dovecot.deliver("help", mail(sender=RESPONDER, subject="Order 17", body="where is it?"))
    await smtp.wait_for(lambda: len(responder.waiting) == 1)
    dovecot.deliver("help", responder.waiting[0])
    await smtp.wait_for(lambda: len(responder.waiting) == 2)
    await instance.stop(drain_timeout=5)
    instance = await bridge({"max_replies_per_thread": 3, "trusted": ["*@example.com"]})
    connector = instance.registry.get("help")
    assert isinstance(connector, EmailConnector)
    dovecot.deliver("help", responder.waiting[1])  # the third reply: allowed
    await smtp.wait_for(lambda: len(responder.waiting) == 3)
    dovecot.deliver("help", responder.waiting[2])  # the fourth: refused
    await connector.wait_for(lambda: connector.handled == 2, timeout=20)
    await asyncio.wait_for(instance.router.join(), 15)
    assert len(to(smtp, RESPONDER)) == 3
    [failure] = await instance.store.failed_sends()
    assert "reply limit" in failure.reason
