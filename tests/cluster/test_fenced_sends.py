"""Sends queued on a connection's owner when it loses the connection go out once: the old owner
checks its lease right before each platform call, the new owner sends what it took over."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from talkbridge.message import OutboundMessage
from tests.cluster.conftest import Cluster, connector, owner, wait_until


@pytest.mark.parametrize("asked_by", ["other-node", "owner-itself"])
async def test_a_keyless_send_queued_on_the_old_owner_goes_out_once_after_the_connection_moves(
    cluster: Cluster, asked_by: str
) -> None:
    """Node a owns the connection; one send is on the wire, a keyless one (a hook's) waits
    behind it in a's queue, when a's lease runs out and b takes the connection over. Before,
    a sent the keyless one when its turn came, and b, which took over the requests a had taken,
    sent it too. Now a checks its lease right before the call: a request taken from the bus is
    left to b, which sends it; a send made on a is asked of b."""
    a = await cluster.node("a")
    await wait_until(lambda: owner([a]) is a)
    b = await cluster.node("b")
    assert a.cluster is not None and b.cluster is not None
    on_the_wire = asyncio.Event()
    answer = asyncio.Event()

    async def slow_platform() -> None:
        on_the_wire.set()
        await answer.wait()

    connector(a).script.append(slow_platform)  # a's first send waits on the wire
    first = OutboundMessage(thread_id="t1", text="one", idempotency_key="k1")
    second = OutboundMessage(thread_id="t1", text="two")  # a hook's send: no key
    sender = b if asked_by == "other-node" else a
    sends = [asyncio.create_task(sender.router.send("test", m)) for m in (first, second)]
    await on_the_wire.wait()
    client = a.cluster.client
    stream = a.cluster.keys.bus_out("test")
    if sender is b:  # "two" waits behind "one" on a
        await wait_until(lambda: _pending(client, stream, "a", 2))
    else:
        await asyncio.sleep(0)  # one turn of the loop: "two" reaches a's queue

    # a's lease runs out (a stall, a pause) and b takes the connection and what a took of it
    await client.set(a.cluster.keys.lease("conn", "test"), "b", px=60_000)
    await wait_until(lambda: "test" in b.cluster.owned if b.cluster else False)
    if sender is b:
        await wait_until(lambda: _pending(client, stream, "b", 2))
    answer.set()  # a's call returns; "two" is next in a's queue

    results = await asyncio.gather(*sends)
    for node in (a, b):
        await node.router.join()
    assert connector(a).texts() == ["one"]
    assert connector(b).texts() == ["two"]  # the new owner sent what a had not
    assert [len(r.message_ids) for r in results] == [1, 1]


async def _pending(client: aioredis.Redis, stream: str, consumer: str, count: int) -> bool:
    found = await client.xpending(stream, "owner")
    return any(c["name"] == consumer and c["pending"] == count for c in found["consumers"])
