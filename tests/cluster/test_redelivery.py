"""Nothing is lost when a node dies without acknowledging, and nothing is answered twice."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis

from talkbridge.agents.base import Result, TurnContext
from talkbridge.cluster import Cluster as Node
from talkbridge.cluster.inbound import GROUP, Ack
from talkbridge.cluster.keys import ClusterKeys
from talkbridge.cluster.outbound import encode
from talkbridge.config import ClusterConfig
from talkbridge.connectors.base import ConnectorContext
from talkbridge.connectors.telegram.config import TelegramConfig
from talkbridge.connectors.telegram.transport import create as create_telegram
from talkbridge.message import NormalizedMessage, OutboundMessage, SendResult
from talkbridge.store.redis import RedisStore
from tests.cluster.conftest import TTL, Cluster, connector, owner, wait_until
from tests.peers.telegram import TelegramBotAPIPeer
from tests.support.talk_connector import make_message

TOKEN = "123456:TEST-token_abc"

CONFIG = ClusterConfig(lease_ttl=TTL, shards=4, claim_idle=5.0, send_timeout=5.0)


@pytest.fixture
async def store(cluster: Cluster) -> AsyncIterator[RedisStore]:
    store = RedisStore(cluster.url, prefix=cluster.prefix)
    await store.open()
    # A deployment that ran before (so not fenced as a new or emptied one for a TTL): these
    # tests start the nodes' loops by hand and expect the first to take the shards at once.
    client = aioredis.Redis.from_url(cluster.url)
    try:
        await client.set(ClusterKeys(cluster.prefix).fence(), 0)
    finally:
        await client.aclose()
    yield store
    await store.close()


def crash(node: Node) -> None:
    """Stop a node's loops the way SIGKILL would: no acknowledgement, no lease released."""
    for task in (node.inbound._balancer, node.inbound._reader):
        assert task is not None
        task.cancel()


async def test_entries_a_dead_consumer_never_acked_are_redelivered_in_order(
    store: RedisStore,
) -> None:
    a, b = Node(store, CONFIG, "a"), Node(store, CONFIG, "b")
    taken_a: list[tuple[str, bool]] = []
    taken_b: list[tuple[str, bool]] = []

    async def take_a(message: NormalizedMessage, recovered: bool, ack: object) -> None:
        taken_a.append((message.id, recovered))  # and never acknowledges: it "dies" working

    async def take_b(
        message: NormalizedMessage, recovered: bool, ack: asyncio.Future[None]
    ) -> None:
        taken_b.append((message.id, recovered))
        await ack()  # type: ignore[operator]

    a.inbound.set_handler(take_a)  # type: ignore[arg-type]
    b.inbound.set_handler(take_b)  # type: ignore[arg-type]
    await a.start()
    await a.inbound.start()
    assert a.inbound.held == [0, 1, 2, 3]
    messages = [
        make_message(f"{t}:{i}", thread_id=f"t{t}", message_id=f"m{t}-{i}")
        for i in range(3)
        for t in range(4)
    ]
    for message in messages:
        assert await a.inbound.publish(message, record_history=True)
    assert not await a.inbound.publish(messages[0], record_history=True)  # deduped
    await wait_until(lambda: len(taken_a) == len(messages))
    crash(a)
    try:
        await b.start()
        await b.inbound.start()
        await wait_until(lambda: len(taken_b) == len(messages))  # once a's leases ran out
        assert all(recovered for _, recovered in taken_b)
        for t in range(4):
            ids = [mid for mid, _ in taken_b if mid.startswith(f"m{t}-")]
            assert ids == [f"m{t}-{i}" for i in range(3)]
        client = aioredis.Redis.from_url(store.url)
        try:
            for shard in range(4):
                pending = await client.xpending(b.keys.bus_in(shard), GROUP)
                assert pending["pending"] == 0
        finally:
            await client.aclose()
        assert await store.pending_inbound() == []  # completed with the acknowledgement
    finally:
        await b.stop()
        await a.stop()


