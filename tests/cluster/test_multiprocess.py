"""Three `talkbridge run` processes on one Redis; the node polling Telegram is SIGKILLed mid-stream.

The Telegram Bot API peer runs in this test process; one connection's `api_base` points at it,
so exactly one node (the lease holder) polls it. 1,000 updates across 50 private chats of trusted
users go to the echo agent. Asserted: every update gets exactly one reply (matched by
`reply_parameters.message_id`), each chat's replies come in order, and the connection comes back
on another node.

The one thing no bridge can promise is exactly-once delivery of a send that was on the wire at
the instant its process died: the platform may have taken it or not, and nothing records which.
So the kill happens while the peer holds (does not yet take) every new `sendMessage`, after
every send it already took is recorded in the store, as with any crash between two sends. The
held requests of the dead node are then dropped unread, as Telegram never got them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import sys
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis
from aiohttp import web

from talkbridge.store.redis import RedisKeys
from tests.conftest import require
from tests.peers.redis import redis_url
from tests.peers.telegram import TelegramBotAPIPeer, private_text

TOKEN = "123456:TEST-token_abc"
CHATS = 50
PER_CHAT = 20
KILL_AFTER = 300
"""Replies sent before the owner is killed."""

pytestmark = pytest.mark.timeout(120)


class GatedPeer(TelegramBotAPIPeer):
    """The Bot API peer, able to hold `sendMessage` before taking it (see the module doc)."""

    def __init__(self) -> None:
        super().__init__([TOKEN])
        self.gate = asyncio.Event()
        self.gate.set()
        self.held: list[web.Request] = []
        self.answered = 0

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if request.match_info["method"].lower() != "sendmessage":
            return await super()._handle(request)
        if not self.gate.is_set():
            self.held.append(request)
            self._notify()
            await self.gate.wait()
            self.held.remove(request)
            transport = request.transport
            if transport is None or transport.is_closing():  # its sender died: never taken
                return web.Response(status=499)
        response = await super()._handle(request)
        if response.status == 200:
            self.answered += 1
        return response


@dataclass
class Node:
    node_id: str
    process: asyncio.subprocess.Process
    port: int

    async def health(self, http: aiohttp.ClientSession) -> dict[str, Any]:
        async with http.get(f"http://127.0.0.1:{self.port}/healthz") as response:
            found: dict[str, Any] = await response.json()
            return found


async def start_node(config: Path, node_id: str, log: Path) -> Node:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "talkbridge", "run", "--config", str(config), "--node-id", node_id),
        *("--port", "0", "--log-level", "warning"),
        stdout=asyncio.subprocess.PIPE,
        stderr=log.open("wb"),
        env={**os.environ, "TELEGRAM_TOKEN": TOKEN},
    )
    assert process.stdout is not None
    port = None
    while True:
        line = (await asyncio.wait_for(process.stdout.readline(), 60)).decode()
        assert line, f"{node_id} exited early: {log.read_text()}"  # noqa: ASYNC240
        if found := re.match(r"http://127\.0\.0\.1:(\d+)/", line):
            port = int(found.group(1))
        if "Press Ctrl-C" in line:
            break
    assert port is not None
    return Node(node_id, process, port)


async def until(condition: Any, timeout: float, what: str) -> Any:
    """Poll an async condition (healthz, Redis) every 50 ms until it gives a truthy value."""
    try:
        async with asyncio.timeout(timeout):
            # other processes and Redis: there is nothing to await but their answers
            while not (value := await condition()):  # noqa: ASYNC110
                await asyncio.sleep(0.05)
            return value
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


@pytest.fixture
async def prefix() -> AsyncIterator[tuple[str, str]]:
    url = redis_url()
    require(url is not None, "no redis-server answers on 127.0.0.1:6379 and none is installed")
    assert url is not None
    prefix = f"tbtest-{uuid.uuid4().hex[:12]}"
    yield url, prefix
    client = aioredis.Redis.from_url(url)
    try:
        keys = [k async for k in client.scan_iter(match=RedisKeys(prefix).pattern(), count=500)]
        if keys:
            await client.delete(*keys)
    finally:
        await client.aclose()


def write_config(tmp_path: Path, url: str, prefix: str, peer: TelegramBotAPIPeer) -> Path:
    trusted = json.dumps([str(5000 + c) for c in range(CHATS)])
    path = tmp_path / "talkbridge.yaml"
    path.write_text(
        f"""
