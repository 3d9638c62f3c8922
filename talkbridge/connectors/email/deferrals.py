"""Replies that some recipients' servers deferred (a 4xx to RCPT TO) while the others took them.

The send fails as transient and its retry (same idempotency key) goes to the deferred
recipients alone: the others have the reply. Who is still owed it is kept in memory (with the
mail as it went out) and in the store, so a retry after a restart (the message answered again)
does not send the reply a second time to everyone else.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from datetime import timedelta
from email.message import EmailMessage
from typing import NamedTuple

from talkbridge.connectors.sending import content_digest, keep_latest
from talkbridge.errors import StoreError, TransientError
from talkbridge.message import OutboundMessage
from talkbridge.store.base import Store

LIMIT = 1024
"""Replies kept in memory (the oldest go first; the store keeps them all for `keep_for`)."""


class Deferred(NamedTuple):
    mail: EmailMessage
    message_id: str
    recipients: list[str]


class Deferrals:
    def __init__(self, store: Store, prefix: str, keep_for: timedelta, log: logging.Logger) -> None:
        self._store = store
        self._prefix = f"{prefix}deferred:"
        self._keep_for = keep_for
        self._log = log
        self._memory: OrderedDict[str, Deferred] = OrderedDict()

    def take(self, key: str) -> Deferred | None:
        """The reply as it went out, to send again: it is given back with `hold` should the
        retry fail again."""
        return self._memory.pop(key, None)

    def hold(self, key: str, deferred: Deferred) -> None:
        keep_latest(self._memory, key, deferred, LIMIT)

    async def owed(self, key: str, message: OutboundMessage) -> list[str] | None:
        """After a restart: the recipients an earlier try of this reply still owes it, or None
        when it owes nobody (or said something else: a turn run again may)."""
        try:
            raw = await self._store.get_state(self._prefix + key)
        except StoreError as exc:  # sending to everyone again could repeat the reply
            raise TransientError(f"cannot tell who an earlier try reached: {exc}") from exc
        if not raw:
            return None
        kept = json.loads(raw)
        if kept.get("content") != content_digest(message):
            return None
        return [str(address) for address in kept["recipients"]]

    async def keep(self, key: str, message: OutboundMessage, deferred: Deferred) -> None:
        self.hold(key, deferred)
        value = {"content": content_digest(message), "recipients": deferred.recipients}
        try:
            await self._store.set_state(
                self._prefix + key, json.dumps(value), keep_for=self._keep_for
            )
        except StoreError as exc:  # a retry in this process still sends to them alone
            self._log.warning("could not keep who reply %s is owed to: %s", key, exc)

    async def settled(self, key: str) -> None:
        """Every recipient has the reply now."""
        try:
            await self._store.delete_state(self._prefix + key)
        except StoreError as exc:  # it runs out at its deadline instead
            self._log.warning("could not forget who reply %s was owed to: %s", key, exc)
