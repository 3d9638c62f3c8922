"""Messages through the in-process pipeline, as a ratio to a bare loop measured in the same run.

Pipeline: a Talk-only test connector -> router (SQLite dedupe + history) -> 3 synchronous
(plain `def`) channel-message hooks (one modifies) -> echo agent turn -> router send queue ->
connector.
Baseline: a loop doing only model validation and three no-op hook calls per message.

    .venv/bin/python benchmarks/core.py [--messages 20000] [--threads 1 100] [--rounds 3]
        [--history 10000] [--history-rounds 3]

Each thread count runs `--rounds` times; the median run is shown, with the range: the machine's
own noise (other tenants of a VM) moves single runs by 10 %.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from talkbridge.bridge import Bridge
from talkbridge.config import BridgeConfig, ConnectionConfig
from talkbridge.hooks import HookRegistry, Modify
from talkbridge.message import NormalizedMessage, OutboundMessage, SendResult
from talkbridge.serving import freeze_startup_objects
from talkbridge.store import SqliteStore
from talkbridge.talk import MessageHandler, Subscription

BATCH = 100


class BenchConnector:
    """Talk-only connector that timestamps each reply against its message's injection."""

    def __init__(self, total: int) -> None:
        self.connection_id = "bench"
        self.channel = "telegram"
        self._handlers: list[MessageHandler] = []
        self.injected: dict[str, float] = {}
        self.latencies: list[float] = []
        self.total = total
        self.done = asyncio.Event()

    def subscribe(self, handler: MessageHandler) -> Subscription:
        self._handlers.append(handler)
        return Subscription(lambda: self._handlers.remove(handler))

    async def inject(self, message: NormalizedMessage) -> None:
        self.injected[message.id] = time.perf_counter()
        for handler in self._handlers:
            await handler(message)

    async def send(self, message: OutboundMessage) -> SendResult:
        started = self.injected.pop(message.reply_to or "", None)
        if started is not None:
            self.latencies.append(time.perf_counter() - started)
        if len(self.latencies) >= self.total:
            self.done.set()
        return SendResult(message_ids=(f"out-{len(self.latencies)}",))

    def feature(self, name: str) -> Any:
        return None


def _hooks() -> HookRegistry:
    hooks = HookRegistry()

    @hooks.channel_message(order=1)
    def audit(msg: NormalizedMessage) -> None:
        return None

    @hooks.channel_message(order=2)
    def tag(msg: NormalizedMessage) -> Modify:
        return Modify(msg.model_copy(update={"text": "[bench] " + msg.text}))

    @hooks.channel_message(order=3)
    def allow(msg: NormalizedMessage) -> None:
        return None

    return hooks


def _raw(i: int, thread: int) -> dict[str, Any]:
    return {
        "id": f"m{i}",
        "connection_id": "bench",
        "channel": "telegram",
        "channel_user_id": "u1",
        "display_name": "Bench",
        "thread_id": f"t{thread}",
        "timestamp": datetime.now(UTC),
        "text": f"hello number {i}",
    }


async def baseline(count: int) -> float:
    """Model validation plus three no-op hook calls per message: the floor of any pipeline."""

    def noop(msg: NormalizedMessage) -> None:
        return None

    hooks = (noop, noop, noop)
    raws = [_raw(i, i % 100) for i in range(count)]
    started = time.perf_counter()
    for raw in raws:
        msg = NormalizedMessage.model_validate(raw)
        for hook in hooks:
            hook(msg)
    return count / (time.perf_counter() - started)


async def pipeline(count: int, threads: int, history: int = 0) -> dict[str, float]:
    """`history` > 0: that many earlier messages in the measured thread; < 0: in another one."""
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteStore(Path(tmp) / "bench.db")
        config = BridgeConfig(store="sqlite:///unused.db")
        bridge = Bridge(config, store=store, hooks=_hooks(), with_webchat=False)
        connector = BenchConnector(count)
        bridge.registry.add(
            connector, ConnectionConfig(id="bench", channel="telegram", trusted=("u1",))
        )
        await bridge.start()
        if history:
            # Both runs hold the same number of rows, so only where they sit differs: in the
            # measured thread ("full") or in another one ("empty").
            key = "bench\x1ft0" if history > 0 else "bench\x1fother"
            for i in range(abs(history)):
                store.queue_history(key, "user", f"h{i}", "u1", f"old message {i}")
            await store.history(key, limit=1)
        freeze_startup_objects()  # as `talkbridge run` does once the bridge is up
        raws = [_raw(i, i % threads) for i in range(count)]
        started = time.perf_counter()
        # Platforms hand over updates in batches (Telegram's getUpdates: up to 100); a batch is
        # delivered concurrently and the router keeps each thread's arrival order.
        for first in range(0, count, BATCH):
            await asyncio.gather(
                *(
                    connector.inject(NormalizedMessage.model_validate(raw))
                    for raw in raws[first : first + BATCH]
                )
            )
        await asyncio.wait_for(connector.done.wait(), 600)
        elapsed = time.perf_counter() - started
        await bridge.stop()
    lat = sorted(connector.latencies)
    return {
        "rate": count / elapsed,
        "p50": statistics.median(lat) * 1000,
        "p99": lat[int(len(lat) * 0.99) - 1] * 1000,
    }


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 100])
    parser.add_argument("--history", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--history-rounds", type=int, default=3)
    args = parser.parse_args()

    base = await baseline(args.messages)
    print(f"baseline (validate + 3 no-op hooks): {base:,.0f} msg/s")
    for threads in args.threads:
        runs = sorted(
            [await pipeline(args.messages, threads) for _ in range(args.rounds)],
            key=lambda r: r["rate"],
        )
        r = runs[len(runs) // 2]  # the median run, by rate
        spread = f" (runs {runs[0]['rate']:,.0f}-{runs[-1]['rate']:,.0f})" if len(runs) > 1 else ""
        print(
            f"pipeline, {threads:>3} thread(s): {r['rate']:>8,.0f} msg/s  "
            f"p50 {r['p50']:.2f} ms  p99 {r['p99']:.2f} ms  "
            f"ratio to baseline {r['rate'] / base:.3f}{spread}"
        )
    n = max(5_000, args.messages // 4)
    # Short runs: alternate the two a few times and compare medians, so a burst of load from
    # elsewhere on the machine does not decide the comparison.
    empty_rates: list[float] = []
    full_rates: list[float] = []
    for _ in range(args.history_rounds):
        empty_rates.append((await pipeline(n, 1, history=-args.history))["rate"])
        full_rates.append((await pipeline(n, 1, history=args.history))["rate"])
    empty, full = statistics.median(empty_rates), statistics.median(full_rates)
    print(
        f"one thread, empty history: {empty:,.0f} msg/s; with {args.history:,} earlier "
        f"messages: {full:,.0f} msg/s ({full / empty - 1:+.1%}; medians of "
        f"{args.history_rounds} alternating runs each)"
    )


if __name__ == "__main__":
    asyncio.run(main())
