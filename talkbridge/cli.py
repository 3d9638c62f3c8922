"""`talkbridge run | check | init | pair | hooks`: the operator's front door.

Exit codes: 0 ok, 2 bad config or usage, 1 runtime failure.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from talkbridge.config import BridgeConfig, Secrets, WebchatConfig, error_reason, load_config
from talkbridge.errors import ConfigError, TalkbridgeError, TransientError

if TYPE_CHECKING:
    from talkbridge.bridge import Bridge

EXIT_OK, EXIT_RUNTIME, EXIT_USAGE = 0, 1, 2

log = logging.getLogger("talkbridge.cli")


class _RedactingFilter(logging.Filter):
    """Last line of defence: no configured secret reaches a log line."""

    def __init__(self, secrets: Secrets) -> None:
        super().__init__()
        self._secrets = secrets

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = self._secrets.redact(message)
        if record.exc_info and record.exc_info[1] is not None:
            record.exc_text = self._secrets.redact(
                logging.Formatter().formatException(record.exc_info)
            )
        if redacted != message:
            record.msg, record.args = redacted, None
        return True


def _setup_logging(level: str, secrets: Secrets) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    handler.addFilter(_RedactingFilter(secrets))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def _load(path: str | None) -> tuple[BridgeConfig, Secrets]:
    return load_config(path)


# -- run -------------------------------------------------------------------------------------------


async def _run(args: argparse.Namespace) -> int:
    from talkbridge.bridge import Bridge
    from talkbridge.serving import freeze_startup_objects

    config, secrets = _load(args.config)
    overrides: dict[str, object] = {}
    if args.host is not None:
        overrides["host"] = args.host
    if args.port is not None:
        overrides["port"] = args.port
    if overrides:
        config = config.model_copy(update={"webchat": config.webchat.model_copy(update=overrides)})
    _setup_logging(args.log_level, secrets)
    bridge = Bridge(config, secrets, node_id=args.node_id)
    bridge.new_webchat_token = args.new_token
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await bridge.start()
    except OSError as exc:
        return await _give_up(bridge, f"cannot start: {secrets.redact(str(exc))}")
    try:
        url = await bridge.webchat_url()
    except TransientError as exc:
        return await _give_up(bridge, f"cannot start: {exc}")
    except TimeoutError:
        last_error = bridge.registry.health("webchat").last_error
        return await _give_up(bridge, f"the webchat did not start: {last_error}")
    freeze_startup_objects()
    ids = [cid for cid in bridge.registry.ids() if cid != "webchat"]
    if bridge.node_id is not None:
        print(
            f"talkbridge node {bridge.node_id} (distributed mode, "
            f"key prefix {config.store_prefix!r})",
            flush=True,
        )
    print(
        f"talkbridge is running (store: {_describe_store(config.store)}; "
        f"connections: {', '.join(ids) or 'webchat only'}). Open the webchat:",
        flush=True,
    )
    print(url, flush=True)
    print("Press Ctrl-C to stop.", flush=True)
    await stop.wait()
    print(
        "talkbridge: stopping: finishing the replies under way (up to 10 s); "
        "messages still waiting are answered at the next start…",
        file=sys.stderr,
        flush=True,
    )
    await bridge.stop()
    return EXIT_OK


async def _give_up(bridge: Bridge, reason: str) -> int:
    print(f"talkbridge: {reason}", file=sys.stderr)
    await bridge.stop()
    return EXIT_RUNTIME


def _port(text: str) -> int:
    """argparse type: a port `webchat.port` accepts, so a bad one is a usage error (exit 2),
    not a failed start."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    _webchat_accepts(port=port)
    return port


def _host(text: str) -> str:
    """argparse type: a listen address `webchat.host` accepts (exit 2 on a typo)."""
    return str(_webchat_accepts(host=text)["host"])