async def test_a_redelivered_message_is_not_answered_a_second_time(cluster: Cluster) -> None:
    a = await cluster.node("a")
    await wait_until(lambda: owner([a]) is a and len(a.cluster.inbound.held) == 4)  # type: ignore[union-attr]
    assert a.cluster is not None
    handle = a.router._from_bus

    class NeverAck:
        """The entry's `Ack`, but for the acknowledgement itself."""

        def __init__(self, ack: Ack) -> None:
            self._ack = ack

        def __getattr__(self, name: str) -> Any:
            return getattr(self._ack, name)

        async def __call__(self) -> None:
            return None

    async def take(message: NormalizedMessage, recovered: bool, ack: Ack) -> None:
        # answers, then "dies" before the ack
        await handle(message, recovered, NeverAck(ack))  # type: ignore[arg-type]

    a.cluster.inbound.set_handler(take)
    await connector(a).inject(make_message("only once", message_id="m1"))
    await connector(a).wait_sent(1)
    b = await cluster.node("b")
    seen_by_b: list[NormalizedMessage] = []
    handled = asyncio.Event()

    async def record(message: NormalizedMessage) -> None:  # runs after the bridge's handler
        seen_by_b.append(message)
        handled.set()

    b.router.subscribe_all(record)
    await a.stop()  # its shards (and their unacknowledged entry) go to b
    await asyncio.wait_for(handled.wait(), 10)
    assert [m.id for m in seen_by_b] == ["m1"]
    total = connector(a).sent + connector(b).sent
    assert [s.message.text for s in total] == ["only once"]


def takers(*nodes: Node) -> dict[str, list[str]]:
    """Each node's inbound handler notes (by node id) the ids of the messages it took."""
    taken: dict[str, list[str]] = {node.node_id: [] for node in nodes}

    def taker(name: str) -> object:
        async def take(message: NormalizedMessage, recovered: bool, ack: object) -> None:
            taken[name].append(message.id)
            await ack()  # type: ignore[operator]

        return take

    for node in nodes:
        node.inbound.set_handler(taker(node.node_id))  # type: ignore[arg-type]
    return taken


async def test_a_node_whose_renewals_stalled_leaves_new_entries_to_the_shards_new_holder(
    store: RedisStore,
) -> None:
    # As after a pause of node a (a stopped process, a long GC, a Redis outage): its leases
    # ran out and b took the shards, but a's reader has not heard yet. Entries a read now
    # would wait for b's straggler sweep (claim_idle) and be answered out of order.
    a, b = Node(store, CONFIG, "a"), Node(store, CONFIG, "b")
    taken = takers(a, b)
    await a.start()
    await a.inbound.start()
    balancer = a.inbound._balancer
    assert balancer is not None and a.inbound.held == [0, 1, 2, 3]
    balancer.cancel()  # no more renewals; a's reader goes on
    try:
        await b.start()
        await b.inbound.start()
        await wait_until(lambda: b.inbound.held == [0, 1, 2, 3])  # a's leases ran out
        messages = [
            make_message(f"{i}", thread_id=f"t{i % 4}", message_id=f"m{i}") for i in range(12)
        ]
        for message in messages:
            assert await b.inbound.publish(message, record_history=True)
        await wait_until(lambda: len(taken["b"]) == len(messages), timeout=4)  # < claim_idle
        assert taken["a"] == [] and sorted(taken["b"]) == sorted(m.id for m in messages)
    finally:
        await b.stop()
        await a.stop()


