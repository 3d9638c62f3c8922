"""Mail a person wrote from the mailbox in a mail client, found in its Sent folder.

A person at the support desk answers a thread from their mail client, Cc'ing a colleague; the
bridge never reads that mail (it went out through their client, into the Sent folder). When the
colleague replies to all, their mail answers one the bridge does not know, and they are no
participant of the thread: it would start a thread of its own. So the mail it answers is looked
for in the Sent folder: one there From the mailbox's own address was written from the mailbox
(nobody else can put mail in it), and whom it went to are participants of the thread it answers.
"""

from __future__ import annotations

from dataclasses import dataclass

from talkbridge.connectors.email.codec import (
    addresses,
    message_id_of,
    parse_mail,
    reference_chain,
)
from talkbridge.connectors.email.imap import ImapSession
from talkbridge.connectors.email.safety import is_own

LOOKUPS = 3
"""Message-IDs of a mail's chain looked for (its newest): anyone can write long References."""


@dataclass(frozen=True)
class Written:
    """A mail the mailbox sent: its Message-ID, the ids it answers (oldest first), and whom it
    went to (To and Cc, the mailbox's own address left out)."""

    message_id: str
    chain: tuple[str, ...]
    recipients: tuple[str, ...]


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
