"""The inbound bus: accepted messages go onto shard streams; live nodes share the shards.

    owner of a connection --accept+XADD--> bus:in:<hash(thread) % shards>
    holder of that shard's lease --XREADGROUP--> router's per-thread executor --> handler
      --> complete + XACK (one script)

A thread always lands on the same shard and a shard is read by one node at a time (its lease),
so the messages of one thread are handled in order by one worker; threads of different shards
run on different nodes. Every node holds at most ceil(shards / live nodes) shards and lets go of
extras (after finishing what it had read of them), so load spreads when nodes join. A node that
could not start one of its connections holds none while another node can answer every message
(`Membership.shards_to_hold`): the messages of that connection it had to leave go with them. A
node that takes a shard first claims whatever the previous holder left unacknowledged
(XAUTOCLAIM, any consumer, no idle minimum: the lease makes it the only reader) and hands those
over marked *recovered*, before reading new entries. A read takes a shard's new entries only
while Redis says the lease is this node's (one script): a node yet to hear that its lease moved
on reads none that the new holder's take-over claim has missed.

A node that learns it lost a shard's lease (renewals failing for most of the TTL, or another
node holding it) cancels its turns of that shard's messages at once, and starts none of those
waiting for their thread: each is left unacknowledged for the shard's new holder. A turn that is
sending at that moment is cancelled once the send is over: cut mid-call, nobody would know
whether the platform took it (`claims.py` keeps the new holder from sending it again).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import zlib
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from talkbridge.cancellation import cancel_and_wait, raise_if_cancelling
from talkbridge.cluster import scripts
from talkbridge.cluster.keys import ClusterKeys
from talkbridge.cluster.lease import SURE_OF_LEASE, Lease, Membership
from talkbridge.cluster.streams import (
    Cycles,
    Entry,
    claim_all,
    ensure_group,
    remake_groups,
)
from talkbridge.config import ClusterConfig
from talkbridge.message import NormalizedMessage
from talkbridge.outage import Outage
from talkbridge.store.redis import _SEP, _history_json

log = logging.getLogger("talkbridge.cluster.inbound")

GROUP = "workers"
READ_COUNT = 256

LOST_SHARD = (
    "the turn was interrupted: this node lost its thread's shard to another node, "
    "which answers the message"
)
"""The reason a turn cancelled because its shard was lost gives (the watchers' `output.error`)."""

FRESH_LEASE = 0.5
"""A reply leaves only while the shard's lease was renewed within this part of its TTL: the
rest covers the send itself. Renewals come every third of the TTL, so normally at once."""


class Ack(Protocol):
    """How the handler finishes a message it took from the bus."""

    async def __call__(self) -> None:
        """Handled: acknowledge it."""

    def abandon(self) -> None:
        """Not handled here (the shard was lost mid-way): leave it pending for the shard's
        holder, this node included should it take the shard back."""

    def begin(self) -> bool:
        """The running task starts on the message: it is cancelled should the shard be lost
        (see `interrupted`). False when it is lost already: leave the message (`abandon`)."""

    def end(self) -> None:
        """The task is done with the message (before `__call__` or `abandon`)."""

    @property
    def interrupted(self) -> bool:
        """Whether the task was cancelled because the shard was lost (its `CancelledError` is
        this, not a stop: `uncancel` it)."""

    def sending(self) -> contextlib.AbstractContextManager[None]:
        """Around a send: a loss of the shard meanwhile cancels the task only once it is over."""


Take = Callable[[NormalizedMessage, bool, Ack], Awaitable[None]]
"""(message, recovered, ack): queue the message for its thread; finish it with `ack`."""


def shard_of(thread_key: str, shards: int) -> int:
    """Stable across processes and restarts (unlike `hash`)."""
    return zlib.crc32(thread_key.encode("utf-8")) % shards


@dataclass(slots=True, eq=False)
class _Shard:
    number: int
    stream: str
    lease: Lease
    active: bool = False
    """Read by the reader loop (false while claiming, releasing, or after the lease was lost)."""
    releasing: bool = False
    renewed_at: float = 0.0
    inflight: set[str] = field(default_factory=set)
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    turns: set[_EntryAck] = field(default_factory=set)
    """The acks of the entries whose turns run now: cancelled if the lease is lost."""


class InboundBus:
    def __init__(
        self,
        client: aioredis.Redis,
        keys: ClusterKeys,
        membership: Membership,
        config: ClusterConfig,
        *,
        note_connection: Callable[[str], None] = lambda _: None,
    ) -> None:
        self._client = client
        self._keys = keys
        self._note_connection = note_connection
        """The store's record of connections with dedupe ids (for its retention sweep)."""
        self._membership = membership
        self._node = membership.node_id
        self._config = config
        self._take: Take | None = None
        self._held: dict[int, _Shard] = {}
        self._work: dict[int, tuple[set[str], asyncio.Event]] = {}
        """Per shard number, the entries this node is handling and the event set when none
        are: kept across a lease lost and taken again (a Redis outage longer than the TTL), so
        the claim on retaking it does not hand this node's own unfinished entries over twice."""
        self._by_stream: dict[str, _Shard] = {}
        self._accept = client.register_script(scripts.ACCEPT_PUBLISH)
        self._complete = client.register_script(scripts.COMPLETE_ACK)
        self._ack = client.register_script(scripts.ACK)
        self._move = client.register_script(scripts.MOVE_ENTRY)
        self._read = client.register_script(scripts.FENCED_READ)
        self._balancer: asyncio.Task[None] | None = None
        self._reader: asyncio.Task[None] | None = None
        self._releases: set[asyncio.Task[None]] = set()
        self._wake = asyncio.Event()
        self._lease_news = asyncio.Event()
        """Set (and replaced) whenever a lease is renewed or lost: `still_holds` waits on it."""
        self._cycles = Cycles()
        self._reading = False
        self.block_ms = max(10, min(1000, round(config.lease_ttl * 1000 / 6)))

    def set_handler(self, take: Take) -> None:
        self._take = take

    def shard_of(self, thread_key: str) -> int:
        return shard_of(thread_key, self._config.shards)

    @property
    def held(self) -> list[int]:
        """Shards this node reads now."""
        return sorted(n for n, s in self._held.items() if s.active)

    async def still_holds(self, thread_key: str) -> bool:
        """Whether this node surely still holds the shard of `thread_key`, so a reply to one of
        its messages may leave. While unsure (renewals failing: Redis slow or away), wait for
        the next renewal or the loss. A node whose lease ran out during an outage would
        otherwise send its answer beside that of the shard's new holder."""
        number = self.shard_of(thread_key)
        loop = asyncio.get_running_loop()
        while True:
            news = self._lease_news
            shard = self._held.get(number)
            if shard is None:
                return False
            if loop.time() - shard.renewed_at <= self._ttl * FRESH_LEASE:
                return True
            await news.wait()

    def _lease_changed(self) -> None:
        news, self._lease_news = self._lease_news, asyncio.Event()
        news.set()

    # -- publishing (on the node that received the message) -----------------------------------

    async def publish(self, message: NormalizedMessage, *, record_history: bool) -> bool:
        """Dedupe and put on the bus in one step; False for a message seen before."""
        k = self._keys
        cid = message.connection_id
        self._note_connection(cid)
        keys = [k.seen(cid), k.pending(), k.bodies(), k.arrival()]
        keys += [k.seen_before_retention(cid), k.bus_in(self.shard_of(message.thread_key))]
        args = [message.id, cid + _SEP + message.id, message.model_dump_json()]
        if record_history:
            keys.append(k.history(message.thread_key))
            data = {"edit_of": message.edit_of} if message.edit_of else {}
            sender = message.display_name or message.channel_user_id
            now = datetime.now(UTC)
            args.append(_history_json("user", message.id, sender, message.text, now, data))
        return bool(await self._accept(keys=keys, args=args))

    # -- a changed shard count ----------------------------------------------------------------

    async def shard_layout(self) -> tuple[int | None, int]:
        """Read before this node joins (joining records its own `cluster.shards`): the shard
        count the waiting entries are sorted by (None: none was ever recorded), and how many
        shard streams may hold entries."""
        k = self._keys
        count, streams = (
            int(v) if v else None
            for v in await self._client.mget(k.shard_count(), k.shard_streams())
        )
        sorted_by = streams if streams is not None else count
        return sorted_by, max(count or 0, streams or 0)

    async def sort_shards(self, sorted_by: int | None, streams: int) -> None:
        """Move what waits on the shard streams onto the shards its threads map to now, when
        `cluster.shards` changed since the entries were put there (`sorted_by`): a thread maps
        to another shard then, and its new messages, read there by another node, would be
        answered before (or beside) those still waiting on its old shard; and no node reads
        the shards numbered `cluster.shards` or more at all. Moved entries count as recovered
        (a node may have worked on them). Several nodes may do this at once: each entry moves
        once, and each thread's entries in their order."""
        shards = self._config.shards
        if sorted_by is None or sorted_by == shards:  # only streams left by a start cut short
            numbers = range(shards, streams)
        else:
            numbers = range(max(shards, streams))
        for number in numbers:
            await self._sort_shard(number)
        await self._client.set(self._keys.shard_streams(), shards)

    async def _sort_shard(self, number: int) -> None:
        k = self._keys
        stream = k.bus_in(number)
        moved = 0
        after = "-"
        while True:
            entries: list[Entry] = list(
                await self._client.xrange(stream, min=after, count=READ_COUNT)  # type: ignore[arg-type]
            )
            if not entries:
                break
            after = "(" + entries[-1][0]
            for entry_id, fields in entries:
                try:
                    message = NormalizedMessage.model_validate_json(fields["m"])
                except (KeyError, ValueError) as exc:
                    log.error("shard %d: dropping unreadable entry %s: %s", number, entry_id, exc)
                    await self._client.xdel(stream, entry_id)
                    continue
                target = self.shard_of(message.thread_key)
                if target != number:
                    keys = [stream, k.bus_in(target)]
                    moved += await self._move(keys=keys, args=[entry_id, fields["m"]])
        if number >= self._config.shards:
            await self._client.delete(stream)
        if moved:
            log.warning(
                "shard %d: cluster.shards is %d now; moved %d waiting message(s) onto the "
                "shards of their threads",
                number,
                self._config.shards,
                moved,
            )

    # -- consuming ----------------------------------------------------------------------------

    async def start(self) -> None:
        if self._balancer is not None:
            return
        self._reading = True
        await self._balance()
        self._balancer = asyncio.create_task(self._balance_loop(), name="cluster:balance")
        self._reader = asyncio.create_task(self._read_loop(), name="cluster:inbound")

    async def stop_reading(self) -> None:
        """Stop taking entries; what was read still runs. Each shard is handed back once what
        was read of it is done, so other nodes take over its new entries while this one drains
        the rest (rather than when the whole node stops)."""
        self._reading = False
        reader, self._reader = self._reader, None
        if reader is not None:
            await cancel_and_wait(reader)
        for shard in list(self._held.values()):
            if not shard.releasing:
                self._release(shard, reading=False)
        with contextlib.suppress(RedisError, OSError):  # the others then share every shard
            await self._membership.leave()

    async def stop(self) -> None:
        """Stop everything and hand every shard back at once (after `stop_reading` + drain)."""
        await self.stop_reading()
        tasks = [t for t in (self._balancer, *self._releases) if t is not None]
        self._balancer = None
        await cancel_and_wait(*tasks)
        for shard in list(self._held.values()):
            with contextlib.suppress(RedisError, OSError):
                await shard.lease.release()
        self._held.clear()
        self._by_stream.clear()

    async def _balance_loop(self) -> None:
        next_reclaim = asyncio.get_running_loop().time() + self._config.claim_idle / 2
        balancing = Outage("shard balancing", log)
        while True:
            raise_if_cancelling()  # a cancel lost in the client ends the loop here
            await asyncio.sleep(self._config.lease_ttl / 3)
            try:
                await self._balance()
                now = asyncio.get_running_loop().time()
                if now >= next_reclaim:
                    next_reclaim = now + self._config.claim_idle / 2
                    await self._reclaim_stragglers()
                balancing.worked()
            except (RedisError, OSError) as exc:
                raise_if_cancelling()
                balancing.failed(exc)

    async def _balance(self) -> None:
        if not self._reading:  # draining: not counted among the nodes that share the shards
            await self._renew()
            return
        await self._membership.beat()
        await self._renew()
        target = self._membership.shards_to_hold(self._config.shards)
        mine = [s for s in self._held.values() if not s.releasing]
        if len(mine) > target:
            for shard in sorted(mine, key=lambda s: s.number, reverse=True)[: len(mine) - target]:
                self._release(shard)
            return
        free = [n for n in range(self._config.shards) if n not in self._held]
        random.shuffle(free)
        for number in free:
            if len(mine) >= target:
                break
            taken = await self._try_take(number)
            if taken is not None:
                mine.append(taken)

    async def _renew(self) -> None:
        loop = asyncio.get_running_loop()
        for shard in list(self._held.values()):
            try:
                if await shard.lease.renew():
                    shard.renewed_at = loop.time()
                    self._lease_changed()
                    continue
            except (RedisError, OSError) as exc:
                raise_if_cancelling()
                if loop.time() - shard.renewed_at <= self._config.lease_ttl * SURE_OF_LEASE:
                    log.info("shard %d: renewal failed (%s); retrying", shard.number, exc)
                    continue
            log.warning("shard %d: lease lost; no longer reading it", shard.number)
            self._lost(shard)

    def _drop(self, shard: _Shard) -> None:
        shard.active = False
        self._held.pop(shard.number, None)
        self._by_stream.pop(shard.stream, None)
        self._lease_changed()

    def _lost(self, shard: _Shard) -> None:
        """The lease ran out or another node took it: its new holder answers the shard's
        messages, so the turns under way here stop (their agents' work would be thrown away)."""
        self._drop(shard)
        if shard.inflight:  # one line, not one per message: a busy shard holds thousands
            log.info(
                "shard %d: cancelling %d turn(s) under way; its %d unfinished message(s) are "
                "left to its new holder",
                shard.number,
                len(shard.turns),
                len(shard.inflight),
            )
        for ack in list(shard.turns):
            ack.interrupt()

    def _holds(self, shard: _Shard) -> bool:
        return self._held.get(shard.number) is shard

    async def _try_take(self, number: int) -> _Shard | None:
        key = self._keys.lease("shard", str(number))
        lease = Lease(self._client, key, self._node, self._ttl, fence=self._keys.fence())
        if not (await lease.acquire()).held:
            return None
        inflight, idle = self._work.setdefault(number, (set(), asyncio.Event()))
        shard = _Shard(number, self._keys.bus_in(number), lease, inflight=inflight, idle=idle)
        shard.renewed_at = asyncio.get_running_loop().time()
        self._held[number] = shard
        self._by_stream[shard.stream] = shard
        try:
            await ensure_group(self._client, shard.stream, GROUP)
            claimed = await claim_all(
                self._client,
                shard.stream,
                GROUP,
                self._node,
                0,
                functools.partial(self._recover, shard),
            )
        except BaseException:
            self._drop(shard)
            with contextlib.suppress(RedisError, OSError):
                await lease.release()
            raise
        if claimed:
            log.info("shard %d: took over %d unacknowledged message(s)", number, claimed)
        if self._held.get(number) is shard:
            shard.active = True
            self._wake.set()
        return shard

    @property
    def _ttl(self) -> float:
        return self._config.lease_ttl

    def _release(self, shard: _Shard, *, reading: bool = True) -> None:
        """Let go of a shard another node should have: stop reading it, finish what was read
        of it, then release the lease so the other node need not wait for it to run out.
        `reading`: the reader still runs (one of its reads may include the shard)."""
        shard.releasing = True
        shard.active = False
        seen = self._cycles.count

        async def release() -> None:
            if reading:  # no read that might include it is outstanding
                await self._cycles.wait_past(seen)
            while shard.inflight:
                shard.idle.clear()
                await shard.idle.wait()
            if self._held.get(shard.number) is shard:
                self._drop(shard)
                with contextlib.suppress(RedisError, OSError):
                    await shard.lease.release()

        task = asyncio.create_task(release(), name=f"cluster:release-shard-{shard.number}")
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)

    async def _reclaim_stragglers(self) -> None:
        """Entries left unacknowledged in a held shard for `claim_idle` (read by a node in the
        instant it lost the shard) are taken over; what this node is working on is skipped."""
        idle_ms = round(self._config.claim_idle * 1000)
        for shard in [s for s in self._held.values() if s.active]:
            await claim_all(
                self._client,
                shard.stream,
                GROUP,
                self._node,
                idle_ms,
                functools.partial(self._recover, shard),
            )

    async def _recover(self, shard: _Shard, entry: Entry) -> None:
        await self._dispatch(shard, entry, recovered=True)

    async def _read_loop(self) -> None:
        reading = Outage("reading the inbound bus", log)
        loop = asyncio.get_running_loop()
        while self._reading:
            raise_if_cancelling()  # a cancel lost in the client ends the loop here
            # Only shards whose lease outlasts this read for sure. After a pause (a stopped
            # process, a Redis outage) renewals have not run yet; another node may hold the
            # shard by now. (The read itself takes entries only while Redis says the lease
            # is this node's: see `_read_new`.)
            renewed_since = loop.time() + self.block_ms / 1000 - self._ttl * SURE_OF_LEASE
            shards = [s for s in self._held.values() if s.active and s.renewed_at >= renewed_since]
            if not shards:
                self._wake.clear()
                self._cycles.bump()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.block_ms / 1000)
                continue
            try:
                waiting = await self._read_new(shards)
                self._cycles.bump()  # after dispatching: a shard being released counts them in
                if waiting:  # nothing new: wait for an entry (reading none: another may hold it)
                    await self._client.xread(waiting, count=1, block=self.block_ms)
                    self._cycles.bump()
            except (RedisError, OSError) as exc:
                raise_if_cancelling()
                reading.failed(exc)
                self._cycles.bump()
                await asyncio.sleep(self.block_ms / 1000)
                continue
            reading.worked()

    async def _read_new(self, shards: list[_Shard]) -> dict[Any, Any]:
        """Read and dispatch the new entries of `shards`, each only while Redis says its lease
        is this node's: a read that reaches Redis after the lease moved (this node paused, or
        it has yet to hear of the loss at its next renewal) would take entries that the new
        holder, its take-over claim over, leaves to its straggler sweep (`claim_idle`). A shard
        found held by another (or by nobody) is lost at once. Returns, when nothing was new,
        the last entry id each stream's group was given (to wait for newer ones)."""
        keys = [k for s in shards for k in (s.lease.key, s.stream)]
        answers = await self._read(keys=keys, args=[self._node, GROUP, READ_COUNT])
        waiting: dict[Any, Any] = {}
        gone: list[str] = []
        for shard, answer in zip(shards, answers, strict=True):
            state = int(answer[0])
            if state == 0:
                if self._holds(shard):
                    log.warning("shard %d: lease lost; no longer reading it", shard.number)
                    self._lost(shard)
            elif state == 1:
                waiting[shard.stream] = answer[1]
            elif state == 3:
                gone.append(shard.stream)
            else:
                held = self._by_stream.get(shard.stream)
                for entry_id, flat in answer[1]:
                    if held is None:  # lost meanwhile: whoever takes it next claims these
                        continue
                    fields = dict(zip(flat[::2], flat[1::2], strict=True))
                    await self._dispatch(held, (entry_id, fields), recovered=False)
        if gone:  # made again; read at once
            await remake_groups(self._client, gone, GROUP, log)
            return {}
        return waiting if len(waiting) == len(shards) else {}

    async def _dispatch(self, shard: _Shard, entry: Entry, *, recovered: bool) -> None:
        entry_id, fields = entry
        if entry_id in shard.inflight:
            return
        recovered = recovered or fields.get("r") == "1"  # moved from a dropped shard
        try:
            message = NormalizedMessage.model_validate_json(fields["m"])
        except (KeyError, ValueError) as exc:
            log.error("shard %d: dropping unreadable entry %s: %s", shard.number, entry_id, exc)
            await self._ack(keys=[shard.stream], args=[GROUP, entry_id])
            return
        assert self._take is not None, "InboundBus.set_handler was not called"
        shard.inflight.add(entry_id)
        member = message.connection_id + _SEP + message.id
        keys = [self._keys.pending(), self._keys.bodies(), shard.stream]

        await self._take(message, recovered, _EntryAck(self, shard, entry_id, keys, member))

    def _finished(self, shard: _Shard, entry_id: str) -> None:
        shard.inflight.discard(entry_id)
        if not shard.inflight:
            shard.idle.set()