async def test_a_node_yet_to_hear_its_shard_moved_reads_none_of_its_new_entries(
    store: RedisStore,
) -> None:
    # Node a's lease ran out and b took the shard, its take-over claim over, but a has yet to
    # hear (its next renewal is up to a third of the TTL away). a's read, waiting on the
    # stream longer than b's, was served the new entries first: they then waited in a's
    # pending list for b's straggler sweep (`claim_idle`, a minute by default), or a answered
    # them itself, beside the shard's holder and out of its order.
    config = ClusterConfig(lease_ttl=3.0, shards=1, claim_idle=30.0, send_timeout=5.0)
    a, b = Node(store, config, "a"), Node(store, config, "b")
    taken = takers(a, b)
    await a.start()
    await a.inbound.start()
    balancer = a.inbound._balancer
    assert balancer is not None and a.inbound.held == [0]
    balancer.cancel()  # a does not hear of the loss: its renewal is still to come
    client = aioredis.Redis.from_url(store.url, decode_responses=True)
    try:
        await client.set(a.keys.lease("shard", "0"), "b", px=60_000)  # a's ran out; b's now
        await b.start()
        await b.inbound.start()
        assert b.inbound.held == [0]  # taken over (nothing to claim), and read from now on
        messages = [make_message(f"{i}", thread_id="t", message_id=f"m{i}") for i in range(5)]
        for message in messages:
            assert await b.inbound.publish(message, record_history=True)
        await wait_until(lambda: len(taken["b"]) == len(messages), timeout=5)  # < claim_idle
        assert taken == {"a": [], "b": [m.id for m in messages]}  # by the holder, in order
        assert a.inbound.held == []  # a learnt of the loss from its read
    finally:
        await client.aclose()
        await b.stop()
        await a.stop()


async def test_a_stopping_node_hands_back_each_shard_once_its_own_work_there_is_done(
    store: RedisStore,
) -> None:
    # A rolling restart: node a drains a long turn on one shard; the other shards' new
    # messages are answered by b meanwhile instead of waiting for a's whole drain.
    a, b = Node(store, CONFIG, "a"), Node(store, CONFIG, "b")
    gate = asyncio.Event()
    taken_b: list[str] = []

    working: set[asyncio.Task[None]] = set()

    async def work(ack: Callable[[], Awaitable[None]]) -> None:
        await gate.wait()
        await ack()

    async def take_a(
        message: NormalizedMessage, recovered: bool, ack: Callable[[], Awaitable[None]]
    ) -> None:  # queues the turn and returns, as the router does
        working.add(asyncio.create_task(work(ack)))

    async def take_b(message: NormalizedMessage, recovered: bool, ack: object) -> None:
        taken_b.append(message.id)
        await ack()  # type: ignore[operator]

    a.inbound.set_handler(take_a)  # type: ignore[arg-type]
    b.inbound.set_handler(take_b)  # type: ignore[arg-type]
    await a.start()
    await a.inbound.start()
    threads = {a.inbound.shard_of(f"test\x1ft{i}"): f"t{i}" for i in range(40)}
    assert sorted(threads) == [0, 1, 2, 3]
    busy = 0
    try:
        assert await a.inbound.publish(make_message(thread_id=threads[busy]), record_history=True)
        await wait_until(lambda: bool(a.inbound._held[busy].inflight))
        await a.inbound.stop_reading()
        await b.start()
        await b.inbound.start()
        await wait_until(lambda: b.inbound.held == [1, 2, 3], timeout=4)  # before a's drain
        others = [make_message(thread_id=threads[n], message_id=f"x{n}") for n in (1, 2, 3)]
        for message in others:
            assert await b.inbound.publish(message, record_history=True)
        await wait_until(lambda: sorted(taken_b) == ["x1", "x2", "x3"])
        assert busy not in b.inbound.held  # a still works there
        gate.set()
        await wait_until(lambda: b.inbound.held == [0, 1, 2, 3])  # handed back once done
    finally:
        gate.set()
        await b.stop()
        await a.stop()


