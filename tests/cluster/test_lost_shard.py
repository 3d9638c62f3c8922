"""A node that loses a shard mid-turn: its turns there stop, and each message is answered once.

The lease is taken from the node the way a Redis stall longer than `lease_ttl` does it (its key
runs out and another node holds it), by setting the key in Redis; the nodes notice at their
next renewal, as they would after the stall.
"""

from __future__ import annotations

import asyncio
import logging
import re

import pytest
import redis.asyncio as aioredis
from websockets.asyncio.client import connect

from talkbridge.bridge import Bridge
from talkbridge.cluster.claims import SendClaims
from talkbridge.cluster.inbound import GROUP
from talkbridge.cluster.keys import ClusterKeys
from talkbridge.config import ConnectionConfig
from talkbridge.hooks import TurnFinishedEvent
from talkbridge.message import NormalizedMessage, SendResult
from tests.cluster.conftest import TTL, Cluster, connector, owner, wait_until
from tests.support.agents import GatedAgent, Storyteller
from tests.support.talk_connector import TalkConnector, make_message
from tests.webchat.conftest import Client


def web_of(bridge: Bridge) -> TalkConnector:
    found = bridge.registry.get("web")
    assert isinstance(found, TalkConnector)
    return found


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


async def test_a_lost_shard_is_one_log_line_however_many_messages_wait_in_it(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="talkbridge")
    agent = GatedAgent()
    a = await cluster.node("a", prepare=lambda bridge: bridge.runner.add_agent(agent, "echo"))
    assert a.cluster is not None
    inbound = a.cluster.inbound
    await wait_until(lambda: owner([a]) is a and len(inbound.held) == 4)
    shard = inbound.shard_of("test\x1ft0")
    lease = a.cluster.keys.lease("shard", str(shard))
    client = aioredis.Redis.from_url(cluster.url, decode_responses=True)
    try:
        for i in range(30):  # one turn runs, 29 wait behind it
            await connector(a).inject(make_message(f"m{i}", thread_id="t0", message_id=f"m{i}"))
        await asyncio.wait_for(agent.started["m0"].wait(), 10)
        stream = a.cluster.keys.bus_in(shard)

        async def all_read() -> bool:  # by the node, which holds them
            return bool((await client.xpending(stream, GROUP))["pending"] == 30)

        await wait_until(all_read)
        caplog.clear()
        await client.set(lease, "elsewhere", px=60_000)  # ran out, and was taken meanwhile
        await asyncio.wait_for(agent.cancelled["m0"].wait(), 5)
        await asyncio.wait_for(a.router.join(), 10)  # each one left to the holder
        said = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
        assert said[0] == f"shard {shard}: lease lost; no longer reading it"
        assert re.fullmatch(
            rf"shard {shard}: cancelling 1 turn\(s\) under way; its \d+ unfinished "
            r"message\(s\) are left to its new holder",
            said[1],
        )
        assert len(said) == 2
        assert agent.turns == {"m0": 1}
    finally:
        for gate in agent.gates.values():
            gate.set()
        await client.delete(lease)
        await client.aclose()


