"""A node that loses a shard mid-turn: its turns there stop, and each message is answered once.

The lease is taken from the node the way a Redis stall longer than `lease_ttl` does it (its key
runs out and another node holds it), by setting the key in Redis; the nodes notice at their
next renewal, as they would after the stall.
"""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from collections.abc import AsyncIterator
from typing import Any

import redis.asyncio as aioredis

from talkbridge.agents.base import Result, TurnContext
from talkbridge.bridge import Bridge
from talkbridge.cluster.inbound import GROUP
from talkbridge.hooks import TurnFinishedEvent
from tests.cluster.conftest import Cluster, connector, owner, wait_until
from tests.support.talk_connector import make_message


class GatedAgent:
    """The default agent: each prompt's turn answers once its own gate opens, and says whether
    it was cancelled meanwhile."""

    name = "echo"

    def __init__(self) -> None:
        self.started: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self.gates: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self.cancelled: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self.turns: Counter[str] = Counter()

    async def stream(self, ctx: TurnContext) -> AsyncIterator[Any]:
        prompt = ctx.input.prompt
        self.turns[prompt] += 1
        self.started[prompt].set()
        try:
            await self.gates[prompt].wait()
        except asyncio.CancelledError:
            self.cancelled[prompt].set()
            raise
        yield Result(text=f"answer to {prompt}")


def other_shard_thread(bridge: Bridge, shard: int) -> str:
    """A thread id of connection `test` whose messages land on another shard than `shard`."""
    assert bridge.cluster is not None
    inbound = bridge.cluster.inbound
    return next(f"t{i}" for i in range(1, 100) if inbound.shard_of(f"test\x1ft{i}") != shard)


async def test_a_node_that_loses_a_shard_cancels_its_turns_there_and_no_others(
    cluster: Cluster,
) -> None:
    agent = GatedAgent()
    finished: list[TurnFinishedEvent] = []
    one_finished = asyncio.Event()

    async def watch(event: TurnFinishedEvent) -> None:
        finished.append(event)
        one_finished.set()

    def prepare(bridge: Bridge) -> None:
        bridge.runner.add_agent(agent, "echo")
        bridge.hooks.lifecycle.add("agent-turn-finished", watch, name="watch")

    a = await cluster.node("a", prepare=prepare)
    assert a.cluster is not None
    inbound = a.cluster.inbound
    await wait_until(lambda: owner([a]) is a and len(inbound.held) == 4)
    lost = make_message("lost", thread_id="t0", message_id="m-lost")
    waiting = make_message("waiting", thread_id="t0", message_id="m-waiting")  # behind it
    shard = inbound.shard_of(lost.thread_key)
    kept = make_message("kept", thread_id=other_shard_thread(a, shard), message_id="m-kept")
    lease = a.cluster.keys.lease("shard", str(shard))
    client = aioredis.Redis.from_url(cluster.url, decode_responses=True)
    try:
        await connector(a).inject(lost)
        await connector(a).inject(waiting)
        await connector(a).inject(kept)
        await asyncio.wait_for(agent.started["lost"].wait(), 10)
        await asyncio.wait_for(agent.started["kept"].wait(), 10)
        await client.set(lease, "elsewhere", px=60_000)  # ran out, and was taken meanwhile
        await asyncio.wait_for(agent.cancelled["lost"].wait(), 5)  # its agent stops at once
        await asyncio.wait_for(one_finished.wait(), 5)
        (event,) = finished
        assert event.status == "interrupted" and event.turn.thread.thread_id == "t0"
        assert "lost its thread's shard to another node" in (event.output.error or "")
        stream = a.cluster.keys.bus_in(shard)
        assert not agent.cancelled["kept"].is_set()  # a shard still held: its turn goes on
        agent.gates["kept"].set()
        (sent,) = await connector(a).wait_sent(1)
        assert sent.message.text == "answer to kept"
        await wait_until(lambda: a.router.turns_running == 0)  # "waiting" was never started
        assert agent.turns == {"lost": 1, "kept": 1}
        assert (await client.xpending(stream, GROUP))["pending"] == 2  # left for the holder

        agent.gates["lost"].set()
        agent.gates["waiting"].set()
        await client.delete(lease)  # the holder (a again, alone here) answers them, once
        await connector(a).wait_sent(3)
        await wait_until(lambda: a.router.turns_running == 0)
        assert connector(a).texts() == ["answer to kept", "answer to lost", "answer to waiting"]
        assert agent.turns == {"lost": 2, "waiting": 1, "kept": 1}
        await wait_until(lambda: len(finished) == 4)  # watchers run in tasks of their own
        assert [e.status for e in finished[1:]] == ["completed"] * 3
    finally:
        for gate in agent.gates.values():
            gate.set()
        await client.delete(lease)
        await client.aclose()
