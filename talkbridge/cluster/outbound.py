"""Sends through the node that owns the destination connection.

    any node --XADD--> bus:out:<connection>  (request id, sender node, message, deadline)
    owner of the connection --XREADGROUP, while Redis says it holds the lease--> its local
        OutboundQueue --> platform
    owner --XADD--> bus:reply:<sender node> (SendResult or the failure's reason) --> future

Only the lease holder of a connection reads its request stream, and a read takes requests only
while Redis says the lease is the reader's (one script, `scripts.FENCED_READ`): a node that lost
the connection, whether it has heard so yet or not, takes none, so whatever the new owner's
takeover claim did not find is new, and the new owner reads it in stream order. When nothing is
new the owner waits with a plain XREAD, which takes nothing. When a node takes a connection over
it first claims the requests the previous owner read but never acknowledged, oldest first,
before any new one; those are sent with the idempotency check on, so a request the previous
owner already sent is answered from the store instead of reaching the platform twice. A request
the previous owner took and had yet to send (queued behind others, or waiting out a rate limit)
does not go out twice either: a keyed one is claimed (`claims.py`); right before the platform
call of a keyless one the queue checks the lease in Redis (`Cluster.fence`), and a node that
lost it leaves the request, unanswered, to the new owner. A request whose sender stopped waiting
is not sent. Requests a read brings back just after the node learnt of the loss (it read them
while it still held the lease) stay pending for the next owner's claim.
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
from dataclasses import dataclass
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
from talkbridge.errors import ConnectionMovedError, SendFailedError
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
READ_COUNT = 256
"""Requests one read takes from a stream at most."""
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


@dataclass(eq=False)
class _Served:
    """A connection whose requests this node reads, from its `own` until its `disown` (one
    object each time: a read that outlives the connection's loss is told by it)."""

    connection_id: str


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
        self._served: dict[str, _Served] = {}  # stream -> its connection, read by the serve loop
        self._claiming: set[str] = set()
        self._handling: set[asyncio.Task[None]] = set()
        self._reply_script = client.register_script(scripts.REPLY)
        self._ack = client.register_script(scripts.ACK)
        self._read = client.register_script(scripts.FENCED_READ)
        self._replies: asyncio.Task[None] | None = None
        self._server: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._cycles = Cycles()
        self._serving = False

    def set_local(self, send: LocalSend) -> None:
        self._local = send

    @property
    def serving(self) -> list[str]:
        return sorted(s.connection_id for s in self._served.values())

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
                self._served[stream] = _Served(connection_id)
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
            served = dict(self._served)
            if not served:
                self._wake.clear()
                self._cycles.bump()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self._block_ms / 1000)
                continue
            try:
                waiting = await self._read_new(served)
                self._cycles.bump()
                if waiting:  # nothing new: wait for a request (reading none: it may move)
                    await self._client.xread(waiting, count=1, block=self._block_ms)
                    self._cycles.bump()
            except (RedisError, OSError) as exc:
                raise_if_cancelling()
                if group_gone(exc):  # a stream waited on is gone: the next read makes it again
                    continue
                reading.failed(exc)
                self._cycles.bump()
                await asyncio.sleep(self._block_ms / 1000)
                continue
            reading.worked()

    async def _read_new(self, served: dict[str, _Served]) -> dict[Any, Any]:
        """Read the new requests of the `served` streams and start sending them, each stream
        only while Redis says this node holds its connection's lease: a read that reaches Redis
        after the lease moved (this node paused, or yet to hear of the loss at its next
        renewal) would take requests the new owner, its takeover claim over, never sees; put
        back, they would go out after later ones. A stream found leased to another (or to
        nobody) is read no more; the registry hears of the loss at its renewal. Returns, when
        nothing was new, the last entry id each stream's group was given (to wait for newer
        ones)."""
        streams = list(served)
        keys = [k for s in streams for k in (self._keys.lease("conn", served[s].connection_id), s)]
        answers = await self._read(keys=keys, args=[self._node, GROUP, READ_COUNT])
        waiting: dict[Any, Any] = {}
        gone: list[str] = []
        for stream, answer in zip(streams, answers, strict=True):
            state = int(answer[0])
            if state == 0:
                if self._served.get(stream) is served[stream]:
                    log.warning(
                        "%s: the connection's lease is not this node's; no longer sending "
                        "its requests",
                        served[stream].connection_id,
                    )
                    self._served.pop(stream, None)
            elif state == 1:
                waiting[stream] = answer[1]
            elif state == 3:
                gone.append(stream)
            else:
                for entry_id, flat in answer[1]:
                    # Lost meanwhile (even if taken back since, whose claim took these): the
                    # next owner claims them, in their order, before it reads anything newer.
                    if self._served.get(stream) is not served[stream]:
                        continue
                    fields = dict(zip(flat[::2], flat[1::2], strict=True))
                    cid = served[stream].connection_id
                    await self._take(cid, stream, (entry_id, fields), reclaimed=False)
        if gone:  # made again; read at once
            await remake_groups(self._client, gone, GROUP, log)
            return {}
        return waiting if len(waiting) == len(streams) else {}

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
        except ConnectionMovedError:  # nothing sent: left pending, the new owner's claim has it
            log.info("%s: moved to another node before send request %s went out", cid, entry_id)
            return
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
