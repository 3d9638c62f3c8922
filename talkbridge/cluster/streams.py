"""Small helpers shared by the inbound and outbound buses (Redis Streams, consumer groups)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

Entry = tuple[str, dict[str, str]]


async def ensure_group(client: aioredis.Redis, stream: str, group: str) -> None:
    """Create the consumer group (and the stream) unless it exists; it starts at the beginning,
    so entries added before the group existed are read too."""
    try:
        await client.xgroup_create(stream, group, id="0", mkstream=True)
    except ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


def group_gone(exc: BaseException) -> bool:
    """Whether a read failed because its stream or consumer group is gone (a FLUSHDB, a key
    deleted): `NOGROUP` for a new read, and from Redis 7 `UNBLOCKED the stream key no longer
    exists` for one that was blocked on it. The reader makes the group again and reads on."""
    return isinstance(exc, ResponseError) and str(exc).startswith(("NOGROUP", "UNBLOCKED"))


async def remake_groups(
    client: aioredis.Redis, streams: Iterable[str], group: str, log: logging.Logger
) -> None:
    """After `group_gone`: say so once (what the streams held unacknowledged went with them),
    and make the streams and their group again."""
    names = sorted(streams)
    log.warning(
        "%s: gone from redis (a FLUSHDB, or keys deleted); made again: what they held is lost",
        ", ".join(names),
    )
    for name in names:
        await ensure_group(client, name, group)


async def claim_all(
    client: aioredis.Redis,
    stream: str,
    group: str,
    consumer: str,
    min_idle_ms: int,
    each: Callable[[Entry], Awaitable[None]],
) -> int:
    """XAUTOCLAIM every pending entry idle at least `min_idle_ms` (from any consumer) to
    `consumer`, oldest first, handing each to `each`; returns how many were claimed."""
    cursor = "0-0"
    count = 0
    while True:
        result: Any = await client.xautoclaim(
            stream, group, consumer, min_idle_ms, start_id=cursor, count=256
        )
        cursor, entries = result[0], result[1]
        for entry_id, fields in entries:
            if fields is None:  # deleted meanwhile: nothing left to handle
                continue
            count += 1
            await each((entry_id, fields))
        if cursor in ("0-0", b"0-0"):
            return count


class Cycles:
    """Counts completed read cycles of a reader loop, so a caller can wait until every read that
    might still include a stream it just dropped has come back."""

    def __init__(self) -> None:
        self.count = 0
        self._changed = asyncio.Event()

    def bump(self) -> None:
        self.count += 1
        event, self._changed = self._changed, asyncio.Event()
        event.set()

    async def wait_past(self, count: int) -> None:
        while self.count <= count:
            await self._changed.wait()


def read_entries(result: Any) -> list[tuple[str, list[Entry]]]:
    """XREAD/XREADGROUP's answer (decoded, RESP2) as (stream, entries) pairs."""
    return [(name, list(entries)) for name, entries in result or ()]
