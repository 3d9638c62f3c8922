"""Telegram albums: the items of one media group reach the bridge as one message, answered once.

Telegram sends an album as one update per item, sharing a `media_group_id`, the caption on one
of them: in one `getUpdates` batch or straddling two, or as webhook POSTs, where Telegram sends
a chat's next update only once the previous POST was answered. A group closes, and goes on as
one message (`codec.merge_album`), when an update that is not one of its items comes after it
(polling: any update, a batch being in Telegram's order; webhook: one of the same chat, since
other chats' updates come concurrently), when it holds ten items (an album's most), or when
`wait` seconds pass without a new item: never later than that after its last item.

At-least-once. Telegram forgets an update once a later offset is confirmed (a webhook's: once
its POST is answered), and an album's next item may not have come by then. Holding the offset
back cannot wait for it: `getUpdates` from the old offset answers at once with the same items (a
busy loop), and a webhook would never send the next item. So `add` writes each item to the store
(connector state) before its update is confirmed. A closed group is first marked closing in that
record, then delivered (the router's inbox has it durably once `deliver` returns), then each
item's native id is mapped to the album's id in the store's id map, then the group leaves the
record of open ones. Its updates are kept (`kept_key`) for `keep_for` after it went out or was
last edited (the router's dedupe window, `retention.dedupe_days`), so that an edit of an item can
decode the album again; a later edit is one of that item alone.

A stop or crash may come between any two of these steps. At start (`resume`), a group an earlier
run left open and never began to deliver waits again for its other items, `wait` seconds or
until an update after it, as if the bridge had not stopped: Telegram offers the items it has not
forgotten and those sent meanwhile, and the album goes on once, whole. A group marked closing
goes at once instead, not held for more items: it may have gone out already, and then goes again
under the same id, which the router drops as a duplicate (a late item added to it would be
dropped with it). An item Telegram offers again after its album went out is found in the id map
and skipped, so a restart never makes a second turn; nor does an edit of an item, which `edit`
makes an edit of the album.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from talkbridge.backoff import Backoff
from talkbridge.connectors.telegram.codec import ALBUM_MAX, AlbumKey, album_edit, album_item
from talkbridge.message import NormalizedMessage
from talkbridge.store.base import Store

Decode = Callable[[Sequence[dict[str, Any]]], NormalizedMessage | None]
"""An album's updates as one message (None: no item could be read)."""
Deliver = Callable[[NormalizedMessage], Awaitable[None]]
"""Hand a message to the subscribers; returns once they accepted it."""


def item_key(native_id: str) -> str:
    """Where the store's id map says which album an item went out in: apart from the item's
    native id itself, which the bridge maps to its reply (as `store.base.once_key` is)."""
    return f"\x1falbum\x1f{native_id}"


def kept_key(connection_id: str, album_id: str) -> str:
    """The state key holding a delivered album's updates, for decoding it again on an edit."""
    return f"telegram:{connection_id}:album:{album_id}"


@dataclass(eq=False)
class _Group:
    key: AlbumKey
    items: dict[int, tuple[str, dict[str, Any]]] = field(default_factory=dict)
    """update_id -> (the item's native id, its update)."""
    timer: asyncio.TimerHandle | None = None
    closing: bool = False
    """Its delivery began (and is so marked in the store): it may have gone out already."""

    def updates(self) -> list[dict[str, Any]]:
        return [update for _, (_, update) in sorted(self.items.items())]

    def first(self) -> int:
        return min(self.items)

    def disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