store: {url}
store_prefix: {prefix}
cluster: {{lease_ttl: 2, shards: 8, claim_idle: 10, send_timeout: 30}}
webchat: {{tokens: ["node-token-0123456789"]}}
connections:
  - id: tg
    channel: telegram
    token: ${{TELEGRAM_TOKEN}}
    api_base: {peer.base_url}
    poll_timeout: 1
    global_rate: 5000
    trusted: {trusted}
""",
        encoding="utf-8",
    )
    return path


async def test_three_nodes_survive_the_death_of_the_telegram_owner(
    tmp_path: Path, prefix: tuple[str, str]
) -> None:
    url, key_prefix = prefix
    redis = aioredis.Redis.from_url(url, decode_responses=True)
    keys = RedisKeys(key_prefix)
    nodes: list[Node] = []
    async with GatedPeer() as peer, aiohttp.ClientSession() as http:
        try:
            config = write_config(tmp_path, url, key_prefix, peer)
            nodes = list(
                await asyncio.gather(
                    *(start_node(config, f"n{k}", tmp_path / f"n{k}.log") for k in (1, 2, 3))
                )
            )

            async def settled() -> Node | None:
                healths = [await n.health(http) for n in nodes]
                owners = [n for n, h in zip(nodes, healths, strict=True) if h["owns"] == ["tg"]]
                shards = [h["shards"] for h in healths]
                if len(owners) == 1 and all(shards) and sum(map(len, shards)) == 8:
                    return owners[0]
                return None

            # A node prints its link before it imports the connections' SDKs (three nodes
            # importing aiogram at once, on a loaded machine): that is inside this wait too.
            owner = await until(settled, 60, "one owner of tg and the shards spread")
            updates: list[tuple[int, int]] = []
            for i in range(1, PER_CHAT + 1):
                for c in range(CHATS):
                    chat = 5000 + c
                    peer.push_update(private_text(chat, f"chat {chat} msg {i}", message_id=i))
                    updates.append((chat, i))

            await peer.wait_for(lambda: peer.answered >= KILL_AFTER, 60)
            peer.gate.clear()  # hold new sends; wait until every taken one is recorded
            await peer.wait_for(lambda: bool(peer.held), 30)

            async def recorded() -> bool:
                return await redis.hlen(keys.sent("tg")) == peer.answered

            await until(recorded, 30, "the sends taken so far to be recorded")
            owner.process.kill()
            await owner.process.wait()
            survivors = [n for n in nodes if n is not owner]

            async def dropped() -> bool:  # the dead node's held sends: its sockets closed
                return all(r.transport is None or r.transport.is_closing() for r in peer.held)

            await until(dropped, 10, "the dead node's connections to close")
            peer.gate.set()

            async def new_owner() -> Node | None:
                for node in survivors:
                    health = await node.health(http)
                    if health["owns"] == ["tg"] and health["connections"]["tg"]["state"] == "up":
                        return node
                return None

            moved = await until(new_owner, 30, "another node to take tg over")
            assert moved is not owner

            async def all_handled() -> bool:
                done = peer.answered >= len(updates)
                return done and await redis.zcard(keys.pending()) == 0

            await until(all_handled, 60, "every update to be answered")
        finally:
            for node in nodes:
                if node.process.returncode is None:
                    node.process.send_signal(signal.SIGTERM)
            for node in nodes:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(node.process.wait(), 30)
            await redis.aclose()

    replies: dict[int, list[int]] = defaultdict(list)
    for sent in peer.sent_messages:
        chat, answered = sent["chat_id"], sent["reply_parameters"]["message_id"]
        assert sent["text"] == f"chat {chat} msg {answered}"
        replies[chat].append(answered)
    assert sum(map(len, replies.values())) == len(updates), "not exactly one reply per update"
    for c in range(CHATS):
        assert replies[5000 + c] == list(range(1, PER_CHAT + 1)), f"chat {5000 + c}"
    for node in nodes:
        log = (tmp_path / f"{node.node_id}.log").read_text()
        assert TOKEN not in log and TOKEN.split(":")[1] not in log