async def test_a_node_that_takes_back_a_shard_it_lost_does_not_hand_its_own_work_over_twice(
    store: RedisStore,
) -> None:
    # A Redis outage longer than the lease TTL: the node's shard lease runs out while a turn
    # of it is under way, and the node takes the shard again once Redis answers. The claim
    # of the shard's unacknowledged entries must not start that turn a second time.
    a = Node(store, CONFIG, "a")
    gate = asyncio.Event()
    taken: list[str] = []
    working: set[asyncio.Task[None]] = set()

    async def work(ack: Callable[[], Awaitable[None]]) -> None:
        await gate.wait()
        await ack()

    async def take(
        message: NormalizedMessage, recovered: bool, ack: Callable[[], Awaitable[None]]
    ) -> None:  # queues the turn and returns, as the router does
        taken.append(message.id)
        working.add(asyncio.create_task(work(ack)))

    a.inbound.set_handler(take)  # type: ignore[arg-type]
    await a.start()
    await a.inbound.start()
    message = make_message(thread_id="t0", message_id="m1")
    busy = a.inbound.shard_of(message.thread_key)
    lease = a.keys.lease("shard", str(busy))
    client = aioredis.Redis.from_url(store.url, decode_responses=True)
    try:
        assert await a.inbound.publish(message, record_history=True)
        await wait_until(lambda: taken == ["m1"])
        await client.set(lease, "elsewhere", px=60_000)  # ran out and was taken meanwhile
        await wait_until(lambda: busy not in a.inbound.held)
        await client.delete(lease)  # free again: a takes it back and claims what is pending
        await wait_until(lambda: busy in a.inbound.held)
        assert taken == ["m1"]
        gate.set()
        await asyncio.gather(*working)
        pending = await client.xpending(a.keys.bus_in(busy), GROUP)
        assert pending["pending"] == 0 and taken == ["m1"]
    finally:
        gate.set()
        await client.delete(lease)
        await client.aclose()
        await a.stop()


class GatedEcho:
    """The default agent, answering only once its gate opens: a turn under way."""

    name = "echo"

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.gate = asyncio.Event()
        self.turns = 0

    async def stream(self, ctx: TurnContext) -> AsyncIterator[Any]:
        self.turns += 1
        self.started.set()
        await self.gate.wait()
        yield Result(text=f"answer to {ctx.input.prompt}")


async def test_a_node_that_lost_a_shard_mid_turn_leaves_the_answer_to_its_new_holder(
    cluster: Cluster,
) -> None:
    # Redis stalled longer than the lease TTL while node a ran a turn: the shard's lease ran out
    # (and another node may hold it now). a's answer must not leave beside the new holder's;
    # the message stays pending, and whoever holds the shard next answers it once.
    agent = GatedEcho()
    a = await cluster.node("a", prepare=lambda bridge: bridge.runner.add_agent(agent, "echo"))
    assert a.cluster is not None
    inbound = a.cluster.inbound
    await wait_until(lambda: owner([a]) is a and len(inbound.held) == 4)
    message = make_message("hello", message_id="m1")
    busy = inbound.shard_of(message.thread_key)
    lease = a.cluster.keys.lease("shard", str(busy))
    stream = a.cluster.keys.bus_in(busy)
    client = aioredis.Redis.from_url(cluster.url, decode_responses=True)
    try:
        await connector(a).inject(message)
        await asyncio.wait_for(agent.started.wait(), 10)
        await client.set(lease, "elsewhere", px=60_000)  # ran out, and was taken meanwhile
        await wait_until(lambda: busy not in inbound.held)
        agent.gate.set()  # the turn ends: its answer is ready
        await wait_until(lambda: a.router.turns_running == 0)
        assert connector(a).sent == []
        assert (await client.xpending(stream, GROUP))["pending"] == 1  # left for the holder
        await client.delete(lease)  # the holder (a again, alone here) answers it, once
        (sent,) = await connector(a).wait_sent(1)
        assert sent.message.text == "answer to hello"
        await wait_until(lambda: a.router.turns_running == 0)
        assert agent.turns == 2 and len(connector(a).sent) == 1
    finally:
        agent.gate.set()
        await client.delete(lease)
        await client.aclose()