class _EntryAck:
    """`Ack` of one bus entry."""

    __slots__ = (
        "_bus",
        "_entry_id",
        "_interrupt_pending",
        "_keys",
        "_member",
        "_sending",
        "_shard",
        "_task",
        "interrupted",
    )

    def __init__(
        self, bus: InboundBus, shard: _Shard, entry_id: str, keys: list[str], member: str
    ) -> None:
        self._bus, self._shard, self._entry_id = bus, shard, entry_id
        self._keys, self._member = keys, member
        self._task: asyncio.Task[Any] | None = None
        self._sending = 0
        self._interrupt_pending = False
        self.interrupted = False

    async def __call__(self) -> None:
        try:
            await self._bus._complete(keys=self._keys, args=[self._member, GROUP, self._entry_id])
        except (RedisError, OSError) as exc:  # stays pending: handled again, idempotently
            log.warning("acknowledging %s failed: %s", self._entry_id, exc)
        finally:
            self._bus._finished(self._shard, self._entry_id)

    def abandon(self) -> None:
        log.debug(  # `_lost` said how many
            "shard %d: lost while %s was being answered; its new holder answers it",
            self._shard.number,
            self._entry_id,
        )
        self._bus._finished(self._shard, self._entry_id)

    def begin(self) -> bool:
        if not self._bus._holds(self._shard):
            return False
        self._task = asyncio.current_task()
        self._shard.turns.add(self)
        return True

    def end(self) -> None:
        self._shard.turns.discard(self)
        self._task = None

    @contextlib.contextmanager
    def sending(self) -> Iterator[None]:
        self._sending += 1
        try:
            yield
        finally:
            self._sending -= 1
            if not self._sending and self._interrupt_pending:
                self.interrupt()

    def interrupt(self) -> None:
        """The shard was lost: cancel the task, now or once its send is over."""
        if self._task is None or self.interrupted:
            return
        if self._sending:
            self._interrupt_pending = True
            return
        self._interrupt_pending = False
        self.interrupted = True
        self._task.cancel(LOST_SHARD)
