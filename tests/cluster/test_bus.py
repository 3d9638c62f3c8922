"""The inbound bus and cross-node sends, with real Redis and two or three Bridges in-process."""

from __future__ import annotations

from collections import defaultdict

import pytest

from talkbridge.bridge import Bridge
from talkbridge.errors import PermanentError, SendFailedError
from talkbridge.message import NormalizedMessage, OutboundMessage
from tests.cluster.conftest import Cluster, connector, owner, wait_until
from tests.support.talk_connector import make_message


def _balanced(nodes: list[Bridge], shards: int = 4) -> bool:
    held = [n.cluster.inbound.held for n in nodes if n.cluster is not None]
    return sum(len(h) for h in held) == shards and all(held)


async def test_every_message_gets_one_reply_in_thread_order_across_nodes(cluster: Cluster) -> None:
    a = await cluster.node("a")
    b = await cluster.node("b")
    await wait_until(lambda: _balanced([a, b]) and owner([a, b]) is not None)
    node = owner([a, b])
    assert node is not None
    handled: dict[str, list[str]] = defaultdict(list)  # node -> message texts it handled
    for bridge in (a, b):
        bridge.router.subscribe_all(
            lambda m, n=bridge.node_id: _record(handled[str(n)], m)  # type: ignore[misc]
        )
    threads, per_thread = 12, 15
    messages = [
        make_message(f"{t}:{i}", thread_id=f"t{t}", message_id=f"m{t}-{i}")
        for i in range(per_thread)
        for t in range(threads)
    ]
    for message in messages:
        await connector(node).inject(message)
    sent = await connector(node).wait_sent(len(messages), timeout=30)
    for bridge in (a, b):  # whatever either node still has in hand is done (no duplicate)
        await bridge.router.join()
    assert len(sent) == len(messages)
    assert sorted(s.message.reply_to or "" for s in sent) == sorted(m.id for m in messages)
    for t in range(threads):
        replies = [s.message.text for s in sent if s.message.thread_id == f"t{t}"]
        assert replies == [f"{t}:{i}" for i in range(per_thread)]
    assert handled["a"] and handled["b"], "threads should spread over both nodes"
    other = b if node is a else a
    assert connector(other).sent == []  # only the owner talks to the platform


async def _record(into: list[str], message: NormalizedMessage) -> None:
    into.append(message.text)


async def test_a_send_from_another_node_goes_through_the_owner(cluster: Cluster) -> None:
    a = await cluster.node("a")
    await wait_until(lambda: owner([a]) is a)
    b = await cluster.node("b")
    assert b.cluster is not None and b.cluster.is_remote("test")
    result = await b.router.send("test", OutboundMessage(thread_id="t1", text="from b"))
    assert [s.message.text for s in connector(a).sent] == ["from b"]
    assert connector(b).sent == []
    assert result.message_ids == connector(a).sent[0].ids
    # the owner's failure reaches the sender with its reason, naming the connection
    connector(a).script.append(PermanentError("chat not found"))
    try:
        await b.router.send("test", OutboundMessage(thread_id="t2", text="lost"))
    except SendFailedError as exc:
        assert exc.connection_id == "test" and "chat not found" in exc.reason
    else:
        raise AssertionError("the failed send did not raise")


async def test_a_send_with_no_owner_fails_after_the_timeout_naming_the_connection(
    cluster: Cluster,
) -> None:
    b = await cluster.node("b", config={"cluster": {"send_timeout": 0.3}})
    assert b.cluster is not None
    b.cluster.owned.discard("test")  # pretend another node owns it, and that node is gone
    b.cluster.leased.add("test")
    b.cluster.outbound.disown("test")
    await b.registry.stop()  # nobody runs (or will run) the connection
    try:
        await b.router.send("test", OutboundMessage(thread_id="t1", text="nobody home"))
    except SendFailedError as exc:
        assert exc.connection_id == "test" and "'test'" in exc.reason
    else:
        raise AssertionError("a send nobody answers must fail")


async def test_a_bus_write_waits_out_a_short_outage_and_gives_up_on_a_long_one() -> None:
    from redis.exceptions import ConnectionError as RedisConnectionError

    from talkbridge.cluster.outbound import until_written

    tries: list[int] = []

    async def back_on_the_third() -> None:  # Redis restarting: refused, refused, then up
        tries.append(len(tries))
        if len(tries) < 3:
            raise RedisConnectionError("Error 111 connecting to 127.0.0.1:6379")

    await until_written(back_on_the_third, 10)
    assert len(tries) == 3

    async def down() -> None:
        raise RedisConnectionError("Error 111 connecting to 127.0.0.1:6379")

    with pytest.raises(RedisConnectionError):  # never through: it fails in the end
        await until_written(down, 0.1)


async def test_nodes_answer_on_after_their_keys_vanish_from_redis(cluster: Cluster) -> None:
    """A FLUSHDB (here: every key of the prefix deleted) while the nodes' readers are blocked on
    their streams: Redis 7 ends those reads with `UNBLOCKED the stream key no longer exists`.
    Each reader makes its stream again and reads on; before, it ended, and the node answered
    nothing more while /healthz still said ok."""
    import redis.asyncio as aioredis

    from talkbridge.store.redis import RedisKeys

    a = await cluster.node("a")
    b = await cluster.node("b")
    nodes = [a, b]
    redis = aioredis.Redis.from_url(cluster.url)
    try:
        sent = 0
        for round_ in range(3):
            await wait_until(lambda: _balanced(nodes) and len(_owners(nodes)) == 1, timeout=30)
            keys = [k async for k in redis.scan_iter(match=RedisKeys(cluster.prefix).pattern())]
            await redis.delete(*keys)  # the readers are blocked on their streams nearly always
            # The keys' loss is seen at each node's next renewal: until then the old owner
            # runs the connection, and no node takes its lease for a TTL (none owns it then).
            node = (_owners(nodes) or [a])[0]
            for t in range(8):  # threads on every shard, so on both nodes
                await connector(node).inject(
                    make_message(f"{round_}:{t}", thread_id=f"t{t}", message_id=f"m{round_}-{t}")
                )
            sent += 8
            await wait_until(lambda n=sent: _answered(nodes) >= n, timeout=30)
    finally:
        await redis.aclose()
    # Every message is answered. Exactly once is not promised here: with the keys went the
    # leases, so for a moment two nodes may hold a shard, and the records of what was sent.
    texts = {s.message.text for n in nodes for s in connector(n).sent}
    assert texts == {f"{r}:{t}" for r in range(3) for t in range(8)}


def _answered(nodes: list[Bridge]) -> int:
    return len({s.message.text for n in nodes for s in connector(n).sent})


def _owners(nodes: list[Bridge]) -> list[Bridge]:
    """The nodes that say they own "test" (`owner` asserts there is one at most)."""
    return [n for n in nodes if n.cluster is not None and "test" in n.cluster.owned]
