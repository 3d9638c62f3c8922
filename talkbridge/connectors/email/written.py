"""Mail a person wrote from the mailbox in a mail client, found in its Sent folder.

A person at the support desk answers a thread from their mail client, Cc'ing a colleague; the
bridge never reads that mail (it went out through their client, into the Sent folder). When the
colleague replies to all, their mail answers one the bridge does not know, and they are no
participant of the thread: it would start a thread of its own. So the mail it answers is looked
for in the Sent folder: one there From the mailbox's own address was written from the mailbox
(nobody else can put mail in it), and whom it went to are participants of the thread it answers.

Anyone can send mail answering ids the bridge does not know, so the looking is kept cheap and
bounded (`SentLookups`): one IMAP session kept for it, one lookup at a time, capped per window
and per sender, ids not found remembered for a while, and a lookup that fails or takes longer
than the connection's `timeout` given up (the mail is threaded by what the bridge knows).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from talkbridge.connectors.email.codec import (
    addresses,
    message_id_of,
    parse_mail,
    reference_chain,
)
from talkbridge.connectors.email.config import ImapConfig
from talkbridge.connectors.email.imap import ImapSession
from talkbridge.connectors.email.safety import is_own
from talkbridge.errors import ConnectorError

LOOKUPS = 3
"""Message-IDs of a mail's chain looked for (its newest): anyone can write long References."""
MAX_ID_LENGTH = 250
"""Longer Message-IDs are not looked for: no mail client writes one, and each is a command."""
PER_WINDOW = 30
"""Mails whose chain is looked for in `WINDOW` seconds, all senders together…"""
PER_SENDER = 5
"""…and of one sender: a flood of mail answering unknown ids costs at most this many."""
WINDOW = 600.0
NOT_FOUND_FOR = 3600.0
"""Seconds an id not found in Sent is not looked for again (a client saves its copy at once)."""
NOT_FOUND_KEPT = 10_000
PAUSE = 60.0
"""Seconds no lookup is made after one failed (the server is down, or too slow to ask)."""
KEEP_OPEN = 300.0
"""Seconds the lookup session is kept unused; older, it is opened anew (servers and NATs drop
idle connections, and a dead one would cost a `timeout`)."""


@dataclass(frozen=True)
class Written:
    """A mail the mailbox sent: its Message-ID, the ids it answers (oldest first), and whom it
    went to (To and Cc, the mailbox's own address left out)."""

    message_id: str
    chain: tuple[str, ...]
    recipients: tuple[str, ...]


def searchable(message_id: str) -> bool:
    """Whether an id can be a SEARCH argument as a quoted string: printable ASCII (RFC 5322's
    msg-id is; a NUL or 8-bit byte would make the server refuse the command), not too long."""
    return len(message_id) <= MAX_ID_LENGTH and all("!" <= ch <= "~" for ch in message_id)


async def written_from_mailbox(
    session: ImapSession, folder: str, message_ids: list[str], address: str
) -> list[Written]:
    """The mails of `folder` (selected here) with one of `message_ids` (the first `LOOKUPS`)
    that are From `address`: written from the mailbox."""
    if not message_ids or not await session.select(folder):
        return []
    found: list[Written] = []
    for wanted in message_ids[:LOOKUPS]:
        for uid in await session.uids_of_message_id(wanted):
            raw = await session.fetch(uid)
            if raw is None:
                continue
            msg = parse_mail(raw)
            senders = addresses(msg, "From")
            if message_id_of(msg, raw) != wanted or not senders:
                continue
            if all(is_own(a, address) for _, a in senders):
                recipients = [a for _, a in addresses(msg, "To", "Cc") if not is_own(a, address)]
                found.append(Written(wanted, tuple(reference_chain(msg)), tuple(recipients)))
                break
    return found


class SentLookups:
    """Looks for mail written from the mailbox in its Sent folder, on one IMAP session of its
    own (a login per inbound mail would let a flood use up the server's connections of the
    user, and lock the people using the mailbox out), within the caps above."""

    def __init__(
        self,
        config: ImapConfig,
        timeout: float,
        address: str,
        folder_of: Callable[[ImapSession], Awaitable[str | None]],
        log: logging.Logger,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._config = config
        self._timeout = timeout
        self._address = address
        self._folder_of = folder_of
        self._log = log
        self._clock = clock
        self._session: ImapSession | None = None
        self._used = 0.0
        self._lock = asyncio.Lock()
        self._done: deque[tuple[float, str]] = deque()
        """(when, sender) of the lookups in the last `WINDOW` seconds."""
        self._not_found: OrderedDict[str, float] = OrderedDict()
        self._paused_until = float("-inf")
        self._capped_told = float("-inf")
        self.per_window = PER_WINDOW
        self.per_sender = PER_SENDER
        self.sessions = 0
        """Lookup sessions opened in this run (observability, tests)."""

    async def find(self, message_ids: list[str], sender: str) -> list[Written]:
        """The mails of `message_ids` (newest first) written from the mailbox; none when none
        may be looked for now (caps, a pause after a failure) or the lookup failed (logged)."""
        now = self._clock()
        wanted = [m for m in message_ids if searchable(m) and not self._known_missing(m, now)]
        wanted = wanted[:LOOKUPS]
        if not wanted or now < self._paused_until or not self._allowed(sender, now):
            return []
        async with self._lock:
            try:
                found = await asyncio.wait_for(self._look(wanted), self._timeout)
            except (ConnectorError, TimeoutError) as exc:
                reason = str(exc) or f"no answer within {self._timeout:g} s"
                self._log.warning(
                    "could not look for mail sent from the mailbox in Sent (no lookups for "
                    "%gs; the mail is threaded by what the bridge knows): %s",
                    PAUSE,
                    reason,
                )
                self._paused_until = self._clock() + PAUSE
                await self.close()
                return []
        seen = {w.message_id for w in found}
        for mid in wanted:
            if mid not in seen:
                self._not_found[mid] = now
                self._not_found.move_to_end(mid)
        while len(self._not_found) > NOT_FOUND_KEPT:
            self._not_found.popitem(last=False)
        return found

    def _known_missing(self, message_id: str, now: float) -> bool:
        when = self._not_found.get(message_id)
        return when is not None and now - when < NOT_FOUND_FOR

    def _allowed(self, sender: str, now: float) -> bool:
        """Count a lookup for `sender`, or False (said once a window) when a cap is reached."""
        while self._done and now - self._done[0][0] >= WINDOW:
            self._done.popleft()
        mine = sum(1 for _, who in self._done if who == sender)
        if len(self._done) < self.per_window and mine < self.per_sender:
            self._done.append((now, sender))
            return True
        if now - self._capped_told >= WINDOW:
            self._capped_told = now
            self._log.warning(
                "not looking in Sent for the mail that mail from %s answers: %s in %gs "
                "already (cap against floods of mail answering unknown ids); such mail is "
                "threaded by what the bridge knows (said once per %gs)",
                sender,
                f"{mine} lookups for this sender"
                if mine >= self.per_sender
                else f"{len(self._done)} lookups",
                WINDOW,
                WINDOW,
            )
        return False

    async def _look(self, wanted: list[str]) -> list[Written]:
        session = self._session
        if session is not None and (session.lost or self._clock() - self._used > KEEP_OPEN):
            await self.close()
            session = None
        if session is None:
            session = ImapSession(self._config, self._timeout)
            self._session = session
            self.sessions += 1
            await session.open(select=False)
        self._used = self._clock()
        folder = await self._folder_of(session)
        if folder is None:
            return []
        return await written_from_mailbox(session, folder, wanted, self._address)

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()
