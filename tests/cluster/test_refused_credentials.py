"""A node whose credentials the platform refuses while it runs a connection gives the connection's
lease up, so a node whose credentials work runs it; it takes it again only once its own pass a
check. Real Bridges on real Redis, aiogram against the stand-in Bot API server."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from talkbridge.bridge import Bridge
from talkbridge.config import parse_config
from talkbridge.message import OutboundMessage
from talkbridge.registry import ConnectionState
from tests.cluster.conftest import TTL, Cluster, owner, wait_until
from tests.peers.telegram import TelegramBotAPIPeer, private_text

OLD = "424242:OLD-token_rotated"
NEW = "424242:NEW-token_current"
"""One bot's token before and after a rotation in @BotFather (the old one is refused)."""


@pytest.fixture
async def peer() -> AsyncIterator[TelegramBotAPIPeer]:
    async with TelegramBotAPIPeer([OLD, NEW]) as running:
        yield running


async def _node(cluster: Cluster, peer: TelegramBotAPIPeer, node_id: str, token: str) -> Bridge:
    """A node as `talkbridge run` makes one from its config file (each node has its own)."""
    connection: dict[str, Any] = {
        "id": "tg",
        "channel": "telegram",
        "token": token,
        "api_base": peer.base_url,
        "poll_timeout": 1,
        "trusted": ["*"],
    }
    config, secrets = parse_config(
        {
            "store": cluster.url,
            "store_prefix": cluster.prefix,
            "cluster": {"lease_ttl": TTL, "shards": 1, "send_timeout": 5.0},
            "connections": [connection],
        }
    )
    node = Bridge(config, secrets=secrets, with_webchat=False, node_id=node_id)
    await node.start()
    cluster.stack.push_async_callback(node.stop)
    cluster.nodes.append(node)
    return node


async def test_a_node_whose_token_is_refused_mid_run_hands_the_connection_to_one_whose_works(
    cluster: Cluster, peer: TelegramBotAPIPeer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="talkbridge")
    a = await _node(cluster, peer, "a", OLD)  # its config still has the old token
    await a.registry.wait_for("tg", ConnectionState.UP)
    b = await _node(cluster, peer, "b", NEW)
    await b.registry.wait_for("tg", ConnectionState.STANDBY)

    peer.revoke(OLD)  # the token is rotated while a polls with it
    await wait_until(lambda: owner([a, b], "tg") is b)
    await b.registry.wait_for("tg", ConnectionState.UP)
    health = a.registry.health("tg")
    assert health.state is ConnectionState.DOWN
    assert "401 Unauthorized" in (health.last_error or "")
    assert "tg: down on this node" in caplog.text and "lease released" in caplog.text
    assert OLD not in caplog.text

    # Sends from either node go out through b, with the token that works.
    for node in (a, b):
        await node.router.send("tg", OutboundMessage(thread_id="777", text=f"from {node.node_id}"))
    sent = [(c.token, c.params["text"]) for c in peer.calls_of("sendMessage")]
    assert sent == [(NEW, "from a"), (NEW, "from b")]
    # And messages are answered again (the echo agent, through b).
    peer.push_update(private_text(777, "still there?", message_id=5), token=NEW)
    await peer.wait_for(lambda: len(peer.calls_of("sendMessage")) == 3)

    # a checks its token again later, and while it is refused it never takes the lease back.
    checks = len(peer.calls_of("getMe", answered=401))
    await peer.wait_for(lambda: len(peer.calls_of("getMe", answered=401)) > checks)
    assert owner([a, b], "tg") is b
    assert not peer.calls_of("getUpdates", answered=401)[1:], "a polled with a refused token"


async def test_a_refused_node_takes_the_connection_again_once_its_token_passes_a_check(
    cluster: Cluster, peer: TelegramBotAPIPeer, caplog: pytest.LogCaptureFixture
) -> None:
    """Alone (or with every node refused), the connection is down; it comes back on its own
    once the platform accepts the credentials again, without a restart."""
    caplog.set_level(logging.INFO, logger="talkbridge")
    a = await _node(cluster, peer, "a", OLD)
    await a.registry.wait_for("tg", ConnectionState.UP)
    peer.revoke(OLD)
    await a.registry.wait_for("tg", ConnectionState.DOWN)
    assert a.cluster is not None
    lease = a.cluster.lease("conn", "tg")

    async def released() -> bool:
        return await lease.holder() is None

    await wait_until(released)  # not renewed on and on, as while a ran it
    assert owner([a], "tg") is None

    peer.unrevoke(OLD)
    await a.registry.wait_for("tg", ConnectionState.UP)
    assert owner([a], "tg") is a
    assert "tg: credentials accepted again on this node" in caplog.text
