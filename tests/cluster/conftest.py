"""Nodes of one distributed bridge in one test process: Bridges on one Redis key prefix.

Every test gets its own prefix (and its keys are deleted afterwards), so tests can share the
redis-server on 6379 or the one `tests.peers.redis` starts. Lease TTLs are short so takeovers
happen within a test's time, never by sleeping: tests wait on conditions with a timeout.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

import hypothesis  # noqa: F401 - see below
import pytest

from talkbridge.bridge import Bridge
from talkbridge.config import BridgeConfig, ConnectionConfig
from talkbridge.connectors.base import ConnectionStatus
from tests.conftest import require
from tests.peers.redis import redis_url
from tests.support.talk_connector import TalkConnector

# Imported early on purpose: when only these tests run, hypothesis's pytest plugin imports it at
# session end, and CPython 3.11.7 then fails in ast.parse ("AST constructor recursion depth
# mismatch", a CPython bug fixed in later releases) after the test runs with leases. The same
# code outside pytest parses fine after any number of node starts and stops.

TTL = 0.6
"""Lease TTL of the test nodes (seconds): renewals every 0.2 s, takeovers within ~1 s."""


class LeasedConnector(TalkConnector):
    """A `Talk` with a transport, so in distributed mode it runs on one node at a time."""

    def __init__(self, connection_id: str = "test") -> None:
        super().__init__(connection_id)
        self.running = asyncio.Event()
        self.stopped = asyncio.Event()
        self.runs = 0

    async def run(self, status: ConnectionStatus) -> None:
        self.runs += 1
        self.stopped.clear()
        self.running.set()
        status.up()
        try:
            await asyncio.Future()
        finally:
            self.running.clear()
            self.stopped.set()


async def wait_until(
    condition: Callable[[], bool | Awaitable[bool]], timeout: float = 10.0
) -> None:
    """For state with no event to await (shard balance, lease expiry or entries pending on
    the server): check every 10 ms; `timeout` is only the safety net."""
    async with asyncio.timeout(timeout):
        while not await _holds(condition()):  # noqa: ASYNC110 - nothing signals these changes
            await asyncio.sleep(0.01)


async def _holds(verdict: bool | Awaitable[bool]) -> bool:
    return verdict if isinstance(verdict, bool) else await verdict


@dataclass
class Cluster:
    """Makes nodes (Bridges) sharing one Redis prefix."""

    url: str
    prefix: str
    stack: AsyncExitStack
    nodes: list[Bridge] = field(default_factory=list)

    def config(self, **extra: Any) -> BridgeConfig:
        cluster = {"lease_ttl": TTL, "shards": 4, "claim_idle": 5.0, "send_timeout": 5.0}
        cluster.update(extra.pop("cluster", {}))
        return BridgeConfig.model_validate(
            {"store": self.url, "store_prefix": self.prefix, "cluster": cluster, **extra}
        )

    async def node(
        self,
        node_id: str,
        *,
        connectors: tuple[str, ...] = ("test",),
        start: bool = True,
        prepare: Callable[[Bridge], Awaitable[None] | None] | None = None,
        **options: Any,
    ) -> Bridge:
        with_webchat = options.pop("with_webchat", False)
        bridge = Bridge(
            self.config(**options.pop("config", {})),
            with_webchat=with_webchat,
            node_id=node_id,
            **options,
        )
        for cid in connectors:
            bridge.registry.add(
                LeasedConnector(cid), ConnectionConfig(id=cid, channel="telegram", trusted=["*"])
            )
        if prepare is not None:
            result = prepare(bridge)
            if result is not None:
                await result
        if start:
            await bridge.start()
            self.stack.push_async_callback(bridge.stop)
        self.nodes.append(bridge)
        return bridge


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    url = redis_url()
    require(url is not None, "no redis-server answers on 127.0.0.1:6379 and none is installed")
    assert url is not None
    from redis.asyncio import Redis

    from talkbridge.store.redis import RedisKeys

    prefix = f"tbtest-{uuid.uuid4().hex[:12]}"
    async with AsyncExitStack() as stack:
        yield Cluster(url, prefix, stack)
    client = Redis.from_url(url)
    try:
        keys = [k async for k in client.scan_iter(match=RedisKeys(prefix).pattern(), count=500)]
        if keys:
            await client.delete(*keys)
    finally:
        await client.aclose()


def connector(bridge: Bridge, cid: str = "test") -> LeasedConnector:
    found = bridge.registry.get(cid)
    assert isinstance(found, LeasedConnector)
    return found


def owner(nodes: list[Bridge], cid: str = "test") -> Bridge | None:
    owners = [n for n in nodes if n.cluster is not None and cid in n.cluster.owned]
    assert len(owners) <= 1, "two nodes own one connection"
    return owners[0] if owners else None