class Albums:
    """The open albums of one connection, kept in the store until they went out."""

    def __init__(
        self,
        store: Store,
        connection_id: str,
        *,
        decode: Decode,
        deliver: Deliver,
        wait: float,
        keep_for: timedelta,
        log: logging.Logger,
    ) -> None:
        self._wait = wait
        self._keep_for = keep_for
        self._store = store
        self._cid = connection_id
        self._decode = decode
        self._deliver = deliver
        self._log = log
        self._open_key = f"telegram:{connection_id}:albums"
        self._open: dict[AlbumKey, _Group] = {}
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        self._retry = Backoff(base=wait, cap=30.0)

    async def resume(self) -> None:
        """Read back the groups an earlier run left open: those it began to deliver go at once,
        the others wait again for their other items (see the module's docstring)."""
        async with self._lock:
            self._open = self._read(await self._store.get_state(self._open_key))
            for group in sorted(self._open.values(), key=_Group.first):
                if group.closing:
                    await self._close(group)
                else:
                    self._arm(group, self._wait)

    async def pause(self) -> None:
        """Stop waiting (the transport stops); open groups stay in the store for `resume`."""
        for group in self._open.values():
            group.disarm()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def add(self, update_id: int, key: AlbumKey, native: str, update: dict[str, Any]) -> None:
        """Record one item, in the store before its update is confirmed; ten close the group."""
        async with self._lock:
            if await self._store.lookup_id(self._cid, item_key(native)) is not None:
                self._log.info("album item %s went out with its album already: skipped", native)
                return
            group = self._open.setdefault(key, _Group(key))
            group.items[update_id] = (native, update)
            await self._save()
            if len(group.items) >= ALBUM_MAX:
                await self._close(group)
            else:
                self._arm(group, self._wait)

    async def close_before(self, chat_id: str | None, *, keep: AlbumKey | None = None) -> None:
        """Deliver the open groups an update must come after: of its chat, or all (None);
        `keep` is the update's own album, if it is an item."""
        if not self._open:  # most updates: no album waiting
            return
        async with self._lock:
            due = [
                g for g in self._open.values() if chat_id in (None, g.key.chat_id) and g.key != keep
            ]
            for group in sorted(due, key=_Group.first):
                await self._close(group)

    async def edit(self, edit: NormalizedMessage, item: dict[str, Any]) -> NormalizedMessage:
        """An edit of an album's item (`item`: `codec.edited_item`) as an edit of the album as it
        now is, so the bridge updates its one answer; unchanged when the item went out alone."""
        assert edit.edit_of is not None
        async with self._lock:
            album_id = await self._store.lookup_id(self._cid, item_key(edit.edit_of))
            if album_id is None:
                return edit
            key = kept_key(self._cid, album_id)
            updates = [
                item if _native(u) == edit.edit_of else u
                for u in _updates(
                    _loaded(await self._store.get_state(key), key, self._log), key, self._log
                )
            ]
            if updates:  # kept on from this edit, which a later one may follow
                await self._store.set_state(key, json.dumps(updates), keep_for=self._keep_for)
        album = self._decode(updates) if updates else None
        if album is None or album.id != album_id:  # its updates are gone: the item alone
            return edit.model_copy(update={"edit_of": album_id})
        return album_edit(album, edit)

    async def _close(self, group: _Group) -> None:
        """Deliver `group` as one message, map its items to it, and drop it from the record."""
        group.disarm()
        updates = group.updates()
        album = self._decode(updates)
        if album is not None:
            if not group.closing:  # before it may go out: a restart must not wait for more
                group.closing = True
                await self._save()
            try:
                await self._deliver(album)
            except Exception:
                self._arm(group, self._retry.next())  # still in the store: tried again later
                raise
            self._retry.reset()
            for native, _ in group.items.values():
                await self._store.map_id(self._cid, item_key(native), album.id)
            await self._store.set_state(
                kept_key(self._cid, album.id), json.dumps(updates), keep_for=self._keep_for
            )
        if self._open.get(group.key) is group:
            del self._open[group.key]
        await self._save()

    async def _save(self) -> None:
        """The open groups' updates, and which of them are closing (`_read` reads it back)."""
        updates = [u for group in self._open.values() for u in group.updates()]
        closing = [list(group.key) for group in self._open.values() if group.closing]
        record = {"updates": updates, "closing": closing}
        await self._store.set_state(self._open_key, json.dumps(record) if updates else "")

    def _read(self, raw: str | None) -> dict[AlbumKey, _Group]:
        groups: dict[AlbumKey, _Group] = {}
        updates, closing = _record(raw, self._open_key, self._log)
        for update in updates:
            uid, item = update.get("update_id"), album_item(update)
            if item is None or not isinstance(uid, int):
                self._log.error("%s: skipping a kept update that is no album item", self._open_key)
                continue
            key, native = item
            group = groups.setdefault(key, _Group(key, closing=closing is None or key in closing))
            group.items[uid] = (native, update)
        return groups

    def _arm(self, group: _Group, delay: float) -> None:
        group.disarm()
        group.timer = asyncio.get_running_loop().call_later(delay, self._due, group)

    def _due(self, group: _Group) -> None:
        group.timer = None
        task = asyncio.create_task(self._expire(group), name=f"telegram-album:{self._cid}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _expire(self, group: _Group) -> None:
        async with self._lock:
            if self._open.get(group.key) is not group:
                return  # closed meanwhile
            try:
                await self._close(group)
            except Exception as exc:  # `_close` armed the next try
                self._log.warning(
                    "album in chat %s not delivered yet, trying again: %s", group.key.chat_id, exc
                )


def _native(update: dict[str, Any]) -> str | None:
    item = album_item(update)
    return None if item is None else item[1]


def _record(
    raw: str | None, key: str, log: logging.Logger
) -> tuple[list[dict[str, Any]], set[AlbumKey] | None]:
    """The open groups' record (`Albums._save`): their updates and the closing ones' keys;
    None for those of a record written before groups were marked closing (a list of updates),
    whose groups all go at once, as they did then."""
    value = _loaded(raw, key, log)
    if not isinstance(value, dict):
        return _updates(value, key, log), None
    keys = value.get("closing")
    closing = {
        AlbumKey(str(k[0]), str(k[1]))
        for k in (keys if isinstance(keys, list) else [])
        if isinstance(k, list) and len(k) == 2
    }
    return _updates(value.get("updates"), key, log), closing


def _loaded(raw: str | None, key: str, log: logging.Logger) -> Any:
    """A kept record's JSON; None when there is none or it cannot be read (said in the log)."""
    if not raw:
        return None
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        log.error("%s: the kept album updates are not JSON (%s): dropped", key, exc)
        return None


def _updates(value: Any, key: str, log: logging.Logger) -> list[dict[str, Any]]:
    """The updates in a kept record (`_loaded`); what cannot be read is said, not raised: an
    album that cannot be read back must not stop the connection at every start."""
    if value is None:
        return []
    if not isinstance(value, list):
        log.error("%s: the kept album updates are not a list: dropped", key)
        return []
    return [u for u in value if isinstance(u, dict)]
