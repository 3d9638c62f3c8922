"""Resuming a send that goes out in several platform calls and failed part of the way.

A long message is split into chunks (and attachments follow), so one `send` is several calls. If
call three of five fails, the router retries the send with the same idempotency key; the steps
already done must not be repeated, or the user sees the first chunks twice. That holds across a
restart too: a bridge killed after chunk two answers the message again at its next start (the
message is still pending), with the same key, so how far the send got is kept in the store.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from typing import Any, NamedTuple, TypeVar

from talkbridge.errors import StoreError, TransientError
from talkbridge.message import OutboundMessage
from talkbridge.store.base import Store
from talkbridge.talk import KEYLESS_SEND

K = TypeVar("K")
V = TypeVar("V")

log = logging.getLogger("talkbridge.connectors.sending")

Step = Callable[[int], Awaitable[Sequence[str]]]


def keep_latest(cache: OrderedDict[K, V], key: K, value: V, limit: int) -> None:
    """Put `key` last in `cache` and forget the least recently put keys beyond `limit`: state
    kept for a retry that may never come costs nothing for long."""
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > limit:
        cache.popitem(last=False)


def content_digest(message: OutboundMessage) -> str:
    """What the steps of a send are made from, hashed: a send run again (a turn answered again
    after a restart) that says something else is a new send, not the rest of the earlier one.
    Not `meta`, which holds a turn's own ids."""
    digest = hashlib.sha256()
    fields: list[Any] = [
        message.thread_id,
        message.text,
        message.markup,
        message.reply_to,
        message.buttons,
    ]
    for attachment in message.attachments:
        data = attachment.data
        fields.append(attachment.model_dump(mode="json"))
        fields.append(hashlib.sha256(data).hexdigest() if data is not None else None)
    digest.update(json.dumps(fields, sort_keys=True, default=str).encode())
    return digest.hexdigest()[:32]


class _Progress(NamedTuple):
    content: str
    done: int
    ids: list[str]


class PartialSends:
    """The steps done and ids sent so far per idempotency key, for the sends that failed mid-way.

    Kept in memory (bounded: the least recently touched keys are forgotten first) and, with a
    `store`, under the connection's state for `keep_for` (how long a message may be answered
    again), written after each step and forgotten when the send completes.
    """

    def __init__(
        self,
        store: Store | None = None,
        connection_id: str = "",
        *,
        keep_for: timedelta = timedelta(days=7),
        limit: int = 1024,
    ) -> None:
        self.limit = limit
        self._store = store
        self._prefix = f"partial-send:{connection_id}\x1f"
        self._keep_for = keep_for
        self._done: OrderedDict[str, _Progress] = OrderedDict()

    async def send(self, message: OutboundMessage, count: int, step: Step) -> list[str]:
        """`run` for the steps of `message`, keyed by its idempotency key (or, without one, by
        the router's tries of it: `KEYLESS_SEND`) and its content."""
        if count < 2:  # nothing to resume
            return await self.run(None, count, step)
        key = message.idempotency_key
        durable = key is not None
        key = key if durable else KEYLESS_SEND.get()
        content = content_digest(message)
        return await self.run(key, count, step, content=content, durable=durable)

    async def run(
        self, key: str | None, count: int, step: Step, *, content: str = "", durable: bool = True
    ) -> list[str]:
        """Await `step(0)` … `step(count - 1)` and return the ids they sent, in order.

        With a `key`, steps that an earlier failed run with the same key and `content`
        completed are skipped and their ids reused; without one, every step runs. Not
        `durable`: the progress is kept in memory only.
        """
        if not key:
            return [sent_id for index in range(count) for sent_id in await step(index)]
        store = self._store if durable else None
        earlier = await self._earlier(store, key, content, count)
        stored = earlier is not None and store is not None
        done, sent = (earlier.done, list(earlier.ids)) if earlier else (0, [])
        for index in range(done, count):
            sent.extend(await step(index))
            if index + 1 < count:  # a retry after a failure mid-way resumes after this step
                progress = _Progress(content, index + 1, list(sent))
                keep_latest(self._done, key, progress, self.limit)
                stored = await self._save(store, key, progress) or stored
        self._done.pop(key, None)
        if stored:
            await self._forget(key)
        return sent

    async def _earlier(
        self, store: Store | None, key: str, content: str, count: int
    ) -> _Progress | None:
        progress = self._done.get(key)
        if progress is None and store is not None and count > 1:
            try:
                raw = await store.get_state(self._prefix + key)
            except StoreError as exc:  # sending it all again could repeat what went out
                raise TransientError(f"cannot tell how far an earlier try got: {exc}") from exc
            progress = _parse(raw) if raw else None
        if progress is None:
            return None
        if progress.content != content or progress.done >= count:
            log.info("send %s says something else than its earlier try: sent in full", key)
            return None
        return progress

    async def _save(self, store: Store | None, key: str, progress: _Progress) -> bool:
        if store is None:
            return False
        value = json.dumps(
            {"content": progress.content, "done": progress.done, "ids": progress.ids}
        )
        try:
            await store.set_state(self._prefix + key, value, keep_for=self._keep_for)
        except StoreError as exc:  # the step went out: a retry in this process still resumes
            log.warning("could not keep how far send %s got: %s", key, exc)
        return True

    async def _forget(self, key: str) -> None:
        assert self._store is not None
        try:
            await self._store.delete_state(self._prefix + key)
        except StoreError as exc:  # it runs out at its deadline instead
            log.warning("could not forget the progress of send %s: %s", key, exc)


def _parse(raw: str) -> _Progress | None:
    try:
        data = json.loads(raw)
        ids = [str(i) for i in data["ids"]]
        return _Progress(str(data["content"]), int(data["done"]), ids)
    except (ValueError, TypeError, KeyError):
        return None