async def test_a_reply_waits_while_the_lease_is_unsure_and_goes_once_it_is_renewed(
    store: RedisStore,
) -> None:
    # Renewals failing for a while (Redis slow): not sure the shard is still ours, nor that it
    # is not. The reply waits for the next renewal (it goes) or the loss (it does not).
    a = Node(store, CONFIG, "a")

    async def take(message: NormalizedMessage, recovered: bool, ack: Any) -> None:
        await ack()

    a.inbound.set_handler(take)
    await a.start()
    await a.inbound.start()
    balancer = a.inbound._balancer
    assert balancer is not None
    balancer.cancel()  # renewals happen when the test says so
    key = make_message(thread_id="t0").thread_key
    busy = a.inbound.shard_of(key)
    client = aioredis.Redis.from_url(store.url, decode_responses=True)
    try:
        shard = a.inbound._held[busy]
        stale = shard.renewed_at - CONFIG.lease_ttl
        shard.renewed_at = stale  # last renewed a whole TTL ago

        async def answer_and_when() -> tuple[bool, float]:
            held = await a.inbound.still_holds(key)
            return held, shard.renewed_at  # the renewal it answered after, if any

        waiting = asyncio.create_task(answer_and_when())
        await a.inbound._renew()  # the task runs meanwhile: unsure, it must wait for this
        held, renewed_at = await asyncio.wait_for(waiting, 5)
        assert held is True and renewed_at > stale

        shard.renewed_at -= CONFIG.lease_ttl
        waiting = asyncio.create_task(a.inbound.still_holds(key))
        await client.set(a.keys.lease("shard", str(busy)), "elsewhere", px=60_000)
        await a.inbound._renew()  # the renewal finds it lost
        assert await asyncio.wait_for(waiting, 5) is False
    finally:
        await client.delete(a.keys.lease("shard", str(busy)))
        await client.aclose()
        await a.stop()


async def test_a_send_request_read_just_as_its_connection_was_lost_reaches_the_new_owner(
    store: RedisStore,
) -> None:
    """The old owner's wait is under way when it learns another node took the connection
    (whose takeover claim found nothing pending yet): before, the request stayed pending with
    the old owner and its sender waited out `send_timeout`."""
    config = CONFIG.model_copy(update={"lease_ttl": 6.0})  # reads wait 1 s: a's stays out
    a, b = Node(store, config, "a"), Node(store, config, "b")
    sent: list[tuple[str, str]] = []
    client = aioredis.Redis.from_url(store.url, decode_responses=True)
    lease = a.keys.lease("conn", "test")

    def local(node: str) -> Callable[[str, OutboundMessage, bool], Awaitable[SendResult]]:
        async def send(cid: str, message: OutboundMessage, check: bool) -> SendResult:
            sent.append((node, message.text))
            return SendResult(message_ids=(f"{node}-1",))

        return send

    a.outbound.set_local(local("a"))
    b.outbound.set_local(local("b"))
    await a.start()
    await b.start()
    try:
        await client.set(lease, "a", px=60_000)
        await a.acquired("test")
        await a.outbound._cycles.wait_past(a.outbound._cycles.count)  # a reads "test" now
        await client.set(lease, "b", px=60_000)  # a's ran out, b took it
        await b.acquired("test")  # b takes it over: nothing pending to claim
        a.lost("test")  # and a learns it, its read still out
        result = await b.outbound.request(
            "test", OutboundMessage(thread_id="t1", text="hi"), check_sent=False
        )
        assert sent == [("b", "hi")] and result.message_ids == ("b-1",)
    finally:
        await client.aclose()
        await b.stop()
        await a.stop()


