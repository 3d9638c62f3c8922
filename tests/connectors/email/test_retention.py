"""What an email connection keeps to thread and answer each mail (the reply context, the
thread a Message-ID leads to, the thread's latest mail, its participants) follows the mail's
headers for good, as the conversation's history does: a customer answering a thread after
weeks of silence is in the same conversation, and a stranger naming it is still not. Only what
guards against repeats runs out after `retention.dedupe_days`."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from talkbridge.config import RetentionConfig
from talkbridge.message import OutboundMessage
from talkbridge.retention import keep_for
from tests.connectors.email.conftest import mail
from tests.connectors.email.test_e2e import to
from tests.connectors.email.test_thread_membership import ROOT, ada_asks, reply, text
from tests.peers.email import DovecotPeer, SmtpPeer

DAY = 86_400.0


async def test_a_reply_after_longer_than_dedupe_days_of_silence_continues_the_thread(
    dovecot: DovecotPeer, smtp: SmtpPeer, bridge: Callable[..., Any]
) -> None:
    clock = [time.time()]
    instance, ours = await ada_asks(bridge, dovecot, smtp)  # day 0 (before the clock is moved)
    await instance.router.join()  # (the answer's send done: what it keeps is of day 0)
    store = instance.store
    store.wall_clock = lambda: clock[0]
    keep = keep_for(RetentionConfig())  # dedupe_days: 7

    async def sweep() -> None:
        await store.prune(now=datetime.fromtimestamp(clock[0], UTC), keep=keep)

    # 30 days of silence, swept: Ada answers our answer (her client sends In-Reply-To alone).
    clock[0] += 30 * DAY
    await sweep()
    dovecot.deliver(
        "help", mail(body="still broken", message_id="<d30@example.org>", In_Reply_To=ours)
    )
    await smtp.wait_for(lambda: len(to(smtp, "ada@example.org")) == 2)
    await instance.router.join()
    assert text(smtp, "ada@example.org") == "my salary is 5000 | still broken"
    answer = to(smtp, "ada@example.org")[-1].message
    assert answer["In-Reply-To"] == "<d30@example.org>"
    history = await store.history(f"help\x1f{ROOT}", limit=10)
    assert [h.text for h in history if h.role == "user"] == ["my salary is 5000", "still broken"]

    # Another 30 days: a stranger naming the whole chain still starts a thread of his own.
    clock[0] += 30 * DAY
    await sweep()
    chain = [ROOT, ours, "<d30@example.org>", str(answer["Message-ID"])]
    dovecot.deliver("help", reply(*chain, sender="bob@example.org", body="what did she say?"))
    await smtp.wait_for(lambda: len(to(smtp, "bob@example.org")) == 1)
    assert text(smtp, "bob@example.org") == "what did she say?"
    # And an app's send to the quiet thread still has the thread's latest mail to answer.
    await instance.router.send("help", OutboundMessage(thread_id=ROOT, text="solved?"))
    last = smtp.received[-1]
    assert last.rcpt_tos == ["ada@example.org"]
    assert last.message["In-Reply-To"] == "<d30@example.org>"
