"""Distributed mode: a reply taken back by two nodes at once is deleted once."""

from __future__ import annotations

import asyncio

from talkbridge import replies
from talkbridge.bridge import Bridge
from talkbridge.config import ConnectionConfig
from talkbridge.connectors.base import BaseConnector, ConnectionStatus, ConnectorContext
from talkbridge.message import OutboundMessage, SendResult
from tests.cluster.conftest import Cluster


class _Platform:
    """What both nodes' connectors delete on: one platform, counting each delete call."""

    def __init__(self) -> None:
        self.deletes: list[str] = []
        self.done = asyncio.Event()

    async def delete(self, thread_id: str, message_id: str) -> None:
        self.deletes.append(message_id)
        self.done.set()


class _Deleting(BaseConnector):
    """A leased connection (it has a transport) whose messages are deleted on `platform`."""

    channel = "telegram"
    reports_deletions = True

    def __init__(self, context: ConnectorContext, platform: _Platform) -> None:
        super().__init__("test", context)
        self.provide("delete", platform)

    async def run(self, status: ConnectionStatus) -> None:
        status.up()
        await asyncio.Future()

    async def send(self, message: OutboundMessage) -> SendResult:
        raise AssertionError("not sent to")


async def test_a_reply_two_nodes_take_back_at_once_is_deleted_once(cluster: Cluster) -> None:
    """The same deletion heard by two nodes (a Slack event retried onto the connection's new
    owner, or the owner hearing it while another node records the reply): both found the
    reply on record and its tombstone not yet marked taken back (the check and the mark are
    two steps, and the lock around them is per process), and both deleted it."""
    platform = _Platform()
    connectors: list[_Deleting] = []

    def add(bridge: Bridge) -> None:
        connectors.append(_Deleting(bridge.context, platform))
        bridge.registry.add(connectors[-1], ConnectionConfig(id="test", channel="telegram"))

    a = await cluster.node("a", connectors=(), prepare=add)
    b = await cluster.node("b", connectors=(), prepare=add)
    await replies.remember(a.store, "test", "q1", ["r1"])
    taken = await asyncio.gather(*(c.withdraw_reply("t", "q1") for c in connectors))
    assert taken == [True, True]  # both took it on
    await asyncio.wait_for(platform.done.wait(), 10)
    for node in (a, b):
        await node.router.outbound("test").join()
    assert platform.deletes == ["r1"]
