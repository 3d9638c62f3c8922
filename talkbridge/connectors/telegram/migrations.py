"""Groups that became supergroups: the old chat id -> the new one, kept in the store.

Telegram gives a group a new id when it is upgraded (public link, more members, topics), and
answers every later call naming the old id with a 400 and `migrate_to_chat_id`. Threads keep
the old id they were started with, so the mapping must outlive a restart: kept in memory only,
every first reply after one went to the old id first, a failed call each time.
"""

from __future__ import annotations

from talkbridge.store.base import Store


class Migrations:
    """The chat ids Telegram moved, as connector state (`set_state`), cached once read."""

    def __init__(self, store: Store, connection_id: str) -> None:
        self._store = store
        self._prefix = f"telegram:{connection_id}:migrated:"
        self._known: dict[str, int] = {}

    async def resolve(self, chat_id: int | str) -> int | str:
        """Where messages for `chat_id` go now: its supergroup's id, or itself."""
        if isinstance(chat_id, str) or chat_id >= 0:
            return chat_id  # a `@channel` or a private chat: never migrated
        key = str(chat_id)
        if key not in self._known:
            # Read once: a move another node learns later costs this one a 400, which names
            # the new id (`moved`), not a store read before every reply and typing indicator.
            stored = await self._store.get_state(self._prefix + key)
            self._known[key] = chat_id if stored is None else int(stored)
        return self._known[key]

    async def moved(self, old: int | str, new: int) -> None:
        """Telegram said `old` is `new` now (a 400 on a send, or the service message)."""
        if self._known.get(str(old)) == new:
            return
        self._known[str(old)] = new
        await self._store.set_state(self._prefix + str(old), str(new))
