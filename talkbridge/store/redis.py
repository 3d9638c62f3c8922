"""The distributed store: every node of one deployment shares one Redis (redis-py asyncio).

Order: all operations of one `RedisStore` go through one writer task that sends whatever has
queued up as one non-transactional pipeline, in call order, over one connection at a time. So a
fire-and-forget call (`complete_inbound`, `map_id`, `record_sent`, `queue_history`) is applied
before anything issued after it, exactly as with SQLite, and a burst of calls costs one round
trip. Each operation is exactly one command: a multi-key step is one Lua script (atomic on the
server), so pipelining never splits an operation.

Every key comes from `RedisKeys`, which namespaces them under the configured prefix.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Final, get_args

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from talkbridge.backoff import Backoff
from talkbridge.errors import PairingExpiredError, StoreError
from talkbridge.message import NormalizedMessage, utcnow
from talkbridge.store import _redis_lua as lua
from talkbridge.store.base import (
    EXPIRED_PAIRINGS_KEPT,
    FORGET_EXPIRED_PER_CALL,
    Appended,
    FailedSend,
    HistoryEntry,
    HookDelivery,
    Pairing,
    Pruned,
    Retention,
    Role,
    check_history_window,
    once_key,
    state_deadline,
)

log = logging.getLogger("talkbridge.store")

_ROLES = frozenset(get_args(Role))
MAX_BATCH: Final = 2048
"""Commands per pipeline, so one huge backlog does not delay every reply."""
_SEP: Final = "\x1f"
FORGET_STEP: Final = 1000
"""History entries one `forget_history` script looks at: a long thread is searched in steps."""


def _part(value: str) -> str:
    # ':' separates key parts, so escape it (and the escape character) inside a part.
    return value.replace("%", "%25").replace(":", "%3A")


class RedisKeys:
    """The one place Redis key names are made: `{prefix}:{kind}:{escaped part}...`."""

    def __init__(self, prefix: str) -> None:
        if not prefix:
            raise ValueError("the redis key prefix must not be empty")
        self.prefix = prefix

    def _key(self, *parts: str) -> str:
        return ":".join((self.prefix, *map(_part, parts)))

    def part_of(self, key: str, kind: str) -> str:
        """The last part of a `{prefix}:{kind}:{part}` key, unescaped (`kind` may hold ':')."""
        head = f"{self.prefix}:{kind}:"
        if not key.startswith(head):
            raise ValueError(f"{key!r} is not a {kind} key")
        return key[len(head) :].replace("%3A", ":").replace("%25", "%")

    def pattern(self) -> str:
        """Glob matching every key of this prefix (for cleanup)."""
        return self.prefix.replace("[", "\\[").replace("*", "\\*").replace("?", "\\?") + ":*"

    # inbound inbox
    def seen(self, connection_id: str) -> str:
        """Ids of accepted messages, scored by arrival number (so `prune` can age them)."""
        return self._key("in", "seenz", connection_id)

    def seen_before_retention(self, connection_id: str) -> str:
        """The set of ids from before retention existed: still read, dropped by `prune`."""
        return self._key("in", "seen", connection_id)

    def pending(self) -> str:
        return self._key("in", "pending")

    def bodies(self) -> str:
        return self._key("in", "body")

    def arrival(self) -> str:
        return self._key("in", "arrival")

    # history, id map, outbound
    def history(self, thread_key: str) -> str:
        return self._key("history", thread_key)

    def id_map(self, connection_id: str) -> str:
        return self._key("idmap", connection_id)

    def id_reverse(self, connection_id: str) -> str:
        return self._key("idrev", connection_id)

    def sent(self, connection_id: str) -> str:
        return self._key("sent2", connection_id)

    def sent_order(self, connection_id: str) -> str:
        """Idempotency keys scored by a counter (so `prune` can age them)."""
        return self._key("sentz", connection_id)

    def sent_count(self) -> str:
        return self._key("sentcount")

    def sent_before_retention(self, connection_id: str) -> str:
        return self._key("sent", connection_id)

    def prune_marks(self, table: str) -> str:
        return self._key("prune", table)

    def swept_connections(self) -> str:
        """Every connection id with dedupe or send records: what `prune` sweeps, without a
        SCAN of the whole keyspace."""
        return self._key("prune", "connections")

    def prune_done(self, what: str) -> str:
        """Set once per deployment when a one-time step of the sweep has been done."""
        return self._key("prune", "done", what)

    def failed_sends(self) -> str:
        return self._key("failed")

    # trust, pairing, state
    def trusted(self, connection_id: str) -> str:
        return self._key("trusted", connection_id)

    def pairings(self) -> str:
        return self._key("pairing", "all")

    def pairing_order(self) -> str:
        return self._key("pairing", "order")

    def pairing_pending(self) -> str:
        return self._key("pairing", "pending")

    def pairing_seq(self) -> str:
        return self._key("pairing", "seq")

    def pairing_expiry(self) -> str:
        """Pending pairings that expire, scored by when (epoch seconds)."""
        return self._key("pairing", "expiry")

    def state(self) -> str:
        """The hash of the state kept for good."""
        return self._key("state")

    def expiring_state(self, key: str) -> str:
        """A state entry with a deadline: a key of its own, since a hash field cannot expire
        before Redis 7.4 (the supported Redis is Debian's, 7.0)."""
        return self._key("statex", key)

    # durable hook queue
    def hook_seq(self) -> str:
        return self._key("hook", "seq")

    def hook_delivery(self, delivery_id: int | str) -> str:
        """`hook_delivery("")` is the prefix the Lua scripts append ids to."""
        return self._key("hook", "d", "") + str(delivery_id)

    def hook_ids(self) -> str:
        return self._key("hook", "ids")

    def hook_by_time(self) -> str:
        return self._key("hook", "bytime")

    def hook_queue(self, app_id: str, handler: str) -> str:
        return self._key("hook", "q", app_id, handler)

    def hook_queues(self, app_id: str) -> str:
        return self._key("hook", "queues", app_id)


def reconnecting() -> dict[str, Any]:
    """Connection options for every client of the store and the cluster: a command that meets
    a connection Redis closed (a restart, an idle timeout, a failover) is sent again on a new
    one, as redis-py does for a client made without a URL. A client made from a URL gets no
    retries: the first write after a Redis restart failed, and a reply was lost with it."""
    return {
        "retry": Retry(ExponentialWithJitterBackoff(base=0.05, cap=1.0), 3),
        "retry_on_error": [RedisConnectionError, RedisTimeoutError],
    }


def _describe(client: aioredis.Redis) -> str:
    """host:port/db (or the socket path), never a password."""
    kw = client.connection_pool.connection_kwargs
    if "path" in kw:
        return f"unix:{kw['path']}/{kw.get('db', 0)}"
    return f"{kw.get('host', 'localhost')}:{kw.get('port', 6379)}/{kw.get('db', 0)}"


def _encode(arg: Any) -> Any:
    if isinstance(arg, str):
        try:
            return arg.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(
                f"cannot store {arg!r}: it is not valid Unicode text ({exc})"
            ) from None
    return arg


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _opt_text(value: Any) -> str | None:
    return None if value is None else _text(value)


def _iso(value: datetime, what: str) -> str:
    if value.tzinfo is None:
        raise ValueError(f"{what} must be timezone-aware, got naive {value.isoformat()}")
    return value.astimezone(UTC).isoformat()


def _epoch(value: datetime, what: str) -> str:
    if value.tzinfo is None:
        raise ValueError(f"{what} must be timezone-aware, got naive {value.isoformat()}")
    return repr(value.timestamp())


def _new_entry(
    thread_key: str,
    role: Role,
    message_id: str,
    sender: str,
    text: str,
    data: dict[str, Any] | None,
) -> tuple[str, HistoryEntry]:
    """A history entry (seq still 0: the script assigns it) and its stored JSON."""
    data = dict(data) if data else {}
    now = datetime.now(UTC)
    raw = _history_json(role, message_id, sender, text, now, data)
    return raw, HistoryEntry(0, thread_key, role, message_id, sender, text, now, data)


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _text_list(value: Any) -> list[str]:
    return [_text(v) for v in value]


def _scan_page(value: Any) -> tuple[int, list[str]]:
    cursor, keys = value
    return int(cursor), [_text(k) for k in keys]


def _code_key(code: str) -> str:
    return code.strip().casefold()


@dataclass(slots=True)
class _Op:
    args: tuple[Any, ...]
    parse: Callable[[Any], Any]
    future: asyncio.Future[Any] | None
    tries: int = 0


NOWAIT_RETRIES = 8
"""Sends of a write nobody waits for while Redis is unreachable (45 to 90 s, jittered):
such a write (a reply's sent record, an inbound message's completion) lost means a turn run
or a reply sent twice."""


def _identity(value: Any) -> Any:
    return value


class _PipelineWriter:
    """One task sending queued operations as pipelines, in order (see the module docstring)."""

    def __init__(self, client: aioredis.Redis, where: str, scripts: dict[str, str]) -> None:
        self._client = client
        self._where = where
        self._scripts = scripts
        self._queue: asyncio.Queue[_Op | None] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self._retries: dict[asyncio.TimerHandle, list[_Op]] = {}
        self._requeued = 0
        """Writes put back in the queue to be sent again, not yet through or given up."""
        self.failing: str | None = None
        """Why the last batch could not reach Redis, until one does again (for `/healthz`)."""

    @property
    def running(self) -> bool:
        return self._task is not None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"talkbridge-redis:{self._where}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        waiting = [op for ops in self._retries.values() for op in ops]
        for timer in self._retries:
            timer.cancel()
        self._retries.clear()
        if waiting:
            log.error(
                "%d store writes to %s were still waiting for Redis and are lost",
                len(waiting),
                self._where,
            )
        self._queue.put_nowait(None)
        await task

    def submit(self, op: _Op) -> None:
        if self._task is None:
            raise StoreError(f"the redis store at {self._where} is not open")
        self._queue.put_nowait(op)

    async def _run(self) -> None:
        while True:
            batch = [await self._queue.get()]
            while len(batch) < MAX_BATCH and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            ops = [op for op in batch if op is not None]
            if ops:
                await self._execute(ops)
            if batch[-1] is None:
                return

    async def _send(self, ops: list[_Op]) -> list[Any]:
        pipe = self._client.pipeline(transaction=False)
        for op in ops:
            pipe.execute_command(*op.args)
        return await pipe.execute(raise_on_error=False)

    async def _execute(self, ops: list[_Op]) -> None:
        try:
            results = await self._send(ops)
            self.failing = None
            if self._requeued:  # only while writes sent again are under way: not per batch
                resent = sum(1 for op in ops if op.tries)
                self._requeued -= resent
                if resent:
                    log.info(
                        "%d store writes to %s went through when sent again", resent, self._where
                    )
            missing = [i for i, r in enumerate(results) if isinstance(r, NoScriptError)]
            if missing:
                # The server lost its script cache (restart, SCRIPT FLUSH): load and re-run
                # only those, which did not run at all.
                await self._load_scripts()
                retried = await self._send([ops[i] for i in missing])
                for i, r in zip(missing, retried, strict=True):
                    results[i] = r
        except (RedisError, OSError) as exc:
            err = StoreError(f"redis store at {self._where}: {exc}")
            err.__cause__ = exc
            self.failing = str(err)
            results = [err] * len(ops)
            if self._requeued:  # those sent again are out of the queue once more
                self._requeued -= sum(1 for op in ops if op.tries)
            again = [op for op in ops if op.future is None and op.tries < NOWAIT_RETRIES]
            if again:  # nobody waits to hear it failed: sent again once Redis answers
                self._retry_later(again, exc)
                later = {id(op) for op in again}
                ops = [op for op in ops if id(op) not in later]
                results = [err] * len(ops)
        for op, result in zip(ops, results, strict=True):
            if isinstance(result, Exception):
                self._finish(op, self._map_error(result), None)
                continue
            try:
                value = op.parse(result)
            except Exception as exc:
                self._finish(op, exc, None)
            else:
                self._finish(op, None, value)

    def _retry_later(self, ops: list[_Op], exc: BaseException) -> None:
        tries = max(op.tries for op in ops) + 1
        for op in ops:
            op.tries = tries
        delay = Backoff(base=0.5, cap=30.0, attempts=tries - 1).next()
        log.warning(
            "%d store writes to %s failed (%s); sending them again in %.1f s",
            len(ops),
            self._where,
            exc,
            delay,
        )
        timer = asyncio.get_running_loop().call_later(delay, self._requeue, ops)
        self._retries[timer] = ops

    def _requeue(self, ops: list[_Op]) -> None:
        for timer in [t for t, waiting in self._retries.items() if waiting is ops]:
            del self._retries[timer]
        if self._task is not None:
            self._requeued += len(ops)
            for op in ops:
                self._queue.put_nowait(op)

    async def _load_scripts(self) -> None:
        for source in self._scripts.values():
            await self._client.script_load(source)

    def _map_error(self, exc: Exception) -> Exception:
        if isinstance(exc, StoreError):
            return exc
        if isinstance(exc, ResponseError) and "PAIRING_CODE_IN_USE" in str(exc):
            return StoreError("that pairing code is already in use; issue a new code")
        err = StoreError(f"redis store at {self._where}: {exc}")
        err.__cause__ = exc
        return err

    @staticmethod
    def _finish(op: _Op, exc: BaseException | None, value: Any) -> None:
        fut = op.future
        if fut is None:
            if exc is not None:
                log.error("a store write failed: %s", exc)
            return
        if fut.done():
            return
        if exc is None:
            fut.set_result(value)
        else:
            fut.set_exception(exc)


def _history_json(
    role: Role, message_id: str, sender: str, text: str, at: datetime, data: dict[str, Any]
) -> str:
    if role not in _ROLES:
        raise ValueError(f"role must be one of {sorted(_ROLES)}, got {role!r}")
    return json.dumps([role, message_id, sender, text, at.isoformat(), data or None])


def _history_entry(thread_key: str, seq: int, raw: Any) -> HistoryEntry:
    role, message_id, sender, text, at, data = json.loads(raw)
    return HistoryEntry(
        seq, thread_key, role, message_id, sender, text, datetime.fromisoformat(at), data or {}
    )


def _pairing(raw: Any) -> Pairing:
    p = json.loads(raw)
    created_at = datetime.fromisoformat(p["created_at"])
    approved = bool(p["approved"])
    expires_at = p.get("expires_at", None if approved else p["created_at"])
    # (Pending since before codes expired: expired when given, as the scripts take it.)
    return Pairing(
        code=p["code"],
        connection_id=p["connection_id"],
        channel_user_id=p["channel_user_id"],
        display_name=p["display_name"],
        created_at=created_at,
        approved=approved,
        expires_at=None if expires_at is None else datetime.fromisoformat(expires_at),
    )


def _delivery(row: Any) -> HookDelivery:
    delivery_id, (app, handler, conv, event, body, created, attempts, dead, error) = row
    return HookDelivery(
        id=int(delivery_id),
        app_id=_text(app),
        handler=_text(handler),
        conversation=_text(conv),
        event_id=_text(event),
        body=_text(body),
        created_at=datetime.fromtimestamp(float(created), UTC),
        attempts=int(attempts),
        dead=_text(dead) == "1",
        last_error=_opt_text(error),
    )


class RedisStore:
    """The `Store` on Redis; several processes with one `url` and `prefix` share the data.

    A cancelled call may still be applied: its command is already queued for the writer.
    """

    def __init__(self, url: str, *, prefix: str = "talkbridge") -> None:
        self._url = url
        self.keys = RedisKeys(prefix)
        self._client: aioredis.Redis | None = None
        self._writer: _PipelineWriter | None = None
        self._sha = {name: hashlib.sha1(src.encode()).hexdigest() for name, src in lua.ALL.items()}
        self._where = "redis"
        self._dropped_before_retention: set[str] = set()
        self._noted: set[str] = set()
        """Connection ids already added to `keys.swept_connections()` by this process."""
        self.wall_clock: Callable[[], float] = time.time
        """What `keep_for` deadlines are set by (Redis expires the entries on its own clock)."""

    def __repr__(self) -> str:
        return f"RedisStore({self._where!r}, prefix={self.keys.prefix!r})"

    @property
    def url(self) -> str:
        """The URL it was opened with (may hold a password: never log it)."""
        return self._url

    async def open(self) -> None:
        if self._writer is not None:
            return
        try:
            client = aioredis.Redis.from_url(self._url, **reconnecting())
        except ValueError as exc:
            raise StoreError(f"the redis store URL is not valid: {exc}") from None
        self._where = _describe(client)
        try:
            await client.ping()
            for source in lua.ALL.values():
                await client.script_load(source)
        except (RedisError, OSError) as exc:
            await client.aclose()
            raise StoreError(f"cannot open the redis store at {self._where}: {exc}") from exc
        except asyncio.CancelledError:  # a Ctrl-C while Redis does not answer: no socket left
            await client.aclose()
            raise
        self._client = client
        self._writer = _PipelineWriter(client, self._where, lua.ALL)
        self._writer.start()

    async def persistence_warning(self) -> str | None:
        """What a restart of this Redis would lose, when it keeps nothing (or only snapshots)
        on disk; None when it keeps an append-only file, or cannot be asked (CONFIG disabled
        or renamed, as on many hosted Redis services)."""
        assert self._client is not None, "open the store first"
        try:
            found = {
                _text(k): _text(v)
                for name in ("appendonly", "save")
                for k, v in (await self._client.config_get(name)).items()
            }
        except (RedisError, OSError):
            return None
        aof, save = found.get("appendonly"), found.get("save", "")
        if aof is None or aof == "yes":
            return None
        kept = f"only snapshots (save {save!r})" if save else "nothing on disk"
        lost = "what came since the last snapshot" if save else "everything"
        return (
            f"redis keeps {kept} (appendonly no): a restart of it loses {lost}: messages "
            "waiting to be answered, the records of replies sent (so they may go out twice) "
            "and of messages seen; set appendonly yes"
        )

    def health(self) -> dict[str, Any]:
        # Whether it is open at all, and whether its last commands reached Redis.
        if self._writer is None:
            return {"state": "down", "error": "not open"}
        if self._writer.failing is not None:
            return {"state": "down", "error": self._writer.failing}
        return {"state": "up"}

    async def close(self) -> None:
        writer, client = self._writer, self._client
        self._writer = self._client = None
        if writer is not None:
            await writer.stop()
        if client is not None:
            with contextlib.suppress(RedisError, OSError):
                await client.aclose()

    # -- plumbing ---------------------------------------------------------------------------

    def _op(self, args: tuple[Any, ...], parse: Callable[[Any], Any], wait: bool) -> _Op:
        if self._writer is None:
            raise StoreError(f"the redis store at {self._where} is not open")
        encoded = tuple(_encode(a) for a in args)
        fut = asyncio.get_running_loop().create_future() if wait else None
        op = _Op(encoded, parse, fut)
        self._writer.submit(op)
        return op

    async def _call(self, *args: Any, parse: Callable[[Any], Any] = _identity) -> Any:
        op = self._op(args, parse, True)
        assert op.future is not None
        return await op.future

    def _nowait(self, *args: Any) -> None:
        self._op(args, _identity, False)

    def _script_args(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> tuple[Any, ...]:
        return ("EVALSHA", self._sha[name], len(keys), *keys, *args)

    async def _script(
        self,
        name: str,
        keys: Sequence[str],
        args: Sequence[Any] = (),
        parse: Callable[[Any], Any] = _identity,
    ) -> Any:
        return await self._call(*self._script_args(name, keys, args), parse=parse)

    def _hook_prefix(self) -> str:
        return self.keys.hook_delivery("")

    # -- inbound ----------------------------------------------------------------------------

    def _inbox_keys(self, connection_id: str) -> list[str]:
        k = self.keys
        return [
            k.seen(connection_id),
            k.pending(),
            k.bodies(),
            k.arrival(),
            k.seen_before_retention(connection_id),
        ]

    def note_connection(self, connection_id: str) -> None:
        """Remember that `connection_id` has records to sweep (once per process)."""
        if connection_id not in self._noted:
            self._noted.add(connection_id)
            self._nowait("SADD", self.keys.swept_connections(), connection_id)

    async def accept_inbound(
        self, message: NormalizedMessage, *, record_history: bool = False
    ) -> bool:
        self.note_connection(message.connection_id)
        keys = self._inbox_keys(message.connection_id)
        member = message.connection_id + _SEP + message.id
        args: list[Any] = [message.id, member, message.model_dump_json()]
        if record_history:
            keys.append(self.keys.history(message.thread_key))
            data = {"edit_of": message.edit_of} if message.edit_of else {}
            sender = message.display_name or message.channel_user_id
            now = datetime.now(UTC)
            args.append(_history_json("user", message.id, sender, message.text, now, data))
        result: int = await self._script("ACCEPT", keys, args, parse=int)
        return result != 0

    async def complete_inbound(self, connection_id: str, message_id: str) -> None:
        k = self.keys
        member = connection_id + _SEP + message_id
        self._nowait(*self._script_args("COMPLETE", [k.pending(), k.bodies()], [member]))

    async def pending_inbound(self) -> Sequence[NormalizedMessage]:
        def parse(rows: list[bytes]) -> list[NormalizedMessage]:
            return [NormalizedMessage.model_validate_json(raw) for raw in rows]

        found: list[NormalizedMessage] = await self._script(
            "PENDING", [self.keys.pending(), self.keys.bodies()], parse=parse
        )
        return found

    async def seen_inbound(self, capacity: int) -> None:
        """None: with Redis, nodes accept concurrently, so no node's memory can say a message
        is new; the inbound bus dedupes in the one script that accepts."""
        return None

    # -- history ----------------------------------------------------------------------------

    def _append_args(
        self,
        thread_key: str,
        role: Role,
        message_id: str,
        sender: str,
        text: str,
        data: dict[str, Any] | None,
    ) -> tuple[tuple[Any, ...], HistoryEntry]:
        raw, entry = _new_entry(thread_key, role, message_id, sender, text, data)
        return self._script_args("APPEND", [self.keys.history(thread_key)], [raw]), entry

    async def append_history(
        self,
        thread_key: str,
        role: Role,
        message_id: str,
        sender: str,
        text: str,
        data: dict[str, Any] | None = None,
    ) -> HistoryEntry:
        args, entry = self._append_args(thread_key, role, message_id, sender, text, data)
        seq: int = await self._call(*args, parse=int)
        return replace(entry, seq=seq)

    async def append_history_once(
        self,
        connection_id: str,
        native_id: str,
        thread_key: str,
        role: Role,
        sender: str,
        text: str,
        data: dict[str, Any] | None = None,
    ) -> Appended:
        raw, entry = _new_entry(thread_key, role, native_id, sender, text, data)
        keys = [
            self.keys.history(thread_key),
            self.keys.id_map(connection_id),
            self.keys.id_reverse(connection_id),
        ]
        args = [native_id, raw, once_key(native_id)]
        appended, seq = await self._script("APPEND_ONCE", keys, args)
        return Appended(int(seq), replace(entry, seq=int(seq)) if appended else None)

    async def history_seq(self, connection_id: str, native_id: str) -> int | None:
        found: str | None = await self._call(
            "HGET", self.keys.id_map(connection_id), once_key(native_id), parse=_opt_text
        )
        return None if found is None else int(found)

    def queue_history(
        self,
        thread_key: str,
        role: Role,
        message_id: str,
        sender: str,
        text: str,
        data: dict[str, Any] | None = None,
    ) -> None:
        args, _ = self._append_args(thread_key, role, message_id, sender, text, data)
        self._nowait(*args)

    async def history(
        self, thread_key: str, *, limit: int = 50, after_seq: int = 0, before_seq: int = 0
    ) -> Sequence[HistoryEntry]:
        if not check_history_window(limit, after_seq, before_seq):
            return []

        def parse(result: list[Any]) -> list[HistoryEntry]:
            first, rows = int(result[0]), result[1]
            return [
                _history_entry(thread_key, first + i, raw)
                for i, raw in enumerate(rows)
                if raw is not None
            ]

        found: list[HistoryEntry] = await self._script(
            "HISTORY", [self.keys.history(thread_key)], [limit, after_seq, before_seq], parse=parse
        )
        return found

    async def forget_history(self, thread_key: str, message_ids: Sequence[str]) -> int:
        wanted = list(dict.fromkeys(message_ids))
        erased, start = 0, 0
        while wanted:  # a step at a time, newest first: no long script holds Redis up
            count, start, found = await self._script(
                "FORGET_HISTORY",
                [self.keys.history(thread_key)],
                [start, FORGET_STEP, *wanted],
            )
            erased += int(count)
            gone = set(_text_list(found))
            wanted = [w for w in wanted if w not in gone]
            if int(start) <= 0:
                break
        return erased

    # -- id map -----------------------------------------------------------------------------

    async def map_id(self, connection_id: str, native_id: str, message_id: str) -> None:
        keys = [self.keys.id_map(connection_id), self.keys.id_reverse(connection_id)]
        self._nowait(*self._script_args("MAP_ID", keys, [native_id, message_id]))

    async def lookup_id(self, connection_id: str, native_id: str) -> str | None:
        found: str | None = await self._call(
            "HGET", self.keys.id_map(connection_id), native_id, parse=_opt_text
        )
        return found

    async def lookup_native(self, connection_id: str, message_id: str) -> str | None:
        found: str | None = await self._call(
            "HGET", self.keys.id_reverse(connection_id), message_id, parse=_opt_text
        )
        return found

    # -- outbound ---------------------------------------------------------------------------

    async def sent_result(self, connection_id: str, idempotency_key: str) -> list[str] | None:
        keys = [self.keys.sent(connection_id), self.keys.sent_before_retention(connection_id)]
        found: list[str] | None = await self._script(
            "SENT_RESULT",
            keys,
            [idempotency_key],
            parse=lambda raw: None if raw is None else json.loads(raw),
        )
        return found

    async def record_sent(
        self, connection_id: str, idempotency_key: str, message_ids: Sequence[str]
    ) -> None:
        self.note_connection(connection_id)
        ids_json = json.dumps(list(message_ids))
        k = self.keys
        keys = [k.sent(connection_id), k.sent_order(connection_id), k.sent_count()]
        self._nowait(*self._script_args("RECORD_SENT", keys, [idempotency_key, ids_json]))

    async def record_failed_send(self, failure: FailedSend) -> None:
        raw = json.dumps(
            [
                failure.connection_id,
                failure.thread_id,
                failure.text,
                failure.reason,
                _iso(failure.failed_at, "FailedSend.failed_at"),
            ]
        )
        await self._call("LPUSH", self.keys.failed_sends(), raw)

    async def prune(self, *, now: datetime, keep: Retention, limit: int = 10_000) -> Pruned:
        """Marks as in the SQLite store: (time, counter) pairs, aged per table."""
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        at = float(_epoch(now, "now"))
        k = self.keys
        tables = {
            "inbound": (at - keep.dedupe.total_seconds(), k.arrival(), k.seen),
            "sent": (at - keep.sent.total_seconds(), k.sent_count(), k.sent_order),
        }
        counts: dict[str, int] = {}
        more = False
        swept: list[str] | None = None  # read once, when a mark has aged
        for table, (cutoff, _, ordered) in tables.items():
            mark: int | None = await self._script(
                "AGED_MARK", [k.prune_marks(table)], [cutoff], parse=_opt_int
            )
            count = 0
            if mark is not None:
                if swept is None:
                    swept = await self._swept_connections()
                for cid in swept:
                    key = ordered(cid)
                    if table == "inbound":
                        keys, args = [key, k.pending()], [mark, limit - count, cid + _SEP]
                        count += await self._script("PRUNE_SEEN", keys, args, parse=int)
                    else:
                        keys, args = [key, k.sent(cid)], [mark, limit - count]
                        count += await self._script("PRUNE_SENT", keys, args, parse=int)
                    if count >= limit:
                        break
                if count >= limit:
                    more = True
                else:
                    await self._call("ZREMRANGEBYSCORE", k.prune_marks(table), "-inf", cutoff)
                    await self._drop_before_retention(table)
            counts[table] = count
        failed: int = await self._script(
            "PRUNE_FAILED",
            [k.failed_sends()],
            [_iso(now - keep.failed_sends, "now"), limit],
            parse=int,
        )
        more = more or failed >= limit
        if not more:
            for table, (_, counter, _) in tables.items():
                await self._script("MARK", [k.prune_marks(table), counter], [at])
        return Pruned(counts["inbound"], counts["sent"], failed, more)

    async def _swept_connections(self) -> list[str]:
        """The registered connection ids; the first sweep of a deployment also registers those
        whose records predate the registry (the only SCAN, once)."""
        k = self.keys
        if await self._call("SET", k.prune_done("registry"), "1", "NX", parse=bool):
            found_by_scan = [
                k.part_of(key, kind)
                for kind in ("in:seenz", "sentz")
                for key in await self._scan(kind)
            ]
            if found_by_scan:
                await self._call("SADD", k.swept_connections(), *found_by_scan)
        found: list[str] = await self._call("SMEMBERS", k.swept_connections(), parse=_text_list)
        return sorted(found)

    async def _scan(self, kind: str) -> list[str]:
        """Every key `{prefix}:{kind}:*` (one per connection)."""
        pattern = self.keys.pattern()[:-1] + kind + ":*"
        found: list[str] = []
        cursor = 0
        while True:
            cursor, keys = await self._call(
                "SCAN", cursor, "MATCH", pattern, "COUNT", 1000, parse=_scan_page
            )
            found.extend(keys)
            if cursor == 0:
                return found

    async def _drop_before_retention(self, table: str) -> None:
        """Every id in the pre-retention keys predates the first mark, which has now aged.
        Nothing writes such keys any more, so each table's are looked for once per process."""
        if table in self._dropped_before_retention:
            return
        self._dropped_before_retention.add(table)
        if not await self._call("SET", self.keys.prune_done(table), "1", "NX", parse=bool):
            return  # another process (or an earlier run) did it
        kind = "in:seen" if table == "inbound" else "sent"
        for key in await self._scan(kind):
            await self._call("UNLINK", key)

    async def failed_sends(self, limit: int = 100) -> Sequence[FailedSend]:
        """The latest `limit` failures, newest first."""
        if limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        if limit == 0:
            return []

        def parse(rows: list[bytes]) -> list[FailedSend]:
            out = []
            for raw in rows:
                conn, thread, text, reason, at = json.loads(raw)
                out.append(FailedSend(conn, thread, text, reason, datetime.fromisoformat(at)))
            return out

        found: list[FailedSend] = await self._call(
            "LRANGE", self.keys.failed_sends(), 0, limit - 1, parse=parse
        )
        return found

    # -- trust and pairing ------------------------------------------------------------------

    async def is_trusted(self, connection_id: str, channel_user_id: str) -> bool:
        # Not cached: an approval on any node must be seen at the sender's next message.
        found: bool = await self._call(
            "SISMEMBER", self.keys.trusted(connection_id), channel_user_id, parse=bool
        )
        return found

    async def set_trusted(self, connection_id: str, channel_user_id: str, trusted: bool) -> None:
        await self._call(
            "SADD" if trusted else "SREM", self.keys.trusted(connection_id), channel_user_id
        )

    async def create_pairing(self, pairing: Pairing) -> Pairing:
        if pairing.approved:
            raise ValueError("create_pairing stores a pending pairing; got one already approved")
        key = _code_key(pairing.code)
        if not key:
            raise ValueError("a pairing code must not be empty")
        pending_field = pairing.connection_id + _SEP + pairing.channel_user_id
        expires_at = pairing.expires_at
        raw = json.dumps(
            {
                "code": pairing.code,
                "connection_id": pairing.connection_id,
                "channel_user_id": pairing.channel_user_id,
                "display_name": pairing.display_name,
                "created_at": _iso(pairing.created_at, "Pairing.created_at"),
                "expires_at": None if expires_at is None else _iso(expires_at, "expires_at"),
                "approved": False,
                # names the Lua scripts need later, made here by the key builder
                "tk": self.keys.trusted(pairing.connection_id),
                "pf": pending_field,
            }
        )
        k = self.keys
        found: Pairing = await self._script(
            "CREATE_PAIRING",
            [
                k.pairings(),
                k.pairing_order(),
                k.pairing_pending(),
                k.pairing_seq(),
                k.pairing_expiry(),
            ],
            [
                pending_field,
                key,
                raw,
                _epoch(pairing.created_at, "Pairing.created_at"),
                "" if expires_at is None else _epoch(expires_at, "Pairing.expires_at"),
                _epoch(pairing.created_at - EXPIRED_PAIRINGS_KEPT, "Pairing.created_at"),
                FORGET_EXPIRED_PER_CALL,
            ],
            parse=lambda result: _pairing(result[1]),
        )
        return found

    async def pairings(
        self, *, include_approved: bool = False, now: datetime | None = None
    ) -> Sequence[Pairing]:
        at = now or utcnow()
        _epoch(at, "now")  # a naive `now` is refused

        def parse(rows: list[bytes]) -> list[Pairing]:
            found = [_pairing(raw) for raw in rows]
            if include_approved:
                return found
            return [p for p in found if not p.approved and not p.expired(at)]

        result: list[Pairing] = await self._script(
            "PAIRINGS", [self.keys.pairings(), self.keys.pairing_order()], parse=parse
        )
        return result

    async def approve_pairing(self, code: str, *, now: datetime | None = None) -> Pairing | None:
        k = self.keys
        found: Pairing | None = await self._script(
            "APPROVE_PAIRING",
            [k.pairings(), k.pairing_pending(), k.pairing_expiry()],
            [_code_key(code), _epoch(now or utcnow(), "now")],
            parse=lambda raw: None if raw is None else _pairing(raw),
        )
        if found is not None and not found.approved:
            raise PairingExpiredError(found)
        return found

    async def revoke_pairing(self, code: str) -> Pairing | None:
        k = self.keys
        found: Pairing | None = await self._script(
            "REVOKE_PAIRING",
            [k.pairings(), k.pairing_order(), k.pairing_pending(), k.pairing_expiry()],
            [_code_key(code)],
            parse=lambda raw: None if raw is None else _pairing(raw),
        )
        return found

    # -- state ------------------------------------------------------------------------------

    async def get_state(self, key: str) -> str | None:
        keys = [self.keys.state(), self.keys.expiring_state(key)]
        found: str | None = await self._script("GET_STATE", keys, [key], parse=_opt_text)
        return found

    async def set_state(self, key: str, value: str, *, keep_for: timedelta | None = None) -> None:
        deadline = state_deadline(self.wall_clock(), keep_for)
        at = "" if deadline is None else str(math.ceil(deadline * 1000))  # PXAT: milliseconds
        keys = [self.keys.state(), self.keys.expiring_state(key)]
        await self._script("SET_STATE", keys, [key, value, at])

    async def delete_state(self, key: str) -> None:
        keys = [self.keys.state(), self.keys.expiring_state(key)]
        await self._script("DELETE_STATE", keys, [key])

    # -- durable hook queue -----------------------------------------------------------------

    async def enqueue_hook_event(
        self,
        app_id: str,
        handlers: Sequence[str],
        conversation: str,
        event_id: str,
        body: str,
        created_at: datetime,
        *,
        capacity: int,
    ) -> int:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        if not handlers:
            return 0
        k = self.keys
        pairs = [x for h in handlers for x in (h, k.hook_queue(app_id, h))]
        args = [self._hook_prefix(), _epoch(created_at, "created_at"), capacity, app_id]
        args += [conversation, event_id, body, *pairs]
        keys = [k.hook_seq(), k.hook_ids(), k.hook_by_time(), k.hook_queues(app_id)]
        dropped: int = await self._script("ENQUEUE_HOOK", keys, args, parse=int)
        return dropped

    async def claim_hook_deliveries(
        self,
        app_id: str,
        handlers: Sequence[str],
        *,
        now: datetime,
        lease_until: datetime,
        limit: int,
    ) -> Sequence[HookDelivery]:
        if not handlers or limit <= 0:
            return []
        keys = [self.keys.hook_queue(app_id, h) for h in handlers]
        args = [self._hook_prefix(), _epoch(now, "now"), _epoch(lease_until, "lease_until"), limit]
        found: list[HookDelivery] = await self._script(
            "CLAIM_HOOKS", keys, args, parse=lambda rows: [_delivery(r) for r in rows]
        )
        return found

    async def ack_hook_delivery(self, delivery_id: int) -> None:
        keys = [self.keys.hook_ids(), self.keys.hook_by_time()]
        await self._script("ACK_HOOK", keys, [self._hook_prefix(), int(delivery_id)])

    async def fail_hook_delivery(
        self, delivery_id: int, error: str, *, retry_at: datetime | None
    ) -> None:
        retry = "" if retry_at is None else _epoch(retry_at, "retry_at")
        args = [self._hook_prefix(), int(delivery_id), error, retry]
        await self._script("FAIL_HOOK", [], args)

    async def release_hook_delivery(self, delivery_id: int, *, now: datetime) -> None:
        args = [self._hook_prefix(), int(delivery_id), _epoch(now, "now")]
        await self._script("RELEASE_HOOK", [], args)

    async def hook_backlog(
        self, *, app_id: str | None = None, dead: bool | None = None, limit: int = 1000
    ) -> Sequence[HookDelivery]:
        if limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        dead_filter = "" if dead is None else str(int(dead))
        args = [self._hook_prefix(), int(app_id is not None), app_id or "", dead_filter, limit]
        found: list[HookDelivery] = await self._script(
            "HOOK_BACKLOG",
            [self.keys.hook_ids()],
            args,
            parse=lambda rows: [_delivery(r) for r in rows],
        )
        return found

    async def replay_hook_deliveries(
        self, delivery_ids: Sequence[int] | None, *, now: datetime, app_id: str | None = None
    ) -> int:
        ids = [] if delivery_ids is None else [int(i) for i in delivery_ids]
        if delivery_ids is not None and not ids:
            return 0
        args = [self._hook_prefix(), _epoch(now, "now"), int(app_id is not None), app_id or ""]
        count: int = await self._script(
            "REPLAY_HOOKS", [self.keys.hook_ids()], [*args, *ids], parse=int
        )
        return count

    async def purge_hook_events(self, *, older_than: datetime) -> int:
        keys = [self.keys.hook_ids(), self.keys.hook_by_time()]
        args = [self._hook_prefix(), _epoch(older_than, "older_than")]
        count: int = await self._script("PURGE_HOOKS", keys, args, parse=int)
        return count

    async def clear_hook_events(self, app_id: str) -> int:
        keys = [self.keys.hook_ids(), self.keys.hook_by_time(), self.keys.hook_queues(app_id)]
        count: int = await self._script("CLEAR_HOOKS", keys, [self._hook_prefix()], parse=int)
        return count