def _webchat_accepts(**value: object) -> dict[str, object]:
    """`value` as `WebchatConfig` takes it, or a usage error quoting its reason."""
    try:
        return WebchatConfig.model_validate(value).model_dump(include=set(value))
    except ValidationError as exc:
        (name, given), reason = next(iter(value.items())), error_reason(exc.errors()[0])
        raise argparse.ArgumentTypeError(f"{given!r} is not a {name}: {reason}") from None


def _describe_store(url: str) -> str:
    return url.split("@")[-1] if url.startswith("redis") else url


# -- check -----------------------------------------------------------------------------------------


async def _check(args: argparse.Namespace) -> int:
    from talkbridge.connectors.base import ConnectorContext
    from talkbridge.registry import ConnectionRegistry
    from talkbridge.store import open_store

    config, secrets = _load(args.config)
    _setup_logging("error", secrets)
    print(f"config: ok ({len(config.connections)} connection(s), store {config.store})")
    if not config.connections:
        print("no connections to check: the webchat needs no credentials")
        return EXIT_OK
    store = open_store(config.store, prefix=config.store_prefix, short_lived=True)
    await store.open()
    try:
        registry = ConnectionRegistry(store, secrets)
        registry.build(config, ConnectorContext(store, log))
        reports = await registry.check(timeout=args.timeout)
        await registry.stop()
    finally:
        await store.close()
    width = max(len(r.connection_id) for r in reports)
    cwidth = max(len(r.channel) for r in reports)
    for report in reports:
        mark = "ok  " if report.ok else "FAIL"
        print(
            f"{mark}  {report.connection_id:<{width}}  {report.channel:<{cwidth}}  {report.detail}"
        )
    return EXIT_OK if all(r.ok for r in reports) else EXIT_RUNTIME


# -- pair ------------------------------------------------------------------------------------------


async def _pair(args: argparse.Namespace) -> int:
    from talkbridge.store import open_store

    config, _ = _load(args.config)
    store = open_store(config.store, prefix=config.store_prefix, short_lived=True)
    await store.open()
    try:
        if args.pair_command == "approve":
            pairing = await store.approve_pairing(args.code)
            if pairing is None:
                print(f"no pending pairing with code {args.code!r}", file=sys.stderr)
                return EXIT_RUNTIME
            print(
                f"approved: {pairing.display_name or pairing.channel_user_id} "
                f"({pairing.channel_user_id}) on {pairing.connection_id} is now trusted"
            )
            return EXIT_OK
        pairings = await store.pairings(include_approved=args.all)
        if not pairings:
            print("no pending pairings")
        for p in pairings:
            state = "approved" if p.approved else "pending"
            print(
                f"{p.code}  {state:<8}  {p.connection_id}  {p.channel_user_id}  "
                f"{p.display_name}  {p.created_at:%Y-%m-%d %H:%M}"
            )
        return EXIT_OK
    finally:
        await store.close()


# -- hooks dead-letters ----------------------------------------------------------------------------


async def _hooks(args: argparse.Namespace) -> int:
    from talkbridge.message import utcnow
    from talkbridge.store import open_store

    config, _ = _load(args.config)
    store = open_store(config.store, prefix=config.store_prefix, short_lived=True)
    await store.open()
    try:
        if args.dead_command == "replay":
            if args.all == bool(args.ids):
                print("talkbridge hooks dead-letters replay: give ID(s) or --all", file=sys.stderr)
                return EXIT_USAGE
            ids = None if args.all else args.ids
            count = await store.replay_hook_deliveries(ids, now=utcnow(), app_id=args.app)
            if ids is not None and count < len(ids):
                print(
                    f"replayed {count} of {len(ids)}: the others are not dead letters"
                    + (f" of app {args.app!r}" if args.app else ""),
                    file=sys.stderr,
                )
                return EXIT_RUNTIME
            print(f"replayed {count} dead letter(s); a running bridge delivers them now")
            return EXIT_OK
        dead = await store.hook_backlog(app_id=args.app, dead=True, limit=args.limit)
        if not dead:
            print("no dead letters")
        for d in dead:
            print(
                f"{d.id}  {d.app_id}  {d.handler}  {d.event_id}  {d.created_at:%Y-%m-%d %H:%M}"
                f"  attempts={d.attempts}  {d.last_error or ''}"
            )
        return EXIT_OK
    finally:
        await store.close()


