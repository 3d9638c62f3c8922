"""Replies that went out but are not in the Sent folder yet, kept in the store until they are.

A reply is saved to Sent (IMAP APPEND) after the SMTP server took it, over another connection.
A bridge that dies in between (a crash, a kill, a stop that cut the save short, an IMAP server
down just then) would lose the copy for good: the reply is sent, so nothing sends it again.
So the mail as sent is kept here the moment SMTP took it, and forgotten once the folder has it;
each start of the connection saves what is left (`EmailConnector.run`), checking the folder for
its Message-ID first, so a copy saved just before the crash is not saved twice.

Kept for `keep_for` (`retention.dedupe_days`), the `LIMIT` latest, with the number of tries
that failed (`failed`), so that the saving gives up after a bounded number across restarts and
reconnects too: a folder that refuses the copy is not asked again at every start.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from datetime import timedelta

from talkbridge.errors import StoreError
from talkbridge.store.base import Store

LIMIT = 500
"""Replies kept waiting for the Sent folder; beyond, the oldest are given up (logged)."""


class Unsaved:
    """Under `<prefix>unsaved` the Message-IDs waiting, oldest first; under
    `<prefix>unsaved:<Message-ID>` each mail's bytes (base64) and its failed tries (JSON; a
    bare base64 string, as kept by earlier versions, has none)."""

    def __init__(self, store: Store, prefix: str, keep_for: timedelta, log: logging.Logger) -> None:
        self._store = store
        self._index = f"{prefix}unsaved"
        self._keep_for = keep_for
        self._log = log
        self._lock = asyncio.Lock()
        """One change of the index at a time (a connection runs in one process)."""

    def _key(self, message_id: str) -> str:
        return f"{self._index}:{message_id}"

    async def _ids(self) -> list[str]:
        raw = await self._store.get_state(self._index)
        return [str(mid) for mid in json.loads(raw)] if raw else []

    async def add(self, message_id: str, raw: bytes) -> None:
        """Keep a reply the SMTP server took; best effort (the save under way may still
        succeed): a store that fails here is logged, never raised (the reply went out)."""
        try:
            async with self._lock:
                await self._keep(message_id, raw, 0)
                ids = [mid for mid in await self._ids() if mid != message_id] + [message_id]
                for dropped in ids[:-LIMIT]:
                    self._log.warning(
                        "reply %s is no longer kept to be saved to Sent (over %d waiting)",
                        dropped,
                        LIMIT,
                    )
                    await self._store.delete_state(self._key(dropped))
                await self._store.set_state(
                    self._index, json.dumps(ids[-LIMIT:]), keep_for=self._keep_for
                )
        except StoreError as exc:
            self._log.warning(
                "reply %s went out; could not note it is still to be saved to Sent (a crash "
                "before it is saved loses the copy): %s",
                message_id,
                exc,
            )

    async def _keep(self, message_id: str, raw: bytes, tries: int) -> None:
        record = {"raw": base64.b64encode(raw).decode("ascii"), "tries": tries}
        await self._store.set_state(
            self._key(message_id), json.dumps(record), keep_for=self._keep_for
        )

    async def _read(self, message_id: str) -> tuple[bytes, int] | None:
        stored = await self._store.get_state(self._key(message_id))
        if stored is None:
            return None
        if not stored.startswith("{"):  # (base64 never starts so) an earlier version's record
            return base64.b64decode(stored), 0
        record = json.loads(stored)
        return base64.b64decode(record["raw"]), int(record.get("tries", 0))

    async def waiting(self) -> list[tuple[str, bytes]]:
        """The replies still to save, oldest first (those whose record ran out left out)."""
        found: list[tuple[str, bytes]] = []
        for message_id in await self._ids():
            kept = await self._read(message_id)
            if kept is not None:
                found.append((message_id, kept[0]))
        return found

    async def failed(self, message_id: str, raw: bytes) -> int:
        """Count a failed try to save it; returns the tries that failed so far, all runs
        counted (0 when the store fails here: logged, the caller's own count stands)."""
        try:
            async with self._lock:
                kept = await self._read(message_id)
                tries = (kept[1] if kept is not None else 0) + 1
                await self._keep(message_id, raw, tries)
                return tries
        except StoreError as exc:
            self._log.warning(
                "could not count a failed save of reply %s to Sent: %s", message_id, exc
            )
            return 0

    async def done(self, message_id: str) -> None:
        """The Sent folder has it (or there is none to save to): forget it."""
        try:
            async with self._lock:
                await self._store.delete_state(self._key(message_id))
                ids = [mid for mid in await self._ids() if mid != message_id]
                if ids:
                    await self._store.set_state(
                        self._index, json.dumps(ids), keep_for=self._keep_for
                    )
                else:
                    await self._store.delete_state(self._index)
        except StoreError as exc:  # saved again at the next start: found there, not doubled
            self._log.warning(
                "could not forget that reply %s was saved to Sent: %s", message_id, exc
            )
