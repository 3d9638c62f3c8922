"""What only the Redis store promises: its URL, its key names, its errors (the shared contract
runs in test_store_contract.py)."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from redis.asyncio import Redis

from talkbridge.errors import ConfigError, PairingExpiredError, StoreError
from talkbridge.message import NormalizedMessage
from talkbridge.store import Pairing, Retention, open_store
from talkbridge.store.redis import RedisKeys, RedisStore
from tests.conftest import require
from tests.peers.redis import outage_redis, private_redis, redis_url
from tests.support.logs import LogWatch
from tests.support.talk_connector import make_message


@pytest.fixture
def url() -> str:
    found = redis_url()
    require(found is not None, "no redis-server answers on 127.0.0.1:6379 and none is installed")
    assert found is not None
    return found


@pytest.fixture
async def raw(url: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(url)
    yield client
    await client.aclose()


@pytest.mark.parametrize("url", ["redis://:s3cret@127.0.0.1:6379/0", "rediss://u:s3cret@h/1"])
def test_open_store_builds_a_redis_store_with_the_prefix(url: str) -> None:
    store = open_store(url, prefix="deploy-a")
    assert isinstance(store, RedisStore)
    assert store.keys.prefix == "deploy-a"
    assert "s3cret" not in repr(store)


async def test_an_unreachable_server_is_a_store_error_without_the_password() -> None:
    with __import__("socket").socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    store = RedisStore(f"redis://:s3cret@127.0.0.1:{port}/0", prefix="x")
    with pytest.raises(
        StoreError, match=rf"cannot open the redis store at 127.0.0.1:{port}/0"
    ) as info:
        await store.open()
    assert "s3cret" not in str(info.value)
    with pytest.raises(StoreError, match="not open"):
        await store.get_state("k")


def test_an_empty_prefix_is_refused() -> None:
    with pytest.raises(ValueError, match="prefix"):
        RedisKeys("")


def test_key_parts_cannot_collide() -> None:
    keys = RedisKeys("p")
    assert keys.hook_queue("a:b", "c") != keys.hook_queue("a", "b:c")
    assert keys.history("web\x1ft:1").startswith("p:history:")
    assert keys.hook_delivery(7) == keys.hook_delivery("") + "7"


async def test_every_key_lives_under_the_prefix(url: str, raw: Redis) -> None:
    prefix = f"tbtest-{uuid.uuid4().hex[:12]}"
    store = RedisStore(url, prefix=prefix)
    await store.open()
    now = datetime.now(UTC)
    try:
        msg = NormalizedMessage(
            id="m1",
            connection_id="c:1",
            channel="webchat",
            channel_user_id="u",
            display_name="U",
            thread_id="t",
            timestamp=now,
            text="hi",
        )
        await store.accept_inbound(msg, record_history=True)
        await store.map_id("c:1", "n", "m")
        await store.record_sent("c:1", "k", ["1"])
        await store.set_trusted("c:1", "u", True)
        await store.create_pairing(Pairing("CODE", "c:1", "u2", "U2", now, False))
        await store.approve_pairing("code")
        await store.set_state("s", "v")
        await store.enqueue_hook_event("app", ["h"], "c", "e", "{}", now, capacity=5)
        assert await store.is_trusted("c:1", "u2")
    finally:
        await store.close()
    ours = [k async for k in raw.scan_iter(match=RedisKeys(prefix).pattern())]
    assert len(ours) >= 12
    assert all(k.startswith(prefix.encode() + b":") for k in ours)
    await raw.delete(*ours)


async def test_a_code_pending_since_before_codes_expired_counts_as_expired(
    url: str, raw: Redis
) -> None:
    """Such a code could be approved months later: it expired when it was given, as the
    SQLite store's migration has it, and its sender's next message gets a fresh code."""
    keys = RedisKeys(f"tbtest-{uuid.uuid4().hex[:12]}")
    store = RedisStore(url, prefix=keys.prefix)
    await store.open()
    given = "2024-05-01T12:00:00+00:00"
    legacy = {
        "code": "ABCD-EFGH",
        "connection_id": "tg",
        "channel_user_id": "u1",
        "display_name": "U",
        "created_at": given,
        "approved": False,
        "tk": keys.trusted("tg"),
        "pf": "tg\x1fu1",
    }
    try:
        await raw.hset(keys.pairings(), "abcd-efgh", json.dumps(legacy))
        await raw.zadd(keys.pairing_order(), {"abcd-efgh": 1})
        await raw.hset(keys.pairing_pending(), "tg\x1fu1", "abcd-efgh")
        (old,) = await store.pairings(include_approved=True)
        assert old.expires_at == datetime.fromisoformat(given) and old.expired(old.created_at)
        assert list(await store.pairings()) == []
        with pytest.raises(PairingExpiredError):
            await store.approve_pairing("ABCD-EFGH")
        assert not await store.is_trusted("tg", "u1")
        now = datetime.now(UTC)
        fresh = Pairing("JKLM-NPQR", "tg", "u1", "U", now, False, now + timedelta(hours=1))
        assert await store.create_pairing(fresh) == fresh
        assert list(await store.pairings(include_approved=True)) == [fresh]
    finally:
        await store.close()
        found = [k async for k in raw.scan_iter(match=keys.pattern())]
        if found:
            await raw.delete(*found)


async def test_two_prefixes_share_one_server_without_seeing_each_other(url: str) -> None:
    a = RedisStore(url, prefix=f"tbtest-{uuid.uuid4().hex[:12]}")
    b = RedisStore(url, prefix=f"tbtest-{uuid.uuid4().hex[:12]}")
    await a.open()
    await b.open()
    try:
        await a.set_state("k", "a")
        assert await b.get_state("k") is None
    finally:
        for store in (a, b):
            await store.close()
        async with Redis.from_url(url) as raw:
            for store in (a, b):
                found = [k async for k in raw.scan_iter(match=store.keys.pattern())]
                if found:
                    await raw.delete(*found)


async def test_forget_history_searches_a_long_thread_in_steps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each script looks at a few entries only (no long script holds Redis up), newest first;
    an old message is found all the same, and the search stops once every id is found."""
    monkeypatch.setattr("talkbridge.store.redis.FORGET_STEP", 3)
    async with private_store() as (store, url):
        for i in range(1, 11):
            await store.append_history("k", "user", f"m{i}", "s", f"t{i}")
        async with Redis.from_url(url) as raw:
            await raw.config_resetstat()
            assert await store.forget_history("k", ["m2", "m9"]) == 2
            stats = await raw.info("commandstats")
        assert [e.text for e in await store.history("k")] == [
            *("t1", "", "t3", "t4", "t5", "t6", "t7", "t8", "", "t10")
        ]
        assert stats["cmdstat_evalsha"]["calls"] == 3  # seqs 10-8, 7-5, 4-2: m2 found, done


