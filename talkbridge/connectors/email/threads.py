"""Who belongs to an email thread, and so which thread a mail that references one joins.

Anyone can put a thread's Message-IDs in `References` or `In-Reply-To`. Taken at its word, such
a mail lands in that thread: an agent answering it is given the earlier conversation (other
people's), and an app's send to the thread (no `reply_to`) answers the latest mail, the
stranger's. So a mail joins a thread it references only when its sender (after the contact-form
rule) and the addresses its answer goes to (Reply-To) are participants: addresses that wrote
into the thread, or that a reply in it was sent to (To and Cc). A mail whose From the receiving
server does not vouch for (`sender_verified` False) needs its Cc to be participants as well:
its sender is a claim, and the answer reaches the Cc. Anyone else's mail starts its own thread.

Participants are kept per thread in the store for good (bounded to the `LIMIT` latest), as the
thread's history is: threading follows the mail's headers however long a thread was quiet, and
only what guards against repeats runs out (`retention.dedupe_days`). A thread without the record
(from before it was kept) falls back to the addresses of its latest mail. One whose records an
older version let run out (after `dedupe_days` of quiet) is known by its history alone: nobody
joins it any more (a stranger who learnt its root Message-ID would otherwise be given its
conversation), and a mail answering it starts a thread of its own.
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from collections.abc import Iterable

from talkbridge.connectors.email.codec import MailContext
from talkbridge.connectors.sending import keep_latest
from talkbridge.message import thread_key
from talkbridge.store.base import Store

LIMIT = 100
"""Addresses kept per thread; the least recently seen go first."""


class Participants:
    """The participants of each thread of one mailbox, under `<prefix>participants:<thread>`."""

    def __init__(self, store: Store, connection_id: str, prefix: str) -> None:
        self._store = store
        self._connection_id = connection_id
        self._prefix = prefix
        self._lock = asyncio.Lock()
        """One update at a time: a reply sent while a mail is read must not drop the other's."""

    def _key(self, thread_id: str) -> str:
        return f"{self._prefix}participants:{thread_id}"

    async def of(self, thread_id: str) -> list[str] | None:
        """The thread's participants, or None for a thread this mailbox knows nothing of."""
        stored = await self._store.get_state(self._key(thread_id))
        if stored is not None:
            return list(json.loads(stored))
        latest = await self._store.get_state(f"{self._prefix}thread:{thread_id}")
        context = await self._store.get_state(f"{self._prefix}msg:{latest}") if latest else None
        if context is not None:
            mail = MailContext.from_json(context)
            return [*mail.reply_to, *mail.cc]
        if "@" in thread_id and "<" not in thread_id:  # an app's new conversation with it
            return [thread_id]
        if await self._store.history(thread_key(self._connection_id, thread_id), limit=1):
            return []  # its records ran out under an older version: known, nobody joins
        return None

    async def admits(self, thread_id: str, addresses: Iterable[str]) -> bool:
        """Whether a mail whose sender and answer are `addresses` may join the thread (one
        this mailbox knows nothing of is new: anyone may start it)."""
        known = await self.of(thread_id)
        return known is None or set(addresses) <= set(known)

    async def add(self, thread_id: str, addresses: Iterable[str]) -> None:
        async with self._lock:
            kept: OrderedDict[str, None] = OrderedDict.fromkeys(await self.of(thread_id) or ())
            for address in addresses:
                keep_latest(kept, address.lower(), None, LIMIT)
            await self._store.set_state(self._key(thread_id), json.dumps(list(kept)))
