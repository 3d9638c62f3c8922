"""Sends through the node that owns the destination connection.

    any node --XADD--> bus:out:<connection>  (request id, sender node, message, deadline)
    owner of the connection --XREADGROUP--> its local OutboundQueue --> platform
    owner --XADD--> bus:reply:<sender node> (SendResult or the failure's reason) --> future

Only the lease holder of a connection reads its request stream. When it takes a connection over
it first claims the requests the previous owner read but never acknowledged; those are sent with
the idempotency check on, so a request the dead owner already sent is answered from the store
instead of reaching the platform twice. A request whose sender stopped waiting is not sent.
A live node whose read comes back after it lost the connection (the new owner's claim may be
over by then) puts the requests it got back on the stream, for the new owner to read.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from talkbridge.backoff import Backoff
from talkbridge.cancellation import cancel_and_wait, raise_if_cancelling
from talkbridge.cluster import scripts
from talkbridge.cluster.keys import ClusterKeys
from talkbridge.cluster.streams import (
    Cycles,
    Entry,
    claim_all,
    ensure_group,
    group_gone,
    read_entries,
    remake_groups,
)
from talkbridge.errors import SendFailedError
from talkbridge.message import OutboundMessage, SendResult
from talkbridge.outage import Outage

log = logging.getLogger("talkbridge.cluster.outbound")


async def until_written(write: Callable[[], Awaitable[Any]], seconds: float) -> None:
    """Run a bus write; while Redis cannot be reached, again with backoff, for up to `seconds`
    (then its error is raised). A Redis restart then delays a send instead of losing it."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + seconds
    backoff = Backoff(base=0.25, cap=5.0)
    while True:
        try:
            await write()
            return
        except (RedisError, OSError):
            raise_if_cancelling()
            delay = backoff.next()
            if loop.time() + delay > give_up:
                raise
            await asyncio.sleep(delay)


GROUP = "owner"
REPLY_TTL_MS = 24 * 3600 * 1000
"""A reply stream outlives its node by a day at most."""

LocalSend = Callable[[str, OutboundMessage, bool], Awaitable[SendResult]]
"""(connection id, message, check_sent): send through this node's own queue."""


def encode(message: OutboundMessage) -> dict[str, str]:
    """The message as stream fields; attachment bytes (excluded from JSON) travel base64."""
    fields = {"m": message.model_dump_json()}
    if any(a.data is not None for a in message.attachments):
        data = [
            None if a.data is None else base64.b64encode(a.data).decode()
            for a in message.attachments
        ]
        fields["a"] = json.dumps(data)
    return fields


def decode(fields: dict[str, str]) -> OutboundMessage:
    message = OutboundMessage.model_validate_json(fields["m"])
    if "a" in fields:
        data = json.loads(fields["a"])
        attachments = tuple(
            a if d is None else a.model_copy(update={"data": base64.b64decode(d)})
            for a, d in zip(message.attachments, data, strict=True)
        )
        message = message.model_copy(update={"attachments": attachments})
    return message


