"""The webchat runs on every node: a session's frames reach its sockets on every node."""

from __future__ import annotations

import aiohttp
from websockets.asyncio.client import connect

from talkbridge.bridge import Bridge
from tests.cluster.conftest import Cluster, owner, wait_until
from tests.webchat.conftest import Client

TOKEN = "cluster-token-0123456789"


async def _client(bridge: Bridge, session_id: str | None = None) -> Client:
    client = Client(await connect(f"ws://127.0.0.1:{bridge.webchat.port}/ws", max_size=None))
    client.ready = await client.auth(TOKEN, session_id)
    return client


async def _node(cluster: Cluster, node_id: str) -> Bridge:
    webchat = {"port": 0, "tokens": [TOKEN]}
    bridge = await cluster.node(node_id, with_webchat=True, config={"webchat": webchat})
    await bridge.webchat_url()
    return bridge


async def test_a_message_reaches_every_socket_of_its_session_on_every_node(
    cluster: Cluster,
) -> None:
    a, b = await _node(cluster, "a"), await _node(cluster, "b")
    on_a = await _client(a)
    on_b = await _client(b, on_a.session_id)  # the same session, served by the other node
    assert on_b.ready["new_session"] is False
    try:
        await on_a.send(
            {"type": "send", "thread_id": on_a.thread_id, "client_id": "c1", "text": "hi all"}
        )
        for client in (on_a, on_b):
            user = await client.expect("message", role="user")
            reply = await client.expect("message", role="assistant")
            assert user["text"] == reply["text"] == "hi all"
            assert (user["seq"], reply["seq"]) == (1, 2)
        # and the other way round: a frame made on b reaches the socket on a
        for client in (on_a, on_b):  # the first conversation was named after its message
            renamed = await client.expect("conversation")
            assert renamed["conversation"]["title"] == "hi all"
        await on_b.send({"type": "new_conversation", "title": "second"})
        made = await on_a.expect("conversation")
        assert made["conversation"]["title"] == "second"
        assert (await on_b.expect("conversation"))["conversation"] == made["conversation"]
    finally:
        await on_a.close()
        await on_b.close()


async def test_healthz_shows_the_node_and_what_it_owns(cluster: Cluster) -> None:
    a, b = await _node(cluster, "a"), await _node(cluster, "b")
    await wait_until(lambda: owner([a, b]) is not None)
    holder = owner([a, b])
    assert holder is not None
    # the other node learns who holds it at its next try (the first lease waits a TTL: each
    # node's first try found it fenced, held by nobody)
    await wait_until(lambda: all(n.registry.health("test").owner == holder.node_id for n in (a, b)))
    async with aiohttp.ClientSession() as http:
        for bridge in (a, b):
            async with http.get(f"http://127.0.0.1:{bridge.webchat.port}/healthz") as response:
                health = await response.json()
            assert health["node_id"] == bridge.node_id
            assert health["owns"] == (["test"] if bridge is holder else [])
            assert health["connections"]["webchat"]["state"] == "up"
            assert "owner" not in health["connections"]["webchat"]  # runs on every node
            assert health["connections"]["test"]["owner"] == holder.node_id
            assert TOKEN not in str(health)
