"""Leases: one node at a time holds a named piece of work (a connection, an inbound shard).

`SET key node NX PX ttl` takes a free lease; renewing and releasing compare the holder first (Lua),
so a node can never extend or drop a lease another node took after its own ran out. After Redis
was emptied (FLUSHDB) no lease is taken for a TTL: the old holders hear at their next renewal
(every third of it) that theirs are gone, and stop, before another node takes them. The holder
renews every third of the TTL; when a renewal fails (the key expired or another node holds it,
or Redis stayed unreachable for most of a TTL) the lease is lost and the guarded work must stop.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from talkbridge.cancellation import raise_if_cancelling
from talkbridge.cluster import scripts
from talkbridge.cluster.keys import ClusterKeys

log = logging.getLogger("talkbridge.cluster")

SURE_OF_LEASE = 0.8
"""The part of a lease's TTL after its last renewal in which it is surely still this node's (the
rest covers the renewal's round trip); past it, another node may hold it."""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass(frozen=True, slots=True)
class LeaseState:
    held: bool
    """True when this node holds the lease now."""
    holder: str | None
    """The node holding it (None: nobody)."""
    ttl_left: float
    """Seconds until it runs out unless renewed."""


class Lease:
    def __init__(
        self,
        client: aioredis.Redis,
        key: str,
        node_id: str,
        ttl: float,
        *,
        fence: str | None = None,
    ) -> None:
        self.client = client
        self.key = key
        self._keys = [key] if fence is None else [key, fence]
        """With the fence key (`ClusterKeys.fence`): no lease is taken for a TTL after Redis
        was emptied, while the old holders have yet to hear that theirs are gone."""
        self.node_id = node_id
        self.ttl = ttl
        self._ms = max(1, round(ttl * 1000))
        self._acquire = client.register_script(scripts.ACQUIRE)
        self._renew = client.register_script(scripts.RENEW)
        self._release = client.register_script(scripts.RELEASE)

    @property
    def renew_every(self) -> float:
        return self.ttl / 3

    async def acquire(self) -> LeaseState:
        """Take the lease if it is free (or already ours, which renews it)."""
        held, left, holder = await self._acquire(keys=self._keys, args=[self.node_id, self._ms])
        return LeaseState(bool(held), _text(holder) if holder else None, max(0, int(left)) / 1000)

    async def renew(self) -> bool:
        return bool(await self._renew(keys=[self.key], args=[self.node_id, self._ms]))

    async def confirm(self) -> bool:
        """Renew it, and say whether it is surely this node's for most of a TTL from now (the
        fence right before an action only the holder may take). An answer that came too late
        to be sure (this node paused, or Redis slow) is asked for again."""
        loop = asyncio.get_running_loop()
        while True:
            asked = loop.time()
            if not await self.renew():
                return False
            if loop.time() - asked <= self.ttl * (1 - SURE_OF_LEASE):
                return True

    async def release(self) -> bool:
        """Give the lease up now (only if it is still ours), so another node need not wait."""
        return bool(await self._release(keys=[self.key], args=[self.node_id]))

    async def holder(self) -> str | None:
        value = await self.client.get(self.key)
        return _text(value) if value is not None else None

    def retry_delay(self, state: LeaseState) -> float:
        """How long a node that did not get the lease waits before trying again: until it runs
        out, but at least every third of the TTL (it may be released early), with jitter."""
        return min(state.ttl_left, self.renew_every) + random.uniform(0.0, self.ttl / 30)

    async def keep(self, until: asyncio.Future[Any] | None = None) -> bool:
        """Renew every third of the TTL; return True when the lease is lost, or False as soon
        as `until` (the guarded work) ends by itself, with the lease still held: the caller
        decides what then becomes of it. Never returns while both go on.

        A Redis error is retried; the lease counts as lost once most of a TTL passed without a
        successful renewal, because by then another node may have taken it.
        """
        loop = asyncio.get_running_loop()
        renewed_at = loop.time()
        while True:
            if until is None:
                await asyncio.sleep(self.renew_every)
            else:
                await asyncio.wait({until}, timeout=self.renew_every)
                if until.done():
                    return False
            try:
                if not await self.renew():
                    log.warning("lease %s lost: another node holds it or it ran out", self.key)
                    return True
                renewed_at = loop.time()
            except (RedisError, OSError) as exc:
                raise_if_cancelling()
                if loop.time() - renewed_at > self.ttl * SURE_OF_LEASE:
                    log.warning("lease %s lost: cannot renew it: %s", self.key, exc)
                    return True
                log.info("lease %s: renewal failed (%s); retrying", self.key, exc)


class Membership:
    """Which nodes are alive: each one refreshes its entry every third of the lease TTL. Beside
    it, the number of inbound shards they split the bus into: a node with another is refused.

    A node that could not start one of its connections (`cannot_run`: an SDK that fails to
    import, a connector that refuses its config) cannot answer that connection's messages: it
    says so with each beat, and reads no inbound shard while a node without such a gap lives
    (`able`), so its shards, with the messages it had to leave unanswered, go to such a node."""

    def __init__(
        self, client: aioredis.Redis, keys: ClusterKeys, node_id: str, ttl: float, shards: int
    ) -> None:
        self._client = client
        self._key = keys.nodes()
        self._shards_key = keys.shard_count()
        self._limited_key = keys.limited_nodes()
        self._shards = shards
        self.node_id = node_id
        self._ms = max(1, round(ttl * 1000))
        self._beat = client.register_script(scripts.HEARTBEAT)
        self.live = 1
        self.able = 1
        """Live nodes that started every connection of theirs (this one included, if so)."""
        self.cannot_run: set[str] = set()
        """The connections this node could not start."""
        self._joined = False
        """Whether this node ever said it is alive: else `leave` has nothing to take back."""

    async def join(self) -> int | None:
        """The first `beat`; but when live nodes split the inbound bus into another number of
        shards than this node, that number (and this node is not counted among them)."""
        return await self._say_alive(joining=True)

    async def beat(self) -> int:
        """Say this node is alive; returns the number of live nodes (this one included)."""
        live = await self._say_alive(joining=False)
        assert live is not None, "only a node that joins is refused"
        return live

    async def _say_alive(self, *, joining: bool) -> int | None:
        self._joined = True  # before the call: one that fails may still have been applied
        keys = [self._key, self._shards_key, self._limited_key]
        limited = int(bool(self.cannot_run))
        args: list[str | int] = [self.node_id, self._ms, self._shards, int(joining), limited]
        alive, count, *rest = await self._beat(keys=keys, args=args)
        if not int(alive):
            return int(count)
        self.live = max(1, int(count))
        self.able = max(0, self.live - int(rest[0]))
        return None if joining else self.live

    def shards_to_hold(self, shards: int) -> int:
        """This node's share of the inbound shards: none for a node that could not start a
        connection while an able node lives (it would leave that connection's messages
        unanswered); else an even share among the able nodes (all live ones if none is)."""
        if self.cannot_run and self.able:
            return 0
        return math.ceil(shards / (self.able or self.live))

    async def leave(self) -> None:
        """Take this node's entry out, if it ever made one: a node whose start was cut short
        before that (a Ctrl-C while Redis did not answer) does not wait for Redis again."""
        if self._joined:
            await self._client.zrem(self._key, self.node_id)
            await self._client.zrem(self._limited_key, self.node_id)

    async def taken_by_another(self, watch: float) -> bool:
        """Whether a running process already beats with this node id (two processes given
        the same `--node-id`). A node that crashed left its entry behind too, but stops
        renewing it: watched for `watch` seconds, only a live one moves its expiry on."""
        before = await self._client.zscore(self._key, self.node_id)
        if before is None:
            return False
        await asyncio.sleep(watch)
        after = await self._client.zscore(self._key, self.node_id)
        return after is not None and after > before

    async def nodes(self) -> list[str]:
        return [_text(n) for n in await self._client.zrange(self._key, 0, -1)]
