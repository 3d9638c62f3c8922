"""The cluster's Redis key names, made by the store's own builder (same prefix, same escaping)."""

from __future__ import annotations

from talkbridge.store.redis import RedisKeys


class ClusterKeys(RedisKeys):
    """`RedisKeys` plus the names distributed mode needs; nothing else makes key names."""

    def nodes(self) -> str:
        """Sorted set: node id -> the time (ms) its liveness runs out."""
        return self._key("cluster", "nodes")

    def limited_nodes(self) -> str:
        """Sorted set, as `nodes`: the live nodes that could not start one of their
        connections (they leave the inbound shards to the others while any is alive)."""
        return self._key("cluster", "limited")

    def shard_count(self) -> str:
        """The number of inbound shards the live nodes split the bus into (`cluster.shards`)."""
        return self._key("cluster", "shards")

    def shard_streams(self) -> str:
        """How many inbound shard streams may hold entries: the highest `cluster.shards` used
        since the streams past the current number were last folded into the others."""
        return self._key("cluster", "shard-streams")

    def fence(self) -> str:
        """The time (ms) until which no lease may be taken: made by the first lease tried, a TTL
        on; gone only when Redis was emptied (FLUSHDB) or the deployment's keys deleted, when
        the next lease tried makes it again (see `scripts.ACQUIRE`)."""
        return self._key("cluster", "fence")

    def lease(self, kind: str, name: str) -> str:
        """`lease:conn:<id>` or `lease:shard:<n>`: the node id holding it, with a TTL."""
        return self._key("lease", kind, name)

    def send_claim(self, connection_id: str, idempotency_key: str) -> str:
        """The token of the send calling the platform now for this key, with a TTL."""
        return self._key("sending", connection_id, idempotency_key)

    def bus_in(self, shard: int) -> str:
        return self._key("bus", "in", str(shard))

    def bus_out(self, connection_id: str) -> str:
        return self._key("bus", "out", connection_id)

    def bus_reply(self, node_id: str) -> str:
        return self._key("bus", "reply", node_id)

    def webchat_channel(self, session_id: str) -> str:
        return self._key("webchat", session_id)

    def webchat_pattern(self) -> str:
        """Pub/sub pattern matching every `webchat_channel` of this prefix."""
        return self.pattern()[: -len("*")] + "webchat:*"
