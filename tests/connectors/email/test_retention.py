"""What an email connection keeps per mail (the reply context, the thread a Message-ID leads to,
the thread's latest mail, its participants) runs out `retention.dedupe_days` after the thread's
latest mail, so a busy mailbox does not grow the store for ever; a thread still written in stays
joinable, and one idle past that is not opened to whoever names it."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from talkbridge.config import RetentionConfig
from talkbridge.message import OutboundMessage
from talkbridge.retention import keep_for
from tests.connectors.email.test_e2e import to
from tests.connectors.email.test_thread_membership import ROOT, ada_asks, reply, text
from tests.peers.email import DovecotPeer, SmtpPeer

DAY = 86_400.0


async def test_a_threads_records_run_out_after_it_was_idle_for_the_retention_and_not_before(
    dovecot: DovecotPeer, smtp: SmtpPeer, bridge: Callable[..., Any]
) -> None:
    clock = [time.time()]
    instance, ours = await ada_asks(bridge, dovecot, smtp)  # day 0 (before the clock is moved)
    await instance.router.join()  # (the answer's send done: what it keeps is of day 0)
    store = instance.store
    store.wall_clock = lambda: clock[0]
    keep = keep_for(RetentionConfig())  # dedupe_days: 7

    async def sweep() -> int:
        now = datetime.fromtimestamp(clock[0], UTC)
        return (await store.prune(now=now, keep=keep)).expired_state

    # Ada writes again on day 5 and day 10: her thread stays hers, though its first mail's
    # records ran out on day 7.
    chain = [ROOT, ours]
    for day, body in ((5, "still broken"), (10, "and now the scanner")):
        clock[0] += 5 * DAY
        await sweep()
        dovecot.deliver("help", reply(*chain, body=body, message_id=f"<d{day}@example.org>"))
        count = len(to(smtp, "ada@example.org"))
        await smtp.wait_for(lambda c=count: len(to(smtp, "ada@example.org")) == c + 1)
        await instance.router.join()
        chain += [
            f"<d{day}@example.org>",
            str(to(smtp, "ada@example.org")[-1].message["Message-ID"]),
        ]
    assert text(smtp, "ada@example.org") == (
        "my salary is 5000 | still broken | and now the scanner"
    )
    assert await store.get_state(f"email:help:msg:{ROOT}") is None  # day 0's: ran out

    # Idle for 8 days: everything the connection kept of the thread's mail is gone.
    clock[0] += 8 * DAY
    assert await sweep() > 0
    for mid in chain:
        for kind in ("msg", "root"):
            assert await store.get_state(f"email:help:{kind}:{mid}") is None, (kind, mid)
    for kind in ("thread", "participants"):
        assert await store.get_state(f"email:help:{kind}:{ROOT}") is None, kind
    assert await store.get_state("email:help:cursor:INBOX") is not None  # (kept for good)

    # Naming the idle thread does not get a stranger in: he starts his own.
    dovecot.deliver("help", reply(*chain, sender="bob@example.org", body="what did she say?"))
    await smtp.wait_for(lambda: len(to(smtp, "bob@example.org")) == 1)
    assert text(smtp, "bob@example.org") == "what did she say?"


async def test_a_thread_the_bridge_keeps_writing_into_stays_answerable(
    dovecot: DovecotPeer, smtp: SmtpPeer, bridge: Callable[..., Any]
) -> None:
    """An app's sends to a thread (no `reply_to`) keep its latest mail: the next send, days
    later, still has a mail to answer."""
    clock = [time.time()]
    instance, _ = await ada_asks(bridge, dovecot, smtp)
    await instance.router.join()
    instance.store.wall_clock = lambda: clock[0]
    for n in range(3):
        clock[0] += 5 * DAY
        await instance.router.send("help", OutboundMessage(thread_id=ROOT, text=f"update {n}"))
    assert len(to(smtp, "ada@example.org")) == 4
    assert text(smtp, "ada@example.org") == "update 2"
    clock[0] += timedelta(days=8).total_seconds()
    assert await instance.store.get_state(f"email:help:thread:{ROOT}") is None
