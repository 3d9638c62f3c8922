"""Which of our messages answered an inbound message, so an edit or a delete reaches them all.

The store's id map keeps the first (what an edit changes); a reply split over several messages
keeps the others in the store's state, so editing the question to a shorter answer, or deleting
it, does not leave the old answer's later parts behind.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

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