async def test_a_reply_under_way_when_the_shard_moves_goes_out_once(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    # The webchat's case: a connection every node sends on itself. Node a's reply is on its
    # way to the platform when a's shard lease runs out; b takes the shard, runs the turn
    # again and sends its reply too. Whichever comes second must find the first.
    caplog.set_level(logging.INFO, logger="talkbridge")
    gate = asyncio.Event()

    def prepare(bridge: Bridge) -> None:
        web = TalkConnector("web")
        bridge.registry.add(web, ConnectionConfig(id="web", channel="telegram", trusted=["*"]))

    one_shard = {"cluster": {"shards": 1}}
    a = await cluster.node("a", prepare=prepare, config=one_shard)
    assert a.cluster is not None
    await wait_until(lambda: a.cluster is not None and a.cluster.inbound.held == [0])
    web_a = web_of(a)
    web_a.script.append(gate.wait)  # the platform takes a's reply once the gate opens
    await web_a.inject(make_message("hello", connection_id="web", message_id="m1"))
    await asyncio.wait_for(web_a.attempted.wait(), 10)  # a's reply is under way

    b = await cluster.node("b", prepare=prepare, config=one_shard)
    assert b.cluster is not None
    web_b = web_of(b)
    lease = a.cluster.keys.lease("shard", "0")
    client = aioredis.Redis.from_url(cluster.url, decode_responses=True)
    try:
        await client.set(lease, "b", px=60_000)  # a's ran out; b holds it now
        await wait_until(lambda: b.cluster is not None and b.cluster.inbound.held == [0])

        def second_reply_reached_the_platform_or_waits() -> bool:
            return web_b.attempts > 0 or "being sent by another send" in caplog.text

        await wait_until(second_reply_reached_the_platform_or_waits)
        gate.set()
        await wait_until(lambda: a.router.turns_running == 0 and b.router.turns_running == 0)
        assert await client.zcard(a.cluster.keys.pending()) == 0  # answered: nothing lost
        assert (await client.xpending(a.cluster.keys.bus_in(0), GROUP))["pending"] == 0
        answers = [s.message.text for s in (*web_a.sent, *web_b.sent)]
        assert answers == ["hello"]  # one answer at the platform, for two turns
        assert len(web_a.sent) == 1 and web_b.attempts == 0  # a's send was not cut short
    finally:
        gate.set()
        await client.delete(lease)
        await client.aclose()


async def test_a_send_whose_sender_died_mid_call_goes_out_once_its_claim_runs_out(
    cluster: Cluster,
) -> None:
    # Nothing is lost: a node that died during its platform call left its claim behind, never
    # renewed. The next send of the key waits for it to run out, then goes, once.
    client = aioredis.Redis.from_url(cluster.url, decode_responses=True)
    keys = ClusterKeys(cluster.prefix)
    claims = SendClaims(client, keys, TTL)
    claim = keys.send_claim("web", "reply:m1")
    calls: list[str | None] = []

    async def call() -> SendResult:
        calls.append(await client.get(claim))  # whose claim it is while the platform is called
        return SendResult(message_ids=("web-out-1",))

    try:
        await client.set(claim, "the-dead-node", px=round(TTL * 1000))
        sent = await asyncio.wait_for(claims.send_once("web", "reply:m1", call), 10)
        assert sent.message_ids == ("web-out-1",)
        assert len(calls) == 1 and calls[0] not in (None, "the-dead-node")  # its own claim
        again = await claims.send_once("web", "reply:m1", call)  # answered from the record
        assert again.message_ids == ("web-out-1",) and len(calls) == 1
        assert await client.exists(claim) == 0  # the record replaced the claim
    finally:
        await client.aclose()


WEBCHAT_TOKEN = "cluster-token-0123456789"


async def page_on(bridge: Bridge, session_id: str | None = None) -> Client:
    """A webchat client of `bridge` (the same session on another node: `session_id`)."""
    await bridge.webchat_url()
    ws = await connect(f"ws://127.0.0.1:{bridge.webchat.port}/ws", max_size=None)
    client = Client(ws)
    client.ready = await client.auth(WEBCHAT_TOKEN, session_id)
    return client


async def story_node(cluster: Cluster, name: str, story: Storyteller) -> Bridge:
    """A node of a one-shard cluster, with a webchat, whose default agent is `story`."""

    def prepare(bridge: Bridge) -> None:
        bridge.runner.add_agent(story, "echo")

    config = {"cluster": {"shards": 1}, "webchat": {"port": 0, "tokens": [WEBCHAT_TOKEN]}}
    return await cluster.node(name, prepare=prepare, config=config, with_webchat=True)


def handled_on(bridge: Bridge) -> asyncio.Event:
    """Set once `bridge` has handled a message: subscribed after the bridge's own handler, it
    runs once the answer is done."""
    handled = asyncio.Event()

    async def note(message: NormalizedMessage) -> None:
        handled.set()

    bridge.router.subscribe_all(note)
    return handled


async def until_answered(bridge: Bridge, handled: asyncio.Event) -> None:
    """Until `bridge` handled a message and acknowledged it on the bus (the acknowledgement
    is part of the dispatch `join` waits for)."""
    await asyncio.wait_for(handled.wait(), 10)
    await bridge.router.join()


async def test_a_turn_answered_before_its_shard_moved_is_not_run_again_by_the_new_holder(
    cluster: Cluster,
) -> None:
    # Node a answered (the reply is on record) but lost the thread's shard before it marked
    # the message done: b, the new holder, handles it again. It ran the agent again (paid
    # twice) and streamed it to the pages, under a final message that was never sent.
    story = Storyteller()
    a = await story_node(cluster, "a", story)
    assert a.cluster is not None
    await wait_until(lambda: a.cluster is not None and a.cluster.inbound.held == [0])
    never = asyncio.Event()

    async def done_only_after_the_shard_moved(message: NormalizedMessage) -> None:
        await never.wait()  # after the bridge's own handler: the reply is out

    a.router.subscribe_all(done_only_after_the_shard_moved)
    b = await story_node(cluster, "b", story)
    handled = handled_on(b)
    page = await page_on(a)
    lease = a.cluster.keys.lease("shard", "0")
    client = aioredis.Redis.from_url(cluster.url, decode_responses=True)
    try:
        send = {"type": "send", "thread_id": page.thread_id, "client_id": "c1", "text": "tell"}
        await page.send(send)
        delta = await page.expect("delta")
        story.go.set()
        answer = await page.expect("message", role="assistant")
        assert answer["stream_id"] == delta["stream_id"]

        await client.set(lease, "b", px=60_000)  # a's ran out; b holds it now
        await until_answered(b, handled)
        shown = await page.drain_until_pong()
        other_page = await page_on(b, page.session_id)
        await other_page.send({"type": "history", "thread_id": page.thread_id, "after_seq": 0})
        history = await other_page.expect("history")
        shown_there = await other_page.drain_until_pong()
    finally:
        never.set()
        await client.delete(lease)
        await client.aclose()
        await page.close()
    assert story.runs == 1
    replies = [
        f for f in shown + shown_there if f["type"] == "delta" or f.get("role") == "assistant"
    ]
    assert replies == []  # nothing streamed, nor answered, a second time
    assert [m["role"] for m in history["messages"]] == ["user", "assistant"]


async def test_a_stream_cut_off_with_its_shard_is_ended_on_the_page_and_answered_once(
    cluster: Cluster,
) -> None:
    # The page showed the first words of a reply whose turn was cancelled as its node lost
    # the shard: they stayed on the page, frozen, until the turn ran again elsewhere.
    story = Storyteller()
    a = await story_node(cluster, "a", story)
    assert a.cluster is not None
    await wait_until(lambda: a.cluster is not None and a.cluster.inbound.held == [0])
    handled = handled_on(a)
    page = await page_on(a)
    lease = a.cluster.keys.lease("shard", "0")
    client = aioredis.Redis.from_url(cluster.url, decode_responses=True)
    try:
        send = {"type": "send", "thread_id": page.thread_id, "client_id": "c1", "text": "tell"}
        await page.send(send)
        cut = await page.expect("delta")
        await client.set(lease, "elsewhere", px=60_000)  # a's ran out, and was taken meanwhile
        await wait_until(lambda: a.router.turns_running == 0)  # its turn was cancelled
        shown = await page.drain_until_pong()
        await client.delete(lease)  # the holder (a again, alone here) runs the turn again
        again = await page.expect("delta")
        story.go.set()
        answer = await page.expect("message", role="assistant")
        await until_answered(a, handled)
        rest = await page.drain_until_pong()
    finally:
        story.go.set()
        await client.delete(lease)
        await client.aclose()
        await page.close()
    assert {"type": "stream_end", "thread_id": page.thread_id, "stream_id": cut["stream_id"]} in (
        shown
    )
    assert again["stream_id"] != cut["stream_id"] and answer["stream_id"] == again["stream_id"]
    assert answer["text"] == "Once upon a time."
    assert [f for f in rest if f["type"] in ("delta", "stream_end", "message")] == []


async def test_a_turn_run_again_while_the_old_holder_sends_its_reply_ends_its_stream(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    # Node b runs a turn again while the node that lost the shard still sends its reply (its
    # claim on the reply's key is held: the test plays that node). b streams the turn to the
    # page, then finds the reply sent and sends nothing: its streamed pieces stayed on the
    # page, a second, half copy of the answer with no final message to replace it.
    caplog.set_level(logging.INFO, logger="talkbridge")
    story = Storyteller()
    b = await story_node(cluster, "b", story)
    assert b.cluster is not None
    handled = handled_on(b)
    page = await page_on(b)
    client = aioredis.Redis.from_url(cluster.url, decode_responses=True)
    old_holder = SendClaims(client, b.cluster.keys, TTL)
    calling, sent = asyncio.Event(), asyncio.Event()

    async def old_holders_call() -> SendResult:
        calling.set()
        await sent.wait()
        return SendResult(message_ids=(f"{page.thread_id}:r-old-holder",))

    reply_key = f"reply:{page.thread_id}:c1"
    old_send = asyncio.create_task(old_holder.send_once("webchat", reply_key, old_holders_call))
    try:
        await calling.wait()
        send = {"type": "send", "thread_id": page.thread_id, "client_id": "c1", "text": "tell"}
        await page.send(send)
        delta = await page.expect("delta")
        story.go.set()
        await wait_until(lambda: "being sent by another send" in caplog.text)
        sent.set()
        await old_send
        await until_answered(b, handled)
        await wait_until(lambda: b.router.turns_running == 0)
        shown = await page.drain_until_pong()
    finally:
        sent.set()
        story.go.set()
        await asyncio.gather(old_send, return_exceptions=True)
        await client.aclose()
        await page.close()
    assert story.runs == 1
    assert [f for f in shown if f.get("role") == "assistant"] == []  # its reply went out before
    end = {"type": "stream_end", "thread_id": page.thread_id, "stream_id": delta["stream_id"]}
    assert end in shown