class OutboundBus:
    def __init__(
        self,
        client: aioredis.Redis,
        keys: ClusterKeys,
        node_id: str,
        *,
        timeout: float,
        block_ms: int,
    ) -> None:
        self._client = client
        self._keys = keys
        self._node = node_id
        self.timeout = timeout
        self._block_ms = block_ms
        self._local: LocalSend | None = None
        self._reply_key = keys.bus_reply(node_id)
        self._futures: dict[str, asyncio.Future[SendResult]] = {}
        self._served: dict[str, str] = {}  # stream -> connection id, read by the serve loop
        self._claiming: set[str] = set()
        self._handling: set[asyncio.Task[None]] = set()
        self._reply_script = client.register_script(scripts.REPLY)
        self._ack = client.register_script(scripts.ACK)
        self._give_back = client.register_script(scripts.GIVE_BACK)
        self._replies: asyncio.Task[None] | None = None
        self._server: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._cycles = Cycles()
        self._serving = False

    def set_local(self, send: LocalSend) -> None:
        self._local = send

    @property
    def serving(self) -> list[str]:
        return sorted(self._served.values())

    async def start(self) -> None:
        # Replies to an earlier process with this node id answer nobody now.
        await self._client.delete(self._reply_key)
        self._serving = True
        self._replies = asyncio.create_task(self._read_replies(), name="cluster:replies")
        self._server = asyncio.create_task(self._serve(), name="cluster:outbound")

    async def stop_serving(self) -> None:
        """Stop reading requests; requests already taken are sent and answered."""
        self._serving = False
        server, self._server = self._server, None
        if server is not None:
            await cancel_and_wait(server)
        self._served.clear()
        if self._handling:
            await asyncio.gather(*list(self._handling), return_exceptions=True)

    async def stop(self) -> None:
        await self.stop_serving()
        replies, self._replies = self._replies, None
        if replies is not None:
            await cancel_and_wait(replies)
        for future in self._futures.values():
            if not future.done():
                future.cancel()
        self._futures.clear()

    # -- asking the owner ---------------------------------------------------------------------

    async def request(
        self, connection_id: str, message: OutboundMessage, *, check_sent: bool
    ) -> SendResult:
        rid = uuid.uuid4().hex
        future: asyncio.Future[SendResult] = asyncio.get_running_loop().create_future()
        self._futures[rid] = future
        deadline = int((time.time() + self.timeout) * 1000)
        fields = {
            "r": rid,
            "n": self._node,
            "c": "1" if check_sent else "0",
            "d": str(deadline),
            **encode(message),
        }
        tries = 0

        async def add() -> None:
            nonlocal tries
            tries += 1
            if tries > 1:  # the earlier one may have arrived: the owner checks before sending
                fields["c"] = "1"
            await self._client.xadd(self._keys.bus_out(connection_id), fields)  # type: ignore[arg-type]

        try:
            try:
                await until_written(add, self.timeout)
            except (RedisError, OSError) as exc:
                raise SendFailedError(
                    connection_id, message.thread_id, f"cannot reach the bus: {exc}"
                ) from exc
            try:
                async with asyncio.timeout(self.timeout):
                    return await future
            except TimeoutError:
                raise SendFailedError(
                    connection_id,
                    message.thread_id,
                    f"no node that owns connection {connection_id!r} sent it within "
                    f"{self.timeout:g} s",
                ) from None
        finally:
            self._futures.pop(rid, None)

    async def _read_replies(self) -> None:
        last = "0"
        reading = Outage("reading send replies", log)
        while True:
            raise_if_cancelling()  # a cancel lost in the client ends the loop here
            try:
                result = await self._client.xread({self._reply_key: last}, block=1000, count=512)
            except (RedisError, OSError) as exc:
                raise_if_cancelling()
                reading.failed(exc)
                await asyncio.sleep(0.5)
                continue
            reading.worked()
            done: list[str] = []
            for _, entries in read_entries(result):
                for entry_id, fields in entries:
                    last = entry_id
                    done.append(entry_id)
                    self._resolve(fields)
            if done:
                with contextlib.suppress(RedisError, OSError):
                    await self._client.xdel(self._reply_key, *done)

    def _resolve(self, fields: dict[str, str]) -> None:
        future = self._futures.get(fields.get("r", ""))
        if future is None or future.done():
            return  # the sender gave up (timeout) or the answer came twice (a redelivery)
        if fields.get("ok") == "1":
            future.set_result(SendResult(message_ids=tuple(json.loads(fields["v"]))))
        else:
            future.set_exception(
                SendFailedError(fields.get("cid", "?"), fields.get("t", "?"), fields.get("e", "?"))
            )

    # -- serving as the owner -----------------------------------------------------------------

    async def own(self, connection_id: str) -> None:
        """Start sending the requests of a connection this node now owns: first what the
        previous owner took but never answered, then new ones."""
        stream = self._keys.bus_out(connection_id)
        if stream in self._served or stream in self._claiming:
            return
        self._claiming.add(stream)
        try:
            await ensure_group(self._client, stream, GROUP)
            claimed = await claim_all(
                self._client,
                stream,
                GROUP,
                self._node,
                0,
                lambda entry: self._take(connection_id, stream, entry, reclaimed=True),
            )
            if claimed:
                log.info("%s: took over %d unanswered send(s)", connection_id, claimed)
            if self._serving and stream in self._claiming:
                self._served[stream] = connection_id
                self._wake.set()
        finally:
            self._claiming.discard(stream)

    def disown(self, connection_id: str) -> None:
        stream = self._keys.bus_out(connection_id)
        self._claiming.discard(stream)
        self._served.pop(stream, None)

    async def _serve(self) -> None:
        reading = Outage("reading send requests", log)
        while True:
            raise_if_cancelling()  # a cancel lost in the client ends the loop here
            streams: dict[Any, Any] = dict.fromkeys(self._served, ">")
            if not streams:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self._block_ms / 1000)
                continue
            try:
                result = await self._client.xreadgroup(
                    GROUP, self._node, streams, count=256, block=self._block_ms
                )
            except (RedisError, OSError) as exc:
                raise_if_cancelling()
                if group_gone(exc):
                    with contextlib.suppress(RedisError, OSError):  # else: the next read
                        await remake_groups(self._client, streams, GROUP, log)
                        continue
                reading.failed(exc)
                await asyncio.sleep(self._block_ms / 1000)
                continue
            reading.worked()
            for name, entries in read_entries(result):
                cid = self._served.get(name)
                for entry in entries:
                    if cid is not None:
                        await self._take(cid, name, entry, reclaimed=False)
                    else:  # the connection was lost while reading
                        await self._hand_back(name, entry)
            self._cycles.bump()

    async def _hand_back(self, stream: str, entry: Entry) -> None:
        """Put a request this node read after losing its connection back on the stream: left
        pending here, no node would send it (the new owner claimed what was pending already)."""
        entry_id, fields = entry
        args = [GROUP, self._node, entry_id, *(x for kv in fields.items() for x in kv)]
        try:
            await self._give_back(keys=[stream], args=args)
        except (RedisError, OSError) as exc:
            raise_if_cancelling()
            log.warning("handing send request %s back failed: %s", entry_id, exc)

    async def _take(self, cid: str, stream: str, entry: Entry, *, reclaimed: bool) -> None:
        # A task per request, created in stream order: each reaches the connection's queue
        # (ordered per thread) before the next starts, so per-thread order holds.
        task = asyncio.create_task(self._handle(cid, stream, entry, reclaimed))
        self._handling.add(task)
        task.add_done_callback(self._handling.discard)

    async def _handle(self, cid: str, stream: str, entry: Entry, reclaimed: bool) -> None:
        entry_id, fields = entry
        rid, sender = fields.get("r", ""), fields.get("n", "")
        reply: dict[str, str] = {"r": rid, "cid": cid}
        try:
            message = decode(fields)
            reply["t"] = message.thread_id
            if int(fields.get("d", "0")) < time.time() * 1000:
                raise SendFailedError(cid, message.thread_id, "the sender stopped waiting")
            assert self._local is not None, "OutboundBus.set_local was not called"
            check = reclaimed or fields.get("c") == "1"
            result = await self._local(cid, message, check)
            reply.update(ok="1", v=json.dumps(list(result.message_ids)))
        except SendFailedError as exc:
            reply.update(ok="0", e=exc.reason)
        except (KeyError, ValueError) as exc:
            reply.update(ok="0", e=f"unreadable send request: {exc}")
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # never leave the sender waiting for its timeout
            log.exception("%s: a send request failed", cid)
            reply.update(ok="0", e=f"{type(exc).__name__} on the owner node")
        args: list[str | int] = [REPLY_TTL_MS, *(x for kv in reply.items() for x in kv)]

        async def answer() -> None:
            if sender:
                await self._reply_script(keys=[self._keys.bus_reply(sender)], args=args)
            await self._ack(keys=[stream], args=[GROUP, entry_id])

        try:  # the message went out: the asking node must hear it, or it reports a failure
            await until_written(answer, self.timeout)
        except (RedisError, OSError) as exc:  # stays pending: the next owner answers it again
            log.warning("%s: answering send request %s failed: %s", cid, entry_id, exc)