async def test_state_that_expires_is_a_key_redis_expires_itself(url: str, raw: Redis) -> None:
    # Hash fields cannot expire before Redis 7.4: each expiring entry is a key with a deadline.
    store = RedisStore(url, prefix=f"tbtest-{uuid.uuid4().hex[:12]}")
    await store.open()
    t0 = time.time()
    store.wall_clock = lambda: t0
    own = store.keys.expiring_state("album:1")
    try:
        await store.set_state("album:1", "kept a day", keep_for=timedelta(days=1))
        assert await raw.pexpiretime(own) == math.ceil((t0 + 86_400) * 1000)
        assert not await raw.hexists(store.keys.state(), "album:1")
        await store.set_state("album:1", "for good")  # no deadline left behind
        assert not await raw.exists(own)
        assert await raw.hget(store.keys.state(), "album:1") == b"for good"
        store.wall_clock = lambda: t0 - 86_400  # written a day ago, for an hour
        await store.set_state("album:1", "ran out", keep_for=timedelta(hours=1))
        assert not await raw.exists(own)  # Redis dropped it: nothing for a sweep to do
        assert not await raw.hexists(store.keys.state(), "album:1")
    finally:
        await store.close()
        found = [k async for k in raw.scan_iter(match=store.keys.pattern())]
        if found:
            await raw.delete(*found)


@contextlib.asynccontextmanager
async def private_store() -> AsyncIterator[tuple[RedisStore, str]]:
    """An open store on a redis-server of the test alone (for what would disturb others)."""
    with private_redis() as url:
        require(url is not None, "redis-server is not installed")
        assert url is not None
        store = RedisStore(url, prefix="p")
        await store.open()
        try:
            yield store, url
        finally:
            await store.close()


async def test_a_lost_script_cache_is_reloaded() -> None:
    async with private_store() as (store, url):  # SCRIPT FLUSH: a server of our own
        await store.append_history("k", "user", "m1", "s", "one")
        async with Redis.from_url(url) as raw:
            await raw.script_flush()
        await store.set_state("plain", "command")  # no script: unaffected in the same batch
        assert (await store.append_history("k", "user", "m2", "s", "two")).seq == 2
        assert [e.text for e in await store.history("k")] == ["one", "two"]


def test_a_redis_url_without_redis_py_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "talkbridge.store.redis", None)
    with pytest.raises(ConfigError, match=r"talkbridge\[redis\]"):
        open_store("redis://127.0.0.1:6379/0")


async def test_ids_stored_before_retention_still_count_until_the_first_aged_mark(
    url: str, raw: Redis
) -> None:
    # A store written by an earlier talkbridge keeps ids in a plain set and sends in a hash.
    prefix = f"tbtest-{uuid.uuid4().hex[:12]}"
    keys = RedisKeys(prefix)
    await raw.sadd(keys.seen_before_retention("c:1"), "old")
    await raw.hset(keys.sent_before_retention("c:1"), "reply:old", '["9"]')
    store = RedisStore(url, prefix=prefix)
    await store.open()
    keep = Retention(timedelta(days=1), timedelta(days=1), timedelta(days=1))
    now = datetime.now(UTC)

    try:
        assert not await store.accept_inbound(
            make_message(connection_id="c:1", message_id="old")
        )  # still a duplicate
        assert await store.sent_result("c:1", "reply:old") == ["9"]
        await store.prune(now=now, keep=keep)  # the first mark
        assert await raw.exists(keys.seen_before_retention("c:1"))
        await store.prune(now=now + timedelta(days=1, seconds=1), keep=keep)
        assert not await raw.exists(
            keys.seen_before_retention("c:1"), keys.sent_before_retention("c:1")
        )
        assert await store.accept_inbound(make_message(connection_id="c:1", message_id="old"))
        assert await store.sent_result("c:1", "reply:old") is None
    finally:
        await store.close()
        ours = [k async for k in raw.scan_iter(match=keys.pattern())]
        if ours:
            await raw.delete(*ours)


