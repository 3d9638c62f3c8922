"""A node paused (or cut off from Redis) for longer than `lease_ttl` in the middle of a send.

The pause is made deterministic with a proxy holding Redis's answers back: the node's claim on a
reply's key is carried out by Redis, but the node hears of it only after the claim ran out and
another node claimed, sent and recorded the same reply, as a node SIGSTOPped right after asking
for the claim does.
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

import redis.asyncio as aioredis

from talkbridge.cluster import scripts
from talkbridge.cluster.claims import SendClaims
from talkbridge.cluster.keys import ClusterKeys
from talkbridge.message import SendResult
from tests.cluster.conftest import TTL, Cluster, wait_until
from tests.peers.redis import StallingProxy


async def test_a_send_whose_claim_ran_out_while_its_node_was_paused_does_not_go_out(
    cluster: Cluster,
) -> None:
    port = urlsplit(cluster.url).port
    assert port is not None
    keys = ClusterKeys(cluster.prefix)
    claim = keys.send_claim("tg", "reply:m1")
    direct = aioredis.Redis.from_url(cluster.url, decode_responses=True)
    calls: list[str] = []

    def platform(node: str) -> SendResult:
        calls.append(node)
        return SendResult(message_ids=(f"out-{node}",))

    async def paused_call() -> SendResult:
        return platform("paused")

    async def other_call() -> SendResult:
        return platform("other")

    async with StallingProxy(port) as proxy:
        paused = aioredis.Redis.from_url(proxy.url, decode_responses=True)
        try:
            await direct.script_load(scripts.CLAIM_SEND)  # one round trip for the claim
            await paused.ping()
            proxy.hold()
            send = asyncio.create_task(
                SendClaims(paused, keys, TTL).send_once("tg", "reply:m1", paused_call)
            )
            await wait_until(lambda: direct.exists(claim))  # claimed; the node hears it later
            other = SendClaims(direct, keys, TTL)
            sent = await asyncio.wait_for(other.send_once("tg", "reply:m1", other_call), 10)
            assert sent.message_ids == ("out-other",)  # once the paused node's claim ran out
            proxy.release()
            late = await asyncio.wait_for(send, 10)
        finally:
            proxy.release()
            await paused.aclose()
            await direct.aclose()
    assert calls == ["other"]  # the platform was called once
    assert late.message_ids == ("out-other",)  # the paused node answered from the record