@pytest.mark.parametrize("heard", [True, False], ids=["heard-of-the-loss", "yet-to-hear"])
async def test_send_requests_of_a_moved_connection_reach_the_platform_once_and_in_order(
    store: RedisStore, heard: bool
) -> None:
    """Node a owns the Telegram connection and waits on its send-request stream; the connection
    moves to b (a's lease ran out, b took it: nothing pending to claim), and three requests of
    one chat come from another node back to back. Before, a's read, out first, took the first
    one: a node that had heard of the loss put it back at the end of the stream, so the chat
    got answer 2 (and 3) before answer 1; a node yet to hear sent it itself, beside the
    owner. Now a read takes requests only while Redis says the connection is the reader's."""
    config = CONFIG.model_copy(update={"lease_ttl": 6.0})  # reads wait 1 s: a's stays out
    a, b = Node(store, config, "a"), Node(store, config, "b")
    senders: list[str] = []
    context = ConnectorContext(store, logging.getLogger("test"))
    async with TelegramBotAPIPeer([TOKEN]) as peer:
        platform = TelegramConfig(
            id="test", channel="telegram", token=TOKEN, api_base=peer.base_url
        )
        connectors = {name: create_telegram(platform, context) for name in ("a", "b")}

        def local(node: str) -> Callable[[str, OutboundMessage, bool], Awaitable[SendResult]]:
            async def send(cid: str, message: OutboundMessage, check: bool) -> SendResult:
                senders.append(node)
                return await connectors[node].send(message)

            return send

        a.outbound.set_local(local("a"))
        b.outbound.set_local(local("b"))
        client = aioredis.Redis.from_url(store.url, decode_responses=True)
        lease, stream = a.keys.lease("conn", "test"), a.keys.bus_out("test")
        await a.start()
        await b.start()
        try:
            await client.set(lease, "a", px=60_000)
            await a.acquired("test")
            await a.outbound._cycles.wait_past(a.outbound._cycles.count)  # a waits on it now
            await client.set(lease, "b", px=60_000)  # a's ran out, b took it
            await b.acquired("test")  # nothing pending to claim
            if heard:
                a.lost("test")  # its read still out
            deadline = str(int((time.time() + 30) * 1000))
            async with client.pipeline(transaction=False) as requests:  # as another node asks
                for i in (1, 2, 3):
                    message = OutboundMessage(thread_id="5000", text=f"answer {i}")
                    fields = {"r": f"r{i}", "n": "c", "c": "0", "d": deadline, **encode(message)}
                    requests.xadd(stream, fields)  # type: ignore[arg-type]
                await requests.execute()
            await peer.wait_for(lambda: len(peer.sent_messages) >= 3, 10)
            replies = await wait_for_replies(client, a.keys.bus_reply("c"), 3)
            assert [m["text"] for m in peer.sent_messages] == ["answer 1", "answer 2", "answer 3"]
            assert senders == ["b", "b", "b"]  # only the owner sends
            assert sorted(r["r"] for r in replies) == ["r1", "r2", "r3"]  # each answered once
            assert all(r["ok"] == "1" for r in replies)
            # none left over, none added again (each acknowledged right after its answer)
            await wait_until(lambda: _drained(client, stream), timeout=5)
            assert (await client.xinfo_stream(stream))["entries-added"] == 3
        finally:
            await client.aclose()
            await b.stop()
            await a.stop()
            for connector_ in connectors.values():
                await connector_.close()


async def _drained(client: aioredis.Redis, stream: str) -> bool:
    return await client.xlen(stream) == 0


async def wait_for_replies(client: aioredis.Redis, stream: str, count: int) -> list[dict[str, str]]:
    """The first `count` answers on a node's reply stream (read, not taken)."""
    replies: list[dict[str, str]] = []
    last = "0"
    async with asyncio.timeout(10):
        while len(replies) < count:
            for _, entries in await client.xread({stream: last}, block=1000) or ():
                for entry_id, fields in entries:
                    last = entry_id
                    replies.append(fields)
    return replies
