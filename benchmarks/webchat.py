"""Webchat clients through the full bridge, as a ratio to a bare `websockets` echo server.

Bridge path, per message: websocket frame -> webchat connector (auth'd session, SQLite history +
id map) -> router (dedupe, per-thread order) -> the starter keyword-router channel-message hook
-> echo agent turn (typing, streamed deltas) -> router send queue -> final `message` frame.
Baseline: a bare `websockets` server that sends every frame straight back.

Both servers run the same way, by default each as its own subprocess (`talkbridge run --config
<tmp yaml>` and this file with `--serve-echo`), so the clients' CPU is not the server's; the
SQLite store lives in a temporary directory. Each client sends one message at a time and waits
for the final reply (`--pipeline K`: K in flight). Latency is send -> final assistant `message`
(acks, typing and deltas are read but not timed); throughput is messages / timed-phase seconds.
Targets (issue 3): bridge >= 0.5x the baseline's messages/s and p99 < 3x the baseline's p99.

    .venv/bin/python benchmarks/webchat.py [--clients 100] [--messages-per-client 50]
        [--warmup 5] [--pipeline 1] [--rounds 3] [--in-process] [--profile-bridge FILE]

Each round measures the baseline, then the bridge, with fresh clients (bridge: fresh sessions);
rounds alternate so a burst of load from elsewhere on the machine hits both, and the headline
ratios are the median round's.

The webchat allows 20 frames/s per socket with bursts of 60 (docs/webchat-protocol.md), so the
default (5 + 50 frames per socket) fits the burst. Longer runs meet the limiter: a client then
waits `retry_after` and resends its unacknowledged frames with the same client ids, as the page
does; the count of such events is reported, and their waits are in the latencies.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from websockets.asyncio.client import ClientConnection, connect
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent.parent))  # talkbridge from this checkout, as core.py does

TOKEN_ENV = "TALKBRIDGE_BENCH_TOKEN"
FILLER = "hello there, this is a benchmark message of a typical chat length"
"""Twelve words after the client id, a typical chat line; the echo agent streams it in pieces."""
REPLY_TIMEOUT = 30.0
START_TIMEOUT = 30.0
TARGET_THROUGHPUT, TARGET_P99 = 0.5, 3.0

Kind = Literal["bridge", "echo"]


# ---- servers ---------------------------------------------------------------------------------


async def _echo(ws: ServerConnection) -> None:
    with suppress(ConnectionClosed):
        async for frame in ws:
            await ws.send(frame)


async def serve_echo() -> None:
    """The baseline server: print its URL, echo every frame until SIGTERM/SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with serve(_echo, "127.0.0.1", 0, compression=None) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        print(f"ws://127.0.0.1:{port}/", flush=True)
        await stop.wait()


@dataclass
class Server:
    """A running server under test: where clients connect, and how to read its CPU time."""

    kind: Kind
    url: str
    cpu: Callable[[], float | None]


