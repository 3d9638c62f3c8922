"""Leases on a real Redis, and connection ownership in the registry that they guard."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
import redis.asyncio as aioredis

from talkbridge.bridge import Bridge
from talkbridge.cluster import Lease
from talkbridge.cluster.inbound import shard_of
from talkbridge.config import ConnectionConfig
from talkbridge.connectors.base import ConnectionStatus
from talkbridge.errors import ConfigError
from talkbridge.registry import ConnectionState
from tests.cluster.conftest import TTL, Cluster, LeasedConnector, connector, owner, wait_until
from tests.support.agents import GatedAgent
from tests.support.talk_connector import make_message


async def test_one_holder_renews_and_only_the_holder_can_renew_or_release(
    cluster: Cluster,
) -> None:
    client = aioredis.Redis.from_url(cluster.url, decode_responses=True)
    key = f"{cluster.prefix}:lease:conn:x"
    a, b = Lease(client, key, "a", TTL), Lease(client, key, "b", TTL)
    try:
        first = await a.acquire()
        assert first.held and first.holder == "a"
        refused = await b.acquire()
        assert not refused.held and refused.holder == "a" and 0 < refused.ttl_left <= TTL
        assert not await b.renew() and not await b.release()
        assert await client.get(key) == "a"
        assert await a.renew()
        assert await client.pttl(key) > TTL * 1000 * 0.5
        assert await a.release()
        assert (await b.acquire()).held
    finally:
        await client.delete(key)
        await client.aclose()


async def test_another_node_takes_a_lease_over_once_it_runs_out(cluster: Cluster) -> None:
    client = aioredis.Redis.from_url(cluster.url, decode_responses=True)
    key = f"{cluster.prefix}:lease:conn:y"
    a, b = Lease(client, key, "a", TTL), Lease(client, key, "b", TTL)
    try:
        assert (await a.acquire()).held  # and then a "dies": no renewals
        state = await b.acquire()
        assert not state.held
        while not state.held:  # waits as a standby node does: until it runs out
            await asyncio.sleep(b.retry_delay(state))
            state = await b.acquire()
        assert await client.get(key) == "b"
        assert not await a.renew()  # the old holder learns it lost the lease
    finally:
        await client.delete(key)
        await client.aclose()


async def test_the_connection_runs_on_one_node_and_moves_when_its_node_stops(
    cluster: Cluster,
) -> None:
    a = await cluster.node("a")
    await wait_until(lambda: owner([a]) is a)
    b = await cluster.node("b")
    await connector(a).running.wait()
    await wait_until(lambda: b.registry.health("test").state is ConnectionState.STANDBY)
    assert b.registry.health("test").as_dict()["owner"] == "a"
    assert connector(b).runs == 0
    await a.stop()  # releases the lease: b need not wait for it to run out
    await asyncio.wait_for(connector(b).running.wait(), 5)
    assert owner([a, b]) is b and b.registry.owned() == ["test"]


async def test_a_lost_renewal_stops_the_transport_it_guarded(cluster: Cluster) -> None:
    a = await cluster.node("a")
    await asyncio.wait_for(connector(a).running.wait(), 5)
    assert a.cluster is not None
    client = aioredis.Redis.from_url(cluster.url, decode_responses=True)
    try:
        # another node took the lease (as after a long pause of this one)
        await client.set(a.cluster.keys.lease("conn", "test"), "intruder", px=60_000)
        await asyncio.wait_for(connector(a).stopped.wait(), 5)
        await wait_until(lambda: a.registry.health("test").state is ConnectionState.STANDBY)
        health = a.registry.health("test").as_dict()
        assert health["owner"] == "intruder" and a.registry.owned() == []
        assert not a.cluster.is_remote("webchat")
        assert a.cluster.is_remote("test")  # its sends now go to the new owner
    finally:
        await client.delete(a.cluster.keys.lease("conn", "test"))
        await client.aclose()


async def test_a_second_process_with_a_running_nodes_id_refuses_to_start(cluster: Cluster) -> None:
    # Both would own the same connections and poll the platform against each other.
    await cluster.node("a")
    twin = await cluster.node("a", start=False)
    with pytest.raises(ConfigError, match="another running node has the node id 'a'"):
        await twin.start()
    await twin.stop()


async def test_a_node_with_another_shard_count_than_the_running_ones_refuses_to_start(
    cluster: Cluster,
) -> None:
    # Its messages would go onto shards the others never read (and theirs onto shards it
    # never takes): unanswered, and out of order, for as long as it runs.
    a = await cluster.node("a")  # 4 shards
    odd = await cluster.node("b", start=False, config={"cluster": {"shards": 8}})
    with pytest.raises(ConfigError, match="into 4 shards, this node's config says 8"):
        await odd.start()
    await odd.stop()
    assert a.cluster is not None and await a.cluster.membership.nodes() == ["a"]
    # A FLUSHDB takes the recorded count: the running node's next beat says it again.
    client = a.cluster.client
    await client.delete(a.cluster.keys.shard_count())
    await a.cluster.membership.beat()  # as its heartbeat loop does, a third of the TTL on
    assert await client.get(a.cluster.keys.shard_count()) is not None
    odd = await cluster.node("b", start=False, config={"cluster": {"shards": 8}})
    with pytest.raises(ConfigError, match="into 4 shards"):
        await odd.start()
    await odd.stop()
    # With every node stopped, the count may change: the next node to start sets it.
    await a.stop()
    changed = await cluster.node("c", config={"cluster": {"shards": 8}})
    assert changed.cluster is not None
    await wait_until(lambda: changed.cluster is not None and len(changed.cluster.inbound.held) == 8)


async def test_messages_left_on_shards_a_lowered_count_drops_are_answered(
    cluster: Cluster,
) -> None:
    # Every node stopped with messages still waiting on shard 5 of 8; they start again with
    # `shards: 4`. No node read shards 4-7 any more: those messages were never answered.
    agent = GatedAgent()
    a = await cluster.node(
        "a",
        config={"cluster": {"shards": 8}},
        prepare=lambda bridge: bridge.runner.add_agent(agent, "echo"),
    )
    assert a.cluster is not None
    inbound = a.cluster.inbound
    await wait_until(lambda: len(inbound.held) == 8)
    thread = next(f"t{i}" for i in range(100) if shard_of(f"test\x1ft{i}", 8) >= 4)
    for n in (1, 2):
        await connector(a).inject(make_message(f"q{n}", thread_id=thread, message_id=f"m{n}"))
    await asyncio.wait_for(agent.started["q1"].wait(), 10)
    await a.stop(drain_timeout=0)  # cut off: both wait on their shard for the next start
    old = a.cluster.keys.bus_in(shard_of(f"test\x1f{thread}", 8))
    client = aioredis.Redis.from_url(cluster.url, decode_responses=True)
    try:
        assert await client.xlen(old) == 2
        b = await cluster.node("b", config={"cluster": {"shards": 4}})
        sent = await connector(b).wait_sent(2)
        assert [s.message.text for s in sent] == ["q1", "q2"]  # in order
        assert await client.exists(old) == 0
    finally:
        await client.aclose()


async def test_a_raised_shard_count_keeps_each_thread_in_order(cluster: Cluster) -> None:
    # Every node stopped with q1 and q2 of a thread waiting on its shard of 4; they start
    # again with `shards: 8`, which maps the thread to another shard, held by another node.
    # q3, sent after the change, went there and was answered at once, before q1 and q2.
    first = GatedAgent()
    a = await cluster.node("a", prepare=lambda bridge: bridge.runner.add_agent(first, "echo"))
    thread = next(
        f"t{i}" for i in range(100) if shard_of(f"test\x1ft{i}", 4) != shard_of(f"test\x1ft{i}", 8)
    )
    old, new = shard_of(f"test\x1f{thread}", 4), shard_of(f"test\x1f{thread}", 8)
    for n in (1, 2):
        await connector(a).inject(make_message(f"q{n}", thread_id=thread, message_id=f"m{n}"))
    await asyncio.wait_for(first.started["q1"].wait(), 10)
    await a.stop(drain_timeout=0)  # cut off: both wait on their shard for the next start
    assert a.cluster is not None
    client = aioredis.Redis.from_url(cluster.url, decode_responses=True)
    agent = GatedAgent()
    agent.gates["q2"].set()
    agent.gates["q3"].set()
    eight = {"cluster": {"shards": 8}}

    def prepare(bridge: Bridge) -> None:
        bridge.runner.add_agent(agent, "echo")

    try:
        # The thread's new shard goes to c: b takes every other one (its old one too).
        await client.set(a.cluster.keys.lease("shard", str(new)), "c", px=60_000)
        b = await cluster.node("b", config=eight, prepare=prepare)
        assert b.cluster is not None
        await wait_until(lambda: b.cluster is not None and old in b.cluster.inbound.held)
        c = await cluster.node("c", config=eight, prepare=prepare)
        assert c.cluster is not None
        await wait_until(lambda: c.cluster is not None and new in c.cluster.inbound.held)
        await connector(b).inject(make_message("q3", thread_id=thread, message_id="m3"))
        await asyncio.wait_for(agent.started["q1"].wait(), 10)
        stream = a.cluster.keys.bus_in(new)

        async def q3_read() -> bool:  # by the holder of its shard, c (its turn may be over)
            (group,) = await client.xinfo_groups(stream)
            last = (await client.xinfo_stream(stream))["last-generated-id"]
            return bool(group["last-delivered-id"] == last)

        await wait_until(q3_read)
        agent.gates["q1"].set()
        first_answer = (await connector(b).wait_sent(1))[0]
        assert first_answer.message.text == "answer to q1"  # not q3, on the thread's new shard
        await connector(b).wait_sent(3)
        assert connector(b).texts() == ["answer to q1", "answer to q2", "answer to q3"]
    finally:
        for gate in agent.gates.values():
            gate.set()
        await client.aclose()


def _watched_transports() -> tuple[list[LeasedConnector], list[str], Callable[[Bridge], None]]:
    """The `test` connection's transport on each node `prepare` sets up (`running`, in node
    order), and `beside`: a line for each start while another node's transport ran."""
    running: list[LeasedConnector] = []
    beside: list[str] = []

    class Watched(LeasedConnector):
        async def run(self, status: ConnectionStatus) -> None:
            if any(c.running.is_set() for c in running if c is not self):
                beside.append("two nodes ran the connection at once")
            await super().run(status)

    def prepare(bridge: Bridge) -> None:
        watched = Watched()
        running.append(watched)
        bridge.registry.add(watched, ConnectionConfig(id="test", channel="telegram"))

    return running, beside, prepare


