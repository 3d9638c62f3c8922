"""Webchat fan-out across nodes: a frame for a session reaches its sockets on every node.

The node that makes a frame broadcasts it to its own sockets at once (so their order is exactly
as in embedded mode) and publishes it on the session's pub/sub channel; every other node, which
listens on one pattern for all sessions, broadcasts it to its sockets of that session. Pub/sub
keeps no backlog: a node that was disconnected for a moment misses frames, and its pages fill
the gap from history when they resume (every message frame carries its seq).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from talkbridge.cancellation import cancel_and_wait, raise_if_cancelling
from talkbridge.cluster.keys import ClusterKeys
from talkbridge.outage import Outage

log = logging.getLogger("talkbridge.cluster.fanout")

Receiver = Callable[[str, str], None]
"""(session id, frame text): broadcast to this node's sockets of the session."""


class WebchatFanout:
    def __init__(self, client: aioredis.Redis, keys: ClusterKeys, node_id: str) -> None:
        self._client = client
        self._keys = keys
        self._node = node_id
        self._receiver: Receiver | None = None
        self._task: asyncio.Task[None] | None = None
        self.ready = asyncio.Event()
        """Set once this node listens (frames published before that do not reach it)."""

    def set_receiver(self, receiver: Receiver) -> None:
        self._receiver = receiver

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._listen(), name="cluster:webchat-fanout")
            await self.ready.wait()

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)

    async def publish(self, session_id: str, frame_text: str) -> None:
        payload = json.dumps([self._node, session_id, frame_text])
        try:
            await self._client.publish(self._keys.webchat_channel(session_id), payload)
        except (RedisError, OSError) as exc:  # other nodes' tabs resume from history
            log.warning("webchat fan-out failed: %s", exc)

    async def _listen(self) -> None:
        pattern = self._keys.webchat_pattern()
        listening = Outage("the webchat fan-out listener", log)
        while True:
            raise_if_cancelling()  # a cancel lost in the client ends the loop here
            pubsub = self._client.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.psubscribe(pattern)
                listening.worked()
                self.ready.set()
                async for item in pubsub.listen():
                    self._deliver(item.get("data"))
            except (RedisError, OSError) as exc:
                raise_if_cancelling()
                listening.failed(exc)
                await asyncio.sleep(0.5)
            finally:
                with contextlib.suppress(RedisError, OSError):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]

    def _deliver(self, data: object) -> None:
        if not isinstance(data, str) or self._receiver is None:
            return
        try:
            origin, session_id, frame_text = json.loads(data)
        except ValueError:
            log.warning("webchat fan-out: ignoring a malformed frame")
            return
        if origin != self._node:  # our own sockets got it when we published it
            self._receiver(session_id, frame_text)