def _proc_cpu(pid: int) -> float | None:
    """User + system CPU seconds of a process and its live descendants (the bridge's SQLite
    writer is one: a process of its own), from Linux /proc; None where unavailable."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()
    total = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    for child in _children(pid):
        total += _proc_cpu(child) or 0.0
    return total


def _children(pid: int) -> list[int]:
    children: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        with suppress(OSError):
            children.extend(int(c) for c in task.read_text().split())
    return children


def _bench_config(tmp: Path) -> Path:
    """A config on loopback, port 0, fixed token (from the environment), SQLite in `tmp`."""
    from talkbridge.init_template import write_starter

    write_starter(tmp)  # brings the starter keyword-router hook, which every message passes
    config = tmp / "bench.yaml"
    config.write_text(
        f"store: sqlite:///{tmp / 'bench.db'}\n"
        "webchat:\n"
        "  host: 127.0.0.1\n"
        "  port: 0\n"
        f'  tokens: ["${{{TOKEN_ENV}}}"]\n'
        "agents:\n"
        "  default: echo\n"
        "hooks:\n"
        "  - hooks/channel-message/keyword-router\n",
        encoding="utf-8",
    )
    return config


async def _subprocess(
    stack: AsyncExitStack, argv: list[str], log: Path, is_url: Callable[[str], bool]
) -> tuple[asyncio.subprocess.Process, str]:
    """Start `argv`, wait for the line it prints with its URL; stop it (SIGTERM) on exit."""
    errors = log.open("wb")
    stack.callback(errors.close)
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=errors, stdin=asyncio.subprocess.DEVNULL
    )

    async def stop() -> None:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 60)
            except TimeoutError:
                proc.kill()
                await proc.wait()

    stack.push_async_callback(stop)
    assert proc.stdout is not None
    try:
        async with asyncio.timeout(START_TIMEOUT):
            while line := (await proc.stdout.readline()).decode():
                if is_url(line.strip()):
                    return proc, line.strip()
    except TimeoutError:
        pass
    raise RuntimeError(f"{argv[1:4]} did not print its URL; its stderr ends:\n{_tail(log)}")


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-2000:]


async def start_servers(
    stack: AsyncExitStack, tmp: Path, *, in_process: bool, profile: str | None
) -> tuple[Server, Server]:
    token = os.urandom(18).hex()
    os.environ[TOKEN_ENV] = token
    config = _bench_config(tmp)
    if in_process:
        from talkbridge.bridge import Bridge
        from talkbridge.config import load_config

        own = os.getpid()
        echo_server = await stack.enter_async_context(
            serve(_echo, "127.0.0.1", 0, compression=None)
        )
        port = next(iter(echo_server.sockets)).getsockname()[1]
        echo = Server("echo", f"ws://127.0.0.1:{port}/", lambda: _proc_cpu(own))
        app = Bridge(*load_config(config))
        await app.start()
        stack.push_async_callback(app.stop)
        http = await app.webchat_url()
        url = http.replace("http://", "ws://", 1) + "ws"
        return echo, Server("bridge", url, lambda: _proc_cpu(own))

    py = sys.executable
    eproc, eurl = await _subprocess(
        stack,
        [py, str(HERE), "--serve-echo"],
        tmp / "echo.log",
        lambda s: s.startswith("ws://"),
    )
    echo = Server("echo", eurl, lambda: _proc_cpu(eproc.pid))
    run = ["-m", "talkbridge", "run", "--config", str(config), "--log-level", "warning"]
    if profile:
        run = ["-m", "pyinstrument", "-r", "text", "-o", profile, *run]
    bproc, http = await _subprocess(
        stack, [py, *run], tmp / "bridge.log", lambda s: s.startswith("http://")
    )
    url = http.split("?", 1)[0].replace("http://", "ws://", 1) + "ws"
    bridge = Server("bridge", url, lambda: _proc_cpu(bproc.pid))
    return echo, bridge


# ---- clients ---------------------------------------------------------------------------------


@dataclass
class Client:
    """One chat user: one socket, one thread; a reader resolves each message's future."""

    kind: Kind
    name: str
    ws: ClientConnection
    thread_id: str
    pending: dict[str, asyncio.Future[float]] = field(default_factory=dict)
    unacked: dict[str, str] = field(default_factory=dict)
    frames: Counter[str] = field(default_factory=Counter)
    rate_limited: int = 0
    reader: asyncio.Task[None] | None = None
    _resending: bool = False
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def send(self, client_id: str, text: str) -> asyncio.Future[float]:
        """Send one message; the future resolves with the arrival time of its final reply."""
        future = asyncio.get_running_loop().create_future()
        self.pending[client_id] = future
        frame = json.dumps(
            {"type": "send", "thread_id": self.thread_id, "client_id": client_id, "text": text}
        )
        if self.kind == "bridge":
            self.unacked[client_id] = frame
        await self.ws.send(frame)
        return future

    async def read(self) -> None:
        try:
            async for raw in self.ws:
                now = time.perf_counter()
                frame = json.loads(raw)
                kind = frame.get("type", "?")
                self.frames[kind] += 1
                if self.kind == "echo":
                    self._resolve(frame["client_id"], now)
                elif kind == "message" and frame.get("role") == "assistant":
                    self._resolve(frame["text"].split(" ", 1)[0], now)  # texts start with the id
                elif kind == "ack":
                    self.unacked.pop(frame["client_id"], None)
                elif kind == "error":
                    self._on_error(frame)
        except ConnectionClosed:
            pass
        finally:
            for future in self.pending.values():
                if not future.done():
                    future.set_exception(RuntimeError(f"{self.name}: the socket closed"))

    def _resolve(self, client_id: str, now: float) -> None:
        future = self.pending.pop(client_id, None)
        if future is not None and not future.done():
            future.set_result(now)

    def _on_error(self, frame: dict[str, Any]) -> None:
        if frame.get("code") == "rate_limited":
            self.rate_limited += 1
            if not self._resending:
                self._resending = True
                delay = float(frame.get("retry_after") or 0.05)
                task = asyncio.create_task(self._resend(delay))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            return
        error = RuntimeError(f"{self.name}: {frame.get('code')}: {frame.get('message')}")
        client_id = frame.get("client_id")
        futures = [self.pending.pop(client_id)] if client_id in self.pending else []
        if client_id is None:  # not about one message: nothing in flight can be trusted
            futures, self.pending = list(self.pending.values()), {}
        for future in futures:
            if not future.done():
                future.set_exception(error)

    async def _resend(self, delay: float) -> None:
        """After `retry_after`: resend what is unacknowledged (the same ids never repeat a turn)."""
        await asyncio.sleep(delay)  # the server's own figure: waiting is the point here
        self._resending = False
        with suppress(ConnectionClosed):
            for frame in list(self.unacked.values()):
                await self.ws.send(frame)


