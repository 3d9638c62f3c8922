"""Distributed mode: several nodes on one Redis (`store: redis://…`) act as one bridge.

- a connection's transport runs on the one node holding its lease (`lease.py`, the registry);
- inbound messages go onto shard streams read by the nodes holding the shards (`inbound.py`);
- sends go to the node that owns the destination connection (`outbound.py`);
- webchat frames reach every node's sockets of their session (`fanout.py`);
- a keyed send calls its platform once, whichever nodes send it (`claims.py`).

`Cluster` ties these to one node id and one Redis client; the Bridge makes one when its store is
a `RedisStore`. Every key comes from `ClusterKeys`, the store's key builder with the same prefix.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from talkbridge.cancellation import raise_if_cancelling
from talkbridge.cluster.claims import SendClaims
from talkbridge.cluster.fanout import WebchatFanout
from talkbridge.cluster.inbound import InboundBus
from talkbridge.cluster.keys import ClusterKeys
from talkbridge.cluster.lease import Lease, LeaseState, Membership
from talkbridge.cluster.outbound import OutboundBus
from talkbridge.config import ClusterConfig
from talkbridge.errors import ConfigError, ConnectionMovedError, StoreError, TransientError
from talkbridge.store.redis import RedisStore, reconnecting

log = logging.getLogger("talkbridge.cluster")

MAX_CONNECTIONS = 64
"""Per node: four are held by blocking reads (inbound, sends, replies, webchat fan-out)."""


def default_node_id() -> str:
    """hostname-pid: unique per process, readable in logs and /healthz."""
    return f"{socket.gethostname()}-{os.getpid()}"


class Cluster:
    def __init__(
        self, store: RedisStore, config: ClusterConfig | None = None, node_id: str | None = None
    ) -> None:
        self.config = config or ClusterConfig()
        self.node_id = node_id or default_node_id()
        self.keys = ClusterKeys(store.keys.prefix)
        self._url = store.url
        self._store = store
        # A blocking pool: a burst of acknowledgements waits for a free connection instead of
        # failing with "Too many connections" (the plain pool's behaviour at its limit).
        pool = aioredis.BlockingConnectionPool.from_url(
            store.url,
            max_connections=MAX_CONNECTIONS,
            timeout=30,
            decode_responses=True,
            **reconnecting(),
        )
        self.client: aioredis.Redis = aioredis.Redis(connection_pool=pool)
        self.membership = Membership(
            self.client, self.keys, self.node_id, self.config.lease_ttl, self.config.shards
        )
        self.inbound = InboundBus(
            self.client,
            self.keys,
            self.membership,
            self.config,
            note_connection=store.note_connection,
        )
        self.outbound = OutboundBus(
            self.client,
            self.keys,
            self.node_id,
            timeout=self.config.send_timeout,
            block_ms=self.inbound.block_ms,
        )
        self.fanout = WebchatFanout(self.client, self.keys, self.node_id)
        self.claims = SendClaims(self.client, self.keys, self.config.lease_ttl)
        self.leased: set[str] = set()
        """Connections whose transport runs on one node at a time."""
        self.owned: set[str] = set()
        """Of those, the ones this node runs now."""
        self._fences: dict[str, Lease] = {}

    def lease(self, kind: str, name: str) -> Lease:
        return Lease(
            self.client,
            self.keys.lease(kind, name),
            self.node_id,
            self.config.lease_ttl,
            fence=self.keys.fence(),
        )

    async def fence(self, connection_id: str) -> None:
        """Right before the platform call of a send without idempotency key (a keyed one has
        its claim): raise `ConnectionMovedError` unless this node surely holds the lease of
        the connection, when it runs on one node at a time (renewed by the check). So a node
        that lost it, whether it has heard so yet or not, never sends a request the new owner
        took over from it and sends. A Redis failure is a passing one: the send is retried."""
        if connection_id not in self.leased:
            return
        lease = self._fences.get(connection_id)
        if lease is None:
            lease = self._fences[connection_id] = self.lease("conn", connection_id)
        try:
            held = await lease.confirm()
        except (RedisError, OSError) as exc:
            raise_if_cancelling()
            raise TransientError(f"cannot confirm the connection's lease: {exc}") from exc
        if not held:
            raise ConnectionMovedError(connection_id)

    def is_remote(self, connection_id: str) -> bool:
        """True when sends to this connection must go through its owner on another node."""
        return connection_id in self.leased and connection_id not in self.owned

    async def start(self) -> None:
        """Connect, say this node is alive and listen for send replies (before any traffic)."""
        try:
            # Longer than the interval live nodes renew at (a third of the TTL).
            if await self.membership.taken_by_another(self.config.lease_ttl / 2):
                await self.client.aclose()
                raise ConfigError(
                    f"another running node has the node id {self.node_id!r}: give each node "
                    "its own --node-id (or TALKBRIDGE_NODE_ID), or stop the other one"
                )
            # The lease fence is not made here: a node that starts after Redis was emptied
            # cannot tell it from a new deployment's, and would let itself take leases at once
            # while their old holders have yet to hear they are gone. The first lease tried
            # makes it (`scripts.ACQUIRE`), so no lease is taken for a TTL after that: once per
            # deployment, and again after each emptying.
            shards = self.config.shards
            layout = await self.inbound.shard_layout()
            theirs = await self.membership.join()
            if theirs is not None:
                await self.client.aclose()
                raise ConfigError(
                    f"cluster.shards: the running nodes split the inbound bus into {theirs} "
                    f"shards, this node's config says {shards}: messages would wait on shards "
                    f"no node reads. Give every node the same value (change it only with every "
                    f"node stopped)"
                )
            await self.inbound.sort_shards(*layout)
            if (warning := await self._store.persistence_warning()) is not None:
                log.warning("distributed mode: %s", warning)
            await self.outbound.start()
        except (RedisError, OSError) as exc:
            await self.client.aclose()
            raise StoreError(f"distributed mode cannot use redis: {exc}") from exc

    async def acquired(self, connection_id: str) -> None:
        self.owned.add(connection_id)
        await self.outbound.own(connection_id)

    def cannot_run(self, connection_id: str, reason: str) -> None:
        """The connection could not be started on this node (`reason`, scrubbed): its messages
        cannot be answered here, so this node leaves the inbound shards to the nodes that run
        every connection, at its next beat, with what of them it had to leave unanswered."""
        self.membership.cannot_run.add(connection_id)
        log.warning(
            "%s could not start on this node (%s): this node hands its inbound shards to "
            "nodes that started every connection, which answer the messages it could not",
            connection_id,
            reason,
        )

    def lost(self, connection_id: str) -> None:
        self.owned.discard(connection_id)
        self.outbound.disown(connection_id)

    async def quiesce(self) -> None:
        """Take no new work (inbound entries, send requests); what was taken still finishes."""
        await self.inbound.stop_reading()
        await self.outbound.stop_serving()

    async def stop(self) -> None:
        await self.inbound.stop()
        await self.outbound.stop()
        await self.fanout.stop()
        with contextlib.suppress(RedisError, OSError):
            await self.membership.leave()
        await self.client.aclose()

    def describe(self) -> dict[str, Any]:
        """What /healthz shows about this node."""
        return {
            "node_id": self.node_id,
            "live_nodes": self.membership.live,
            "owns": sorted(self.owned),
            "shards": self.inbound.held,
        }


__all__ = [
    "Cluster",
    "ClusterKeys",
    "Lease",
    "LeaseState",
    "Membership",
    "default_node_id",
]
