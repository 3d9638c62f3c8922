"""The retention sweep: the store forgets dedupe ids, idempotency records and failed sends once
they are older than the config's `retention`, and state entries past their `keep_for`, so it
does not grow with every message ever seen."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

from talkbridge.config import RetentionConfig
from talkbridge.message import utcnow
from talkbridge.store.base import Pruned, Retention, Store

log = logging.getLogger("talkbridge.store")

STEP = 10_000
"""Entries of each kind per store call: a big backlog never holds the store for long."""


def keep_for(config: RetentionConfig) -> Retention:
    return Retention(
        dedupe=timedelta(days=config.dedupe_days),
        sent=timedelta(days=config.sent_days),
        failed_sends=timedelta(days=config.failed_sends_days),
    )


async def sweep(store: Store, keep: Retention, *, step_size: int = STEP) -> Pruned:
    """One sweep, in steps; the totals of what it dropped."""
    total = Pruned(0, 0, 0, False)
    while True:
        step = await store.prune(now=utcnow(), keep=keep, limit=step_size)
        total = Pruned(
            total.dedupe + step.dedupe,
            total.sent + step.sent,
            total.failed_sends + step.failed_sends,
            False,
            total.expired_state + step.expired_state,
        )
        if not step.more:
            return total


async def sweep_forever(
    store: Store, config: RetentionConfig, swept: asyncio.Event | None = None
) -> None:
    """Sweep now (the first sweep leaves the marks later ones age by), then every interval;
    `swept` is set after each sweep."""
    keep = keep_for(config)
    while True:
        try:
            done = await sweep(store, keep)
        except Exception as exc:  # the next sweep tries again; traffic is not affected
            log.warning("retention sweep failed: %s", exc)
        else:
            if done.dedupe or done.sent or done.failed_sends or done.expired_state:
                log.info(
                    "retention: forgot %d dedupe id(s), %d send record(s), %d failed send(s),"
                    " %d expired state entr(ies)",
                    done.dedupe,
                    done.sent,
                    done.failed_sends,
                    done.expired_state,
                )
        if swept is not None:
            swept.set()
        await asyncio.sleep(config.sweep_every)