async def open_client(server: Server, index: int) -> Client:
    ws = await connect(server.url, compression=None, open_timeout=START_TIMEOUT)
    thread_id = f"{'0' * 32}.{index:012x}"  # the baseline's stand-in, same length as a real one
    if server.kind == "bridge":
        await ws.send(json.dumps({"type": "auth", "token": os.environ[TOKEN_ENV]}))
        ready = json.loads(await asyncio.wait_for(ws.recv(), START_TIMEOUT))
        if ready.get("type") != "ready":
            raise RuntimeError(f"auth refused: {ready}")
        if ready["conversations"]:
            thread_id = ready["conversations"][0]["thread_id"]
        else:
            await ws.send(json.dumps({"type": "new_conversation"}))
            made = json.loads(await asyncio.wait_for(ws.recv(), START_TIMEOUT))
            thread_id = made["conversation"]["thread_id"]
    client = Client(server.kind, f"client {index}", ws, thread_id)
    client.reader = asyncio.create_task(client.read())
    return client


async def run_phase(
    clients: list[Client], count: int, pipeline: int, tag: str, latencies: list[float] | None
) -> None:
    """Every client sends `count` messages, `pipeline` in flight, each waited for."""

    async def worker(client: Client, ids: list[str]) -> None:
        for client_id in ids:
            started = time.perf_counter()
            future = await client.send(client_id, f"{client_id} {FILLER}")
            arrived = await asyncio.wait_for(future, REPLY_TIMEOUT)
            if latencies is not None:
                latencies.append(arrived - started)

    jobs: list[Awaitable[None]] = []
    for n, client in enumerate(clients):
        ids = [f"c{n}-{tag}{i}" for i in range(count)]
        jobs.extend(worker(client, ids[k::pipeline]) for k in range(min(pipeline, count)))
    await asyncio.gather(*jobs)


@dataclass
class Result:
    """One timed phase; rounds combine by pooling latencies and summing seconds."""

    latencies: list[float]
    elapsed: float
    server_cpu: float | None
    client_cpu: float
    frames: Counter[str]
    rate_limited: int

    @property
    def rate(self) -> float:
        return len(self.latencies) / self.elapsed

    @property
    def p50(self) -> float:
        return statistics.median(self.latencies) * 1000

    @property
    def p99(self) -> float:
        ordered = sorted(self.latencies)
        return ordered[max(0, int(len(ordered) * 0.99) - 1)] * 1000

    @staticmethod
    def pool(results: list[Result]) -> Result:
        cpus = [r.server_cpu for r in results]
        return Result(
            latencies=[x for r in results for x in r.latencies],
            elapsed=sum(r.elapsed for r in results),
            server_cpu=None if None in cpus else sum(c or 0.0 for c in cpus),
            client_cpu=sum(r.client_cpu for r in results),
            frames=sum((r.frames for r in results), Counter()),
            rate_limited=sum(r.rate_limited for r in results),
        )


async def measure(server: Server, args: argparse.Namespace) -> Result:
    """Open the clients, run the warmup, time the measured phase, close the clients."""
    clients: list[Client] = []
    gate = asyncio.Semaphore(20)  # handshakes at a time: a burst of 100 only measures the backlog

    async def opened(index: int) -> None:
        async with gate:
            clients.append(await open_client(server, index))

    try:
        await asyncio.gather(*(opened(i) for i in range(args.clients)))
        clients.sort(key=lambda c: int(c.name.rpartition(" ")[2]))
        if args.warmup:
            await run_phase(clients, args.warmup, args.pipeline, "w", None)
        for client in clients:
            client.frames.clear()
            client.rate_limited = 0
        latencies: list[float] = []
        cpu0, server0 = time.process_time(), server.cpu()
        started = time.perf_counter()
        await run_phase(clients, args.messages_per_client, args.pipeline, "m", latencies)
        elapsed = time.perf_counter() - started
        cpu1, server1 = time.process_time(), server.cpu()
    finally:
        await asyncio.gather(*(c.ws.close() for c in clients), return_exceptions=True)
        for client in clients:
            if client.reader is not None:
                client.reader.cancel()
    return Result(
        latencies=latencies,
        elapsed=elapsed,
        server_cpu=server1 - server0 if server0 is not None and server1 is not None else None,
        client_cpu=cpu1 - cpu0,
        frames=sum((c.frames for c in clients), Counter()),
        rate_limited=sum(c.rate_limited for c in clients),
    )


# ---- report ----------------------------------------------------------------------------------


