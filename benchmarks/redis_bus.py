"""Messages/s through the Redis inbound bus with 1, 2 and 3 node processes, as a ratio to raw
redis-py XADD + XREADGROUP + XACK measured in the same run.

Bus: this process plays the connection's owner: `InboundBus.publish` (dedupe + pending inbox +
XADD, one script) with `--concurrency` publishers; each node process runs a `Cluster` and a
`TalkRouter` with one no-op subscriber, so a message goes shard stream -> XREADGROUP -> the
per-thread executor -> handler -> complete + XACK + XDEL (one script). Timed from the first
publish until the store's pending inbox is empty.
Baseline: the same publishers XADD the same message JSON to one stream; one consumer process
reads it with XREADGROUP (COUNT 256) and XACKs each batch with one command.

    .venv/bin/python benchmarks/redis_bus.py [--messages 20000] [--nodes 1 2 3] [--rounds 3]
        [--threads 200] [--concurrency 32] [--url redis://127.0.0.1:6379/0]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis.asyncio as aioredis

from talkbridge.cluster import Cluster, ClusterKeys
from talkbridge.config import ClusterConfig
from talkbridge.message import NormalizedMessage
from talkbridge.router import TalkRouter
from talkbridge.store.redis import RedisStore

SHARDS = 16
GROUP = "raw"


def messages(count: int, threads: int, tag: str) -> list[NormalizedMessage]:
    now = datetime.now(UTC)
    return [
        NormalizedMessage(
            id=f"{tag}-{i}",
            connection_id="bench",
            channel="telegram",
            channel_user_id=f"u{i % threads}",
            display_name="Bench User",
            thread_id=f"t{i % threads}",
            timestamp=now,
            text=f"benchmark message number {i}",
        )
        for i in range(count)
    ]


async def in_parallel(items: list[Any], concurrency: int, work: Any) -> None:
    queue: asyncio.Queue[Any] = asyncio.Queue()
    for item in items:
        queue.put_nowait(item)

    async def worker() -> None:
        while not queue.empty():
            await work(queue.get_nowait())

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def until(condition: Any, timeout: float = 300.0) -> None:
    async with asyncio.timeout(timeout):
        while not await condition():  # noqa: ASYNC110 - other processes: nothing to await
            await asyncio.sleep(0.005)


# -- child processes -------------------------------------------------------------------------------


async def run_node(url: str, prefix: str, node_id: str) -> None:
    store = RedisStore(url, prefix=prefix)
    await store.open()
    cluster = Cluster(store, ClusterConfig(lease_ttl=3.0, shards=SHARDS), node_id)
    router = TalkRouter(store)
    router.use_cluster(cluster)

    async def handled(message: NormalizedMessage) -> None:
        return None

    router.subscribe_all(handled)
    await cluster.start()
    await cluster.inbound.start()
    print("ready", flush=True)
    await _until_terminated()
    await cluster.quiesce()
    await router.join()
    await cluster.stop()
    await router.close()
    await store.close()


async def run_raw_consumer(url: str, stream: str) -> None:
    client = aioredis.Redis.from_url(url, decode_responses=True)
    print("ready", flush=True)
    reader = asyncio.create_task(_consume_raw(client, stream))
    await _until_terminated()
    reader.cancel()
    await asyncio.gather(reader, return_exceptions=True)
    await client.aclose()


async def _consume_raw(client: aioredis.Redis, stream: str) -> None:
    while True:
        result: Any = await client.xreadgroup(GROUP, "c", {stream: ">"}, count=256, block=100)
        for _, entries in result or ():
            await client.xack(stream, GROUP, *(eid for eid, _ in entries))


async def _until_terminated() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


# -- the measuring process -------------------------------------------------------------------------


async def spawn(*args: str) -> asyncio.subprocess.Process:
    process = await asyncio.create_subprocess_exec(
        sys.executable, __file__, *args, stdout=asyncio.subprocess.PIPE
    )
    assert process.stdout is not None
    line = await asyncio.wait_for(process.stdout.readline(), 60)
    if line.strip() != b"ready":
        raise RuntimeError(f"child {args} did not start")
    return process


async def stop(processes: list[asyncio.subprocess.Process]) -> None:
    for process in processes:
        process.send_signal(signal.SIGTERM)
    for process in processes:
        await asyncio.wait_for(process.wait(), 30)


async def cleanup(client: aioredis.Redis, prefix: str) -> None:
    keys = [k async for k in client.scan_iter(match=ClusterKeys(prefix).pattern(), count=1000)]
    for i in range(0, len(keys), 1000):
        await client.delete(*keys[i : i + 1000])


async def raw_round(url: str, args: argparse.Namespace) -> float:
    client = aioredis.Redis.from_url(url, decode_responses=True)
    prefix = f"tbbench-{uuid.uuid4().hex[:10]}"
    stream = f"{prefix}:raw"
    await client.xgroup_create(stream, GROUP, id="0", mkstream=True)
    consumer = await spawn("--raw-consumer", "--url", url, "--stream", stream)
    bodies = [m.model_dump_json() for m in messages(args.messages, args.threads, "raw")]
    try:
        started = time.perf_counter()
        await in_parallel(bodies, args.concurrency, lambda body: client.xadd(stream, {"m": body}))

        async def drained() -> bool:
            [info] = await client.xinfo_groups(stream)
            return bool(info["pending"] == 0 and info["lag"] == 0)

        await until(drained)
        elapsed = time.perf_counter() - started
    finally:
        await stop([consumer])
        await cleanup(client, prefix)
        await client.aclose()
    return args.messages / elapsed


async def bus_round(url: str, nodes: int, args: argparse.Namespace) -> float:
    prefix = f"tbbench-{uuid.uuid4().hex[:10]}"
    keys = ClusterKeys(prefix)
    client = aioredis.Redis.from_url(url, decode_responses=True)
    store = RedisStore(url, prefix=prefix)
    await store.open()
    publisher = Cluster(store, ClusterConfig(lease_ttl=3.0, shards=SHARDS), "publisher")
    children = [
        await spawn("--node", f"n{k}", "--url", url, "--prefix", prefix) for k in range(nodes)
    ]
    try:

        async def spread() -> bool:  # every shard held, every node holding some
            holders = [await client.get(keys.lease("shard", str(n))) for n in range(SHARDS)]
            return None not in holders and len(set(holders)) == nodes

        await until(spread, 60)
        batch = messages(args.messages, args.threads, f"bus{nodes}")
        started = time.perf_counter()
        await in_parallel(
            batch,
            args.concurrency,
            lambda m: publisher.inbound.publish(m, record_history=False),
        )

        async def drained() -> bool:
            return bool(await client.zcard(keys.pending()) == 0)

        await until(drained)
        elapsed = time.perf_counter() - started
    finally:
        await stop(children)
        await publisher.client.aclose()
        await store.close()
        await cleanup(client, prefix)
        await client.aclose()
    return args.messages / elapsed


async def measure(args: argparse.Namespace) -> None:
    url = args.url
    print(
        f"{args.messages} messages over {args.threads} threads, {args.concurrency} publishers, "
        f"{SHARDS} shards, {args.rounds} round(s); redis at {url}"
    )
    raw: list[float] = []
    bus: dict[int, list[float]] = {n: [] for n in args.nodes}
    for round_no in range(1, args.rounds + 1):
        raw.append(await raw_round(url, args))
        line = [f"round {round_no}: raw {raw[-1]:8.0f}/s"]
        for n in args.nodes:
            bus[n].append(await bus_round(url, n, args))
            line.append(f"bus x{n} {bus[n][-1]:8.0f}/s")
        print("  ".join(line), flush=True)
    base = statistics.median(raw)
    print(f"\nraw XADD+XREADGROUP+XACK: {base:8.0f} msg/s (median)")
    for n in args.nodes:
        rate = statistics.median(bus[n])
        print(f"bus, {n} node(s):          {rate:8.0f} msg/s  = {rate / base:.2f}x raw")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--threads", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--node", metavar="NODE_ID", help=argparse.SUPPRESS)
    parser.add_argument("--raw-consumer", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--prefix", help=argparse.SUPPRESS)
    parser.add_argument("--stream", help=argparse.SUPPRESS)
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        if args.node:
            asyncio.run(run_node(args.url, args.prefix, args.node))
        elif args.raw_consumer:
            asyncio.run(run_raw_consumer(args.url, args.stream))
        else:
            asyncio.run(measure(args))


if __name__ == "__main__":
    main()
