"""Which of our messages answered an inbound message, so an edit or a delete reaches them all.

The store's id map keeps the first (what an edit changes); a reply split over several messages
keeps the others in the store's state, so editing the question to a shorter answer, or deleting
it, does not leave the old answer's later parts behind.

A deleted inbound message leaves a tombstone in the store's state (kept as long as the router
remembers messages, `retention.dedupe_days`): a deletion that comes while the answer is still
being posted finds no reply on record, and the bridge, recording it, finds the tombstone and
deletes it then. The tombstone says whether the reply was taken back already, so the two never
both delete it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import timedelta

from talkbridge.store.base import Store


def _parts_key(connection_id: str, answered: str) -> str:
    return f"reply-parts:{connection_id}:{answered}"


async def remember(store: Store, connection_id: str, answered: str, ids: Sequence[str]) -> None:
    await store.map_id(connection_id, answered, ids[0])
    if len(ids) > 1:  # most replies are one message: nothing more to write
        await store.set_state(_parts_key(connection_id, answered), json.dumps(list(ids[1:])))


async def later_parts(store: Store, connection_id: str, answered: str) -> list[str]:
    raw = await store.get_state(_parts_key(connection_id, answered))
    parts = json.loads(raw) if raw else []
    return [p for p in parts if isinstance(p, str)]


async def forget_later_parts(store: Store, connection_id: str, answered: str) -> None:
    if await store.get_state(_parts_key(connection_id, answered)):
        await store.set_state(_parts_key(connection_id, answered), "")


DELETED = "deleted"
"""Tombstone: the inbound message was deleted; a reply to it is still to be taken back."""
TAKEN_BACK = "taken-back"
"""Tombstone: the inbound message was deleted and our reply to it with it (or tried to be)."""


def _tombstone_key(connection_id: str, answered: str) -> str:
    return f"deleted:{connection_id}:{answered}"


async def tombstone(store: Store, connection_id: str, answered: str) -> str | None:
    """`DELETED` or `TAKEN_BACK` once `answered` was deleted (for `keep_for`); else None."""
    return await store.get_state(_tombstone_key(connection_id, answered))


async def mark_deleted(
    store: Store, connection_id: str, answered: str, *, keep_for: timedelta
) -> bool:
    """Note that `answered` was deleted; False if its reply was taken back already (the same
    deletion reported again)."""
    if await tombstone(store, connection_id, answered) == TAKEN_BACK:
        return False
    await store.set_state(_tombstone_key(connection_id, answered), DELETED, keep_for=keep_for)
    return True


async def mark_taken_back(
    store: Store, connection_id: str, answered: str, *, keep_for: timedelta
) -> None:
    await store.set_state(_tombstone_key(connection_id, answered), TAKEN_BACK, keep_for=keep_for)