def _line(label: str, r: Result, in_process: bool) -> str:
    if in_process:
        cpu = f"process CPU {r.client_cpu / r.elapsed:.0%}"
    else:
        count = len(r.latencies)
        server = (
            f"{r.server_cpu / r.elapsed:.0%} ({r.server_cpu / count * 1e6:.0f} µs/msg)"
            if r.server_cpu is not None
            else "n/a"
        )
        client = f"{r.client_cpu / r.elapsed:.0%} ({r.client_cpu / count * 1e6:.0f} µs/msg)"
        cpu = f"server CPU {server}, client CPU {client}"
    return (
        f"  {label:<8} {r.rate:>8,.0f} msg/s  p50 {r.p50:7.2f} ms  p99 {r.p99:7.2f} ms  "
        f"({r.frames.total() / len(r.latencies):.1f} frames in per message; {cpu}; % of one core)"
    )


def _frames(r: Result) -> str:
    count = len(r.latencies)
    return ", ".join(f"{kind} {n / count:.2f}" for kind, n in r.frames.most_common())


def _verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


async def main(args: argparse.Namespace) -> int:
    where = (
        "in this process (clients and servers share one CPU: latencies include client work)"
        if args.in_process
        else "each in its own subprocess, clients in this one"
    )
    print(
        f"webchat benchmark: {args.clients} clients x {args.messages_per_client} messages "
        f"(+{args.warmup} warmup), {args.pipeline} in flight per client, {args.rounds} round(s); "
        f"servers {where}; loopback; {os.cpu_count()} CPU(s)",
        flush=True,
    )
    bases: list[Result] = []
    fulls: list[Result] = []
    async with asyncio.timeout(args.timeout), AsyncExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tb-bench-")))
        echo, bridge = await start_servers(
            stack, tmp, in_process=args.in_process, profile=args.profile_bridge
        )
        for n in range(args.rounds):  # alternate, so drift in the machine's load hits both
            print(f"round {n + 1}:", flush=True)
            bases.append(await measure(echo, args))
            print(_line("baseline", bases[-1], args.in_process), flush=True)
            fulls.append(await measure(bridge, args))
            print(_line("bridge", fulls[-1], args.in_process), flush=True)
    base, full = Result.pool(bases), Result.pool(fulls)
    print(f"all rounds ({len(base.latencies):,} messages each):")
    print(_line("baseline", base, args.in_process) + "  [bare websockets echo]")
    print(
        _line("bridge", full, args.in_process)
        + "  [webchat -> router -> hook -> echo agent -> reply, SQLite]"
    )
    print(f"bridge frames in per message: {_frames(full)}")
    # Headline: the median round's ratio, so one round disturbed by other load does not decide.
    throughput = statistics.median(f.rate / b.rate for b, f in zip(bases, fulls, strict=True))
    p99 = statistics.median(f.p99 / b.p99 for b, f in zip(bases, fulls, strict=True))
    print(
        f"ratios (median of {args.rounds} round(s)): throughput {throughput:.2f}x "
        f"(target >= {TARGET_THROUGHPUT}x: {_verdict(throughput >= TARGET_THROUGHPUT)}), "
        f"p99 {p99:.2f}x (target < {TARGET_P99}x: {_verdict(p99 < TARGET_P99)})"
    )
    if full.rate_limited:
        print(
            f"note: {full.rate_limited} frames were rate-limited (20/s per socket, bursts of 60) "
            "and resent after retry_after; their waits are in the bridge's latencies"
        )
    if not args.in_process and any(r.client_cpu / r.elapsed > 0.9 for r in bases + fulls):
        print(
            "note: the client process was near one full core in some round: that round is "
            "partly client-bound (its server figure is a floor)"
        )
    if args.profile_bridge:
        print(f"bridge profile (pyinstrument, whole bridge lifetime): {args.profile_bridge}")
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--messages-per-client", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5, help="untimed messages per client first")
    parser.add_argument("--pipeline", type=int, default=1, help="messages in flight per client")
    parser.add_argument(
        "--rounds", type=int, default=3, help="alternating baseline/bridge measurements, pooled"
    )
    parser.add_argument(
        "--in-process", action="store_true", help="run both servers in this process"
    )
    parser.add_argument(
        "--profile-bridge", metavar="FILE", help="run the bridge under pyinstrument, text to FILE"
    )
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds for the whole run")
    parser.add_argument("--serve-echo", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for name in ("clients", "messages_per_client", "pipeline", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.warmup < 0:
        parser.error("--warmup must be 0 or more")
    return args


if __name__ == "__main__":
    arguments = parse_args()
    if arguments.serve_echo:
        asyncio.run(serve_echo())
    else:
        raise SystemExit(asyncio.run(main(arguments)))