async def test_after_redis_is_emptied_no_node_runs_a_connection_beside_its_old_owner(
    cluster: Cluster,
) -> None:
    # A FLUSHDB takes the leases with everything else; their holders hear so at their next
    # renewal, up to a third of the TTL on. A standby node that tried meanwhile took the
    # lease and ran the transport beside its owner: two pollers of one bot for that long.
    running, beside, prepare = _watched_transports()

    a = await cluster.node("a", connectors=(), prepare=prepare)
    b = await cluster.node("b", connectors=(), prepare=prepare)
    assert a.cluster is not None and b.cluster is not None
    await wait_until(lambda: owner([a, b]) is not None)  # either: the first lease waits a TTL
    if owner([a, b]) is b:
        a, b = b, a
        running.reverse()
    assert a.cluster is not None and b.cluster is not None
    client = aioredis.Redis.from_url(cluster.url, decode_responses=True)
    lease = a.cluster.keys.lease("conn", "test")
    try:

        async def just_renewed() -> bool:  # its next renewal is a third of the TTL away
            return bool(await client.pttl(lease) >= TTL * 1000 * 0.9)

        await wait_until(just_renewed)
        keys = [k async for k in client.scan_iter(match=a.cluster.keys.pattern(), count=500)]
        await client.delete(*keys)  # as FLUSHDB does
        assert not (await b.cluster.lease("conn", "test").acquire()).held  # a still runs it
        await wait_until(lambda: not running[0].running.is_set())  # a heard, and stopped
        await wait_until(lambda: any(c.running.is_set() for c in running))  # taken again
        assert beside == []
        assert owner([a, b]) is not None
    finally:
        await client.aclose()