def test_a_key_part_reads_back_unescaped() -> None:
    keys = RedisKeys("p:x")
    assert keys.part_of(keys.seen("a:b%c"), "in:seenz") == "a:b%c"
    with pytest.raises(ValueError, match="not a sentz key"):
        keys.part_of(keys.seen("a"), "sentz")


async def _scans(raw: Redis) -> int:
    stats = await raw.info("commandstats")
    return int(stats.get("cmdstat_scan", {}).get("calls", 0))


async def test_sweeps_find_connections_without_scanning_the_keyspace(url: str, raw: Redis) -> None:
    # Records from before the registry existed are found once, by the deployment's first sweep.
    prefix = f"tbtest-{uuid.uuid4().hex[:12]}"
    keys = RedisKeys(prefix)
    keep = Retention(timedelta(days=1), timedelta(days=1), timedelta(days=1))
    t0 = datetime.now(UTC)
    day = timedelta(days=1, seconds=1)
    store = RedisStore(url, prefix=prefix)
    await store.open()
    try:
        await store.accept_inbound(make_message(connection_id="old:1", message_id="a"))
        await store.complete_inbound("old:1", "a")  # handled: only its dedupe id is left
        await store.record_sent("old:1", "reply:a", ["1"])
        await store.history("flush", limit=1)  # the queued registration is written by now
        await raw.delete(keys.swept_connections())  # as if written by an earlier talkbridge
        await store.prune(now=t0, keep=keep)
        first = await store.prune(now=t0 + day, keep=keep)
        assert (first.dedupe, first.sent) == (1, 1)

        await store.accept_inbound(make_message(connection_id="new:2", message_id="b"))
        await store.complete_inbound("new:2", "b")
        await store.record_sent("new:2", "reply:b", ["2"])
        await store.prune(now=t0 + day, keep=keep)
        before = await _scans(raw)
        later = await store.prune(now=t0 + 2 * day + day, keep=keep)
        assert await _scans(raw) == before  # hourly sweeps never walk the keyspace
        assert (later.dedupe, later.sent) == (1, 1)
        assert await store.accept_inbound(make_message(connection_id="new:2", message_id="b"))
    finally:
        await store.close()
        ours = [k async for k in raw.scan_iter(match=keys.pattern())]
        if ours:
            await raw.delete(*ours)


async def test_the_store_goes_on_when_redis_closes_its_connections() -> None:
    # A Redis restart closes every client's connections; the first command on each then met a
    # closed socket, and a reply (a sent record, an awaited bus write) was lost with it.
    async with private_store() as (store, url):  # CLIENT KILL: a server of our own
        await store.set_state("warm", "1")  # the store's connection is open and pooled
        async with Redis.from_url(url) as raw:
            killed = await raw.client_kill_filter(_type="normal", skipme=True)
        assert killed >= 1
        await store.record_sent("c", "reply:1", ["m1"])  # nobody waits for this one
        assert await store.get_state("warm") == "1"
        assert await store.sent_result("c", "reply:1") == ["m1"]


async def test_a_write_nobody_waits_for_is_sent_again_once_redis_is_back() -> None:
    with LogWatch("talkbridge.store", logging.INFO) as logs:  # INFO: the "went through" line
        async with outage_redis() as server:
            store = RedisStore(server.url, prefix="p")
            try:
                await store.open()
                server.stop()
                await store.record_sent("c", "reply:1", ["m1"])  # Redis is down: kept
                await logs.said("sending them again", timeout=30)
                health = store.health()  # what /healthz shows meanwhile
                assert health["state"] == "down"
                assert f"127.0.0.1:{server.port}" in health["error"]
                await server.start()
                await logs.said("went through", timeout=60)
                assert await store.sent_result("c", "reply:1") == ["m1"]
                assert store.health() == {"state": "up"}
            finally:
                await store.close()


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("redis://:s3cret@127.0.0.1:99999/0", "port is not a port number"),
        ("redis://:s3cret@127.0.0.1:6379/abc", "is the database number"),
        ("redis://:s3cret@[::1:6379/0", "redis URL is not valid: Invalid IPv6 URL"),
        ("redis://:s3cret@127.0.0.1/0?socket_timeout=abc", "Invalid value for 'socket_timeout'"),
    ],
)
def test_a_redis_url_redis_py_would_stumble_on_is_a_config_error(url: str, reason: str) -> None:
    with pytest.raises(ConfigError, match=reason) as caught:  # exit 2, not a traceback
        open_store(url)
    assert "s3cret" not in str(caught.value)
