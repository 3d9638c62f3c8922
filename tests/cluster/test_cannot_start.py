"""A node that cannot start one of its connections (its SDK fails to import) leaves the messages
of that connection it took to a node that runs it, instead of sitting on them until a restart."""

from __future__ import annotations

import logging

import pytest

from talkbridge import connectors
from talkbridge.bridge import Bridge
from talkbridge.config import ConnectionConfig, parse_config
from talkbridge.connectors import ChannelSpec
from tests.cluster.conftest import TTL, Cluster, LeasedConnector, connector, owner, wait_until
from tests.support.talk_connector import make_message

CLUSTER = {"lease_ttl": TTL, "shards": 1, "claim_idle": 1.0}


@pytest.fixture(autouse=True)
def _plugged(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plug-in channel (as `register_channel` adds one) whose SDK is not there."""
    spec = ChannelSpec("plugged", "talkbridge.config:ConnectionConfig", "plugged_sdk.t:create")
    monkeypatch.setitem(connectors._CHANNELS, "plugged", spec)


async def _node_missing_an_sdk(cluster: Cluster, *extra: str) -> Bridge:
    """Node a, started as `talkbridge run` starts (connection "test" still starting; its SDK
    is imported by `start_connections`); `extra` connections are built and start at once."""
    config, secrets = parse_config(
        {
            "store": cluster.url,
            "store_prefix": cluster.prefix,
            "cluster": CLUSTER,
            "connections": [{"id": "test", "channel": "plugged", "trusted": ["*"]}],
        }
    )
    node = Bridge(config, secrets=secrets, with_webchat=False, node_id="a")
    for cid in extra:
        node.registry.add(
            LeasedConnector(cid), ConnectionConfig(id=cid, channel="telegram", trusted=["*"])
        )
    await node.start(connect=False)
    cluster.stack.push_async_callback(node.stop)
    await wait_until(lambda: node.cluster is not None and node.cluster.inbound.held == [0])
    return node


async def test_messages_taken_by_a_node_whose_connection_cannot_start_are_answered_by_another(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    a = await _node_missing_an_sdk(cluster)
    b = await cluster.node("b", config={"cluster": CLUSTER})
    await wait_until(lambda: owner([a, b]) is b)
    assert a.cluster is not None and b.cluster is not None
    assert b.cluster.inbound.held == []  # a keeps the only shard

    stream = a.cluster.keys.bus_in(0)
    await connector(b).inject(make_message("hi", message_id="m1"))
    # a took it; it waits for its connection, still starting there
    await wait_until(lambda: _pending_of(a, stream, "a"))
    caplog.set_level(logging.INFO, logger="talkbridge")
    await a.start_connections()  # plugged_sdk is missing: "test" cannot start on a

    sent = await connector(b).wait_sent(1, timeout=10)
    assert [(s.message.reply_to, s.message.text) for s in sent] == [("m1", "hi")]
    assert a.cluster.inbound.held == [] and b.cluster.inbound.held == [0]
    assert "test could not start on this node" in caplog.text
    assert "shard 0: took over 1 unacknowledged message(s)" in caplog.text
    for node in (a, b):
        await node.router.join()
    assert len(connector(b).sent) == 1
    assert await a.cluster.client.xlen(stream) == 0  # answered and acknowledged


async def test_with_no_node_that_runs_every_connection_the_shards_are_still_read(
    cluster: Cluster,
) -> None:
    """Handing them over is only for a node that can answer more: alone, the node that cannot
    start "test" still answers the messages of its other connections."""
    a = await _node_missing_an_sdk(cluster, "other")
    await a.start_connections()
    await wait_until(lambda: owner([a], "other") is a)
    await connector(a, "other").inject(make_message("yo", connection_id="other"))
    sent = await connector(a, "other").wait_sent(1, timeout=10)
    assert [s.message.text for s in sent] == ["yo"]
    assert a.cluster is not None and a.cluster.inbound.held == [0]


async def _pending_of(node: Bridge, stream: str, consumer: str) -> bool:
    assert node.cluster is not None
    found = await node.cluster.client.xpending(stream, "workers")
    return any(c["name"] == consumer and c["pending"] for c in found["consumers"])