async def test_a_node_started_after_redis_was_emptied_does_not_run_a_connection_beside_its_owner(
    cluster: Cluster,
) -> None:
    """As above, but the node that could take the lease starts after the emptying, before any
    running node tried a lease (so before any made the fence): before, it found Redis as a new
    deployment's, took the lease at once and ran the transport beside its old owner."""
    running, beside, prepare = _watched_transports()

    a = await cluster.node("a", connectors=(), prepare=prepare)
    assert a.cluster is not None
    await wait_until(lambda: owner([a]) is a)
    client = aioredis.Redis.from_url(cluster.url, decode_responses=True)
    lease = a.cluster.keys.lease("conn", "test")
    try:

        async def just_renewed() -> bool:  # its next renewal is a third of the TTL away
            return bool(await client.pttl(lease) >= TTL * 1000 * 0.9)

        await wait_until(just_renewed)
        keys = [k async for k in client.scan_iter(match=a.cluster.keys.pattern(), count=500)]
        await client.delete(*keys)  # as FLUSHDB does
        b = await cluster.node("b", connectors=(), prepare=prepare)
        assert b.cluster is not None
        assert not (await b.cluster.lease("conn", "test").acquire()).held  # a still runs it
        await wait_until(lambda: not running[0].running.is_set())  # a heard, and stopped
        await wait_until(lambda: any(c.running.is_set() for c in running))  # taken again
        assert beside == []
    finally:
        await client.aclose()


async def test_a_redis_error_while_taking_a_connection_over_is_retried_not_fatal(
    cluster: Cluster,
) -> None:
    # Taking a connection over reads its send requests' stream; a Redis error there (here:
    # the stream's key holds another type) ended the connection's task for good: never run
    # on this node again, "starting" in /healthz, its lease left to run out.
    client = aioredis.Redis.from_url(cluster.url, decode_responses=True)
    requests = f"{cluster.prefix}:bus:out:test"
    try:
        await client.set(requests, "not a stream")
        a = await cluster.node("a")
        await wait_until(lambda: a.registry.health("test").state is ConnectionState.DEGRADED)
        assert "WRONGTYPE" in (a.registry.health("test").last_error or "")
        assert a.registry.owned() == []
        await client.delete(requests)
        await asyncio.wait_for(connector(a).running.wait(), 10)
        assert owner([a]) is a
    finally:
        await client.aclose()


async def test_a_node_restarted_after_a_crash_starts_under_its_own_id(cluster: Cluster) -> None:
    crashed = await cluster.node("a", start=False)
    assert crashed.cluster is not None
    await crashed.cluster.membership.beat()  # the entry a SIGKILLed node leaves behind
    restarted = await cluster.node("a")  # no one renews that entry: not a twin
    assert restarted.cluster is not None and "a" in await restarted.cluster.membership.nodes()
    await crashed.stop()