# -- init ------------------------------------------------------------------------------------------


def _init(args: argparse.Namespace) -> int:
    from talkbridge.init_template import write_starter

    target = Path(args.directory)
    try:
        written = write_starter(target, force=args.force)
    except FileExistsError as exc:
        print(f"talkbridge init: {exc} already exists (use --force to overwrite)", file=sys.stderr)
        return EXIT_USAGE
    for path in written:
        print(f"wrote {path}")
    move = "" if target.resolve() == Path.cwd().resolve() else f"cd {target} && "
    print(f"next: {move}talkbridge run --config talkbridge.yaml")
    return EXIT_OK


# -- entry point -----------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="talkbridge", description="A multi-channel messaging bridge for chat agents."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def config_arg(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--config",
            "-c",
            default=os.environ.get("TALKBRIDGE_CONFIG"),
            help="YAML config file (default: ./talkbridge.yaml if present, else embedded defaults)",
        )

    run = sub.add_parser("run", help="run the bridge and its webchat")
    config_arg(run)
    run.add_argument("--host", type=_host, help="webchat listen address (default 127.0.0.1)")
    run.add_argument("--port", type=_port, help="webchat port (default 8765; 0 picks a free one)")
    run.add_argument(
        "--node-id",
        default=os.environ.get("TALKBRIDGE_NODE_ID"),
        help="this node's id in distributed mode (default: hostname-pid)",
    )
    run.add_argument(
        "--log-level", default=os.environ.get("TALKBRIDGE_LOG", "info"), help="debug|info|warning"
    )
    run.add_argument(
        "--new-token",
        action="store_true",
        help="replace the generated webchat token (kept across restarts), e.g. after a link leaked",
    )

    check = sub.add_parser(
        "check", help="validate the config and try every connection's credentials"
    )
    config_arg(check)
    check.add_argument("--timeout", type=float, default=15.0, help="seconds per connection")

    init = sub.add_parser("init", help="write a starter config and an example hook")
    init.add_argument("directory", nargs="?", default=".")
    init.add_argument("--force", action="store_true", help="overwrite existing files")

    pair = sub.add_parser("pair", help="list or approve sentinel pairing codes")
    pair_sub = pair.add_subparsers(dest="pair_command", required=True)
    pair_list = pair_sub.add_parser("list", help="pending pairing codes")
    config_arg(pair_list)
    pair_list.add_argument("--all", action="store_true", help="include approved ones")
    approve = pair_sub.add_parser("approve", help="trust the sender who got CODE")
    config_arg(approve)
    approve.add_argument("code")

    hooks = sub.add_parser("hooks", help="durable hook queue")
    hooks_sub = hooks.add_subparsers(dest="hooks_command", required=True)
    dead = hooks_sub.add_parser("dead-letters", help="list or replay durable hook dead letters")
    dead_sub = dead.add_subparsers(dest="dead_command", required=True)
    dead_list = dead_sub.add_parser("list", help="events whose handler gave up after retries")
    config_arg(dead_list)
    dead_list.add_argument("--app", help="only this app id")
    dead_list.add_argument("--limit", type=int, default=1000)
    replay = dead_sub.add_parser("replay", help="queue dead letters again, attempts reset")
    config_arg(replay)
    replay.add_argument("ids", nargs="*", type=int, metavar="ID", help="ids from `list`")
    replay.add_argument("--all", action="store_true", help="every dead letter")
    replay.add_argument("--app", help="only this app id")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "init":
            return _init(args)
        runner = {"run": _run, "check": _check, "pair": _pair, "hooks": _hooks}[args.command]
        return asyncio.run(runner(args))
    except ConfigError as exc:
        print(f"talkbridge: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except TalkbridgeError as exc:
        print(f"talkbridge: {exc}", file=sys.stderr)
        return EXIT_RUNTIME
    except KeyboardInterrupt:
        return EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
