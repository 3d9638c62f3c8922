"""`talkbridge run | check | init | pair | hooks`: the operator's front door.

Exit codes: 0 ok, 2 bad config or usage, 1 runtime failure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import logging
import math
import os
import re
import shlex
import shutil
import signal
import sys
import traceback
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from talkbridge.cancellation import cancel_and_wait
from talkbridge.config import (
    STORE_KEYS,
    BridgeConfig,
    Secrets,
    WebchatConfig,
    error_reason,
    load_config,
)
from talkbridge.errors import (
    AgentUnavailableError,
    ConfigError,
    PairingExpiredError,
    StoreError,
    TalkbridgeError,
    TransientError,
)

if TYPE_CHECKING:
    from talkbridge.agents.base import AgentCheck
    from talkbridge.bridge import Bridge
    from talkbridge.store import Pairing, Store

EXIT_OK, EXIT_RUNTIME, EXIT_USAGE = 0, 1, 2
EXIT_INTERRUPTED = 130
"""Ctrl-C during `check`, `pair`, `hooks` or `init`, a second one while `run` stops, or one
while `run` connects to the store: the shell's code for "ended by SIGINT"."""

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")

log = logging.getLogger("talkbridge.cli")


class _Console:
    """Every line the CLI prints passes here, so no secret the config loaded (nor the generated
    webchat token, which the bridge adds to the same `Secrets`) reaches the terminal. The
    webchat link is the one secret printed on purpose, and it does not come through here."""

    def __init__(self) -> None:
        self._secrets: list[Secrets] = []

    def hide(self, secrets: Secrets) -> None:
        self._secrets.append(secrets)

    def redact(self, text: str) -> str:
        for secrets in self._secrets:
            text = secrets.redact(text)
        return text

    def out(self, text: str) -> None:
        print(self.redact(text), flush=True)

    def err(self, text: str) -> None:
        print(self.redact(text), file=sys.stderr, flush=True)


_console = _Console()


_TOKEN_FIELD = re.compile(r"""(["']?(?:\w*token\w*|ticket)["']?\s*[:=]\s*["']?)[^"'\s,;}&]+""")
"""A token given in a frame, a query or a cookie (a webchat auth frame, or the
`talkbridge_token_<port>=` cookie, in websockets' debug log of a request), or a Socket Mode
URL's ticket (in slack-sdk's debug log of `apps.connections.open`): not
one the config holds (a wrong one, a user's JWT), so `Secrets` cannot know it, yet it may be
a real credential mistyped."""


_TERMINAL_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
"""Control characters but newline and tab: a log line quotes senders' own text (a name, a
subject), and an escape sequence in it must not recolour, move or erase the operator's
terminal, nor a carriage return overwrite the line it is on."""


def _visible(match: re.Match[str]) -> str:
    return repr(match.group())[1:-1]


class _RedactingFilter(logging.Filter):
    """Last line of defence: no configured secret, and no token a client presented, reaches a
    log line."""

    def __init__(self, secrets: Secrets) -> None:
        super().__init__()
        self._secrets = secrets

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = _TOKEN_FIELD.sub(r"\1***", self._secrets.redact(message))
        redacted = _TERMINAL_CONTROL.sub(_visible, redacted)
        if record.exc_info and record.exc_info[1] is not None:
            # A traceback quotes what the message does (slack-sdk's handshake error: the URL).
            trace = self._secrets.redact(logging.Formatter().formatException(record.exc_info))
            record.exc_text = _TERMINAL_CONTROL.sub(_visible, _TOKEN_FIELD.sub(r"\1***", trace))
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


def _load(path: str | None, only: tuple[str, ...] | None = None) -> tuple[BridgeConfig, Secrets]:
    config, secrets = load_config(path, only=only)
    _console.hide(secrets)
    return config, secrets


# -- run -------------------------------------------------------------------------------------------


async def _run(args: argparse.Namespace) -> int:
    config, secrets = _load(args.config)  # no SDK is imported to check it: a bad key is quick
    config = _with_overrides(config, args)
    # Said before the slow part: opening the store, and the imports of the bridge's own
    # modules. Silence until the URL looked like a hang.
    _console.err("talkbridge: starting…")

    from talkbridge.bridge import Bridge
    from talkbridge.preflight import check_agent_roles
    from talkbridge.serving import freeze_startup_objects
    from talkbridge.store import public_url

    _setup_logging(args.log_level, secrets)
    bridge = Bridge(config, secrets, node_id=args.node_id)
    bridge.new_webchat_token = args.new_token
    bridge.reports_webchat_failure = True  # a port in use: one fatal line, no warning before it
    check_agent_roles(bridge)  # a config error (exit 2) before anything opens
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    stopped_by: list[signal.Signals] = []

    def on_signal(sig: signal.Signals) -> None:  # a second one while starting (or stopping)
        if stop.is_set():  # stops at once
            _stop_now()
        stopped_by.append(sig)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        # The store first, on its own: a store that never answers would hold the start until
        # its timeout, and nothing has started yet, so a Ctrl-C may cut that wait short.
        if not await _unless_stopped(bridge.store.open(), stop):
            _console.err(
                "talkbridge: interrupted while connecting to the store "
                f"{public_url(config.store)}; nothing was started"
            )
            await bridge.stop()
            return EXIT_INTERRUPTED
        # Goes on with the store open (a SQLite one serves one bridge). The connections' SDKs
        # take seconds to import (aiogram alone): they are loaded once the URL is out.
        await bridge.start(connect=False)
    except OSError as exc:
        return await _give_up(bridge, f"cannot start: {exc}")
    except TalkbridgeError:
        await bridge.stop()  # a bad hook folder, an unreachable store: `main` says which
        raise
    try:
        url = await bridge.webchat_url()
    except TransientError as exc:
        return await _give_up(bridge, f"cannot start: {exc}")
    except TimeoutError:
        last_error = bridge.registry.health("webchat").last_error
        return await _give_up(bridge, f"the webchat did not start: {last_error}")
    freeze_startup_objects()
    if stop.is_set():  # Ctrl-C while starting: not "running", stopping
        _console.err("talkbridge: stopping: interrupted while starting")
        await bridge.stop()
        return EXIT_OK
    host = config.webchat.host
    if not _loopback(host):
        where = f"every interface ({host})" if host in ("0.0.0.0", "::") else host
        _console.err(
            f"talkbridge: warning: the webchat is served as plain HTTP on {where}, so its "
            "token travels in the clear: put a TLS reverse proxy in front (see deploy/README.md)"
        )
    _say_running(bridge, config)
    print(url + _token_hint(url, config.webchat), flush=True)  # the one secret printed on purpose
    _console.out("Press Ctrl-C to stop.")
    bridge.start_connections()  # each is `starting` in /healthz until it is up
    await stop.wait()
    later = "by another node or at the next start" if bridge.node_id else "at the next start"
    again = "a second SIGTERM" if stopped_by[:1] == [signal.SIGTERM] else "Ctrl-C again"
    _console.err(
        f"talkbridge: stopping: finishing the replies under way (up to 10 s; {again} stops "
        f"at once); messages still waiting are answered {later}…"
    )
    await bridge.stop()
    if bridge.abandoned_turns:
        # They would hold up the event loop's own shutdown, which waits for every task: the
        # store is closed and their messages are still pending, so nothing is lost by not waiting.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(EXIT_OK)
    return EXIT_OK


async def _unless_stopped(work: Coroutine[Any, Any, None], stop: asyncio.Event) -> bool:
    """Run `work` to its end, unless `stop` is set first: then cancel it and wait until it has
    ended (a client library may take a cancel for a failure, and retry). Whether it ended by
    itself; its error, if it failed, is raised."""
    task = asyncio.ensure_future(work)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait((task, stopped), return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # this coroutine itself was cancelled: nothing is left running
        await cancel_and_wait(task, stopped)
        raise
    if task.done():  # even if `stop` was set meanwhile: the start goes on, and meets it
        await cancel_and_wait(stopped)
        task.result()
        return True
    await cancel_and_wait(task, stopped)  # whatever it ended with, it was cut short
    return False


def _with_overrides(config: BridgeConfig, args: argparse.Namespace) -> BridgeConfig:
    """`--host` and `--port` over the config's `webchat` keys."""
    overrides = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    if not overrides:
        return config
    return config.model_copy(update={"webchat": config.webchat.model_copy(update=overrides)})


def _say_running(bridge: Bridge, config: BridgeConfig) -> None:
    from talkbridge.store import public_url

    ids = [cid for cid in bridge.registry.ids() if cid != "webchat"]
    if bridge.node_id is not None:
        _console.out(
            f"talkbridge node {bridge.node_id} (distributed mode, "
            f"key prefix {config.store_prefix!r})"
        )
    _console.out(
        f"talkbridge is running (store: {public_url(config.store)}; "
        f"connections: {', '.join(ids) or 'webchat only'}). Open the webchat:"
    )


def _token_hint(url: str, webchat: WebchatConfig) -> str:
    """What to add to a link that holds no token: the config's tokens (or its issuer's) log in,
    and are never printed."""
    if "?token=" in url:
        return ""
    if webchat.tokens:
        return "?token=<one of webchat.tokens>"
    if webchat.issuer is not None:
        return "?token=<a token signed with webchat.issuer.secret>"
    return ""


def _loopback(host: str) -> bool:
    """Whether only this machine reaches `host` (127.0.0.1, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: whoever resolves it
        return False


def _stop_now() -> None:
    """A second Ctrl-C while stopping: the operator will not wait for the replies under way.
    Nothing is lost by not waiting: turns cut off run again at the next start."""
    _console.err(
        "talkbridge: stopped at once, without waiting for the replies under way "
        "(they run again at the next start)"
    )
    sys.stdout.flush()
    os._exit(EXIT_INTERRUPTED)


async def _give_up(bridge: Bridge, reason: str) -> int:
    _console.err(f"talkbridge: {reason}")
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


# -- check ---------------------------------------------------------------------------------------

_PROBE_KEY = "check:probe"
"""A state key `check` reads to see the store answer; nothing writes it."""


async def _check(args: argparse.Namespace) -> int:
    config, secrets = _load(args.config)
    if any(conn.enabled for conn in config.connections):
        _console.err("talkbridge: checking…")  # as `run` says it starts: SDKs load for seconds

    from talkbridge.bridge import Bridge
    from talkbridge.preflight import validate_startup
    from talkbridge.store import open_store

    _setup_logging("error", secrets)
    store = open_store(config.store, prefix=config.store_prefix, short_lived=True)
    bridge = Bridge(config, secrets, store=store, with_webchat=False)
    try:
        warnings = validate_startup(bridge)
        _console.out(f"config: ok ({len(config.connections)} connection(s))")
        for warning in warnings:  # what `run` would log at start: `check` is quiet but errors
            _console.out(f"warn  {warning}")
        store_ok = await _check_store(store, config.store, args.timeout)
        connections_ok = await _check_connections(bridge, args.timeout)
        agents_ok = await _check_agents(bridge, args.timeout, secrets.redact)
    finally:
        await bridge.registry.stop()
        await store.close()
    return EXIT_OK if store_ok and connections_ok and agents_ok else EXIT_RUNTIME


async def _check_store(store: Store, url: str, timeout: float) -> bool:
    """Open the store and read one key, as `run` does first: one `ok`/`FAIL  store` line."""
    from talkbridge.store import public_url, sqlite_file

    file = sqlite_file(url)
    ok, detail = True, "opened and read"
    if file is not None and not file.exists():
        blocked = _uncreatable(file)
        ok = blocked is None
        detail = (
            "not created yet: the first run creates it" if ok else f"cannot be created: {blocked}"
        )
    else:
        try:
            async with asyncio.timeout(timeout):
                await store.open()
                await store.get_state(_PROBE_KEY)
        except TimeoutError:
            ok, detail = False, f"no answer within {timeout:g}s"
        except StoreError as exc:
            ok, detail = False, str(exc)
    _console.out(f"{'ok  ' if ok else 'FAIL'}  store  {public_url(url)}  {detail}")
    if ok and type(store).__name__ == "RedisStore":  # (redis-py may not be installed)
        from talkbridge.store.redis import RedisStore

        assert isinstance(store, RedisStore)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                warning = await store.persistence_warning()
            if warning is not None:
                _console.out(f"warn  store  {public_url(url)}  {warning}")
    return ok


def _uncreatable(file: Path) -> str | None:
    """Why the first run could not create the SQLite `file` (a file where its folder would be,
    a folder it may not write in), found without creating anything; None when it could."""
    folder = file.parent
    while not folder.exists():  # the run creates the missing folders, in the nearest existing one
        folder = folder.parent
    if not folder.is_dir():
        return f"{folder} is a file, not a folder"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"the folder {folder} is not writable"
    return None


async def _check_connections(bridge: Bridge, timeout: float) -> bool:
    """Try each enabled connection's credentials: one `ok`/`FAIL` line each."""
    configured = bridge.config.connections
    if not configured:
        _console.out("no connections to check: the webchat needs no credentials")
        return True
    if not any(conn.enabled for conn in configured):
        _console.out(f"no enabled connections to check ({len(configured)} with enabled: false)")
        return True
    reports = await bridge.registry.check(timeout=timeout)
    width = max(len(r.connection_id) for r in reports)
    cwidth = max(len(r.channel) for r in reports)
    for report in reports:
        mark = "ok  " if report.ok else "FAIL"
        _console.out(
            f"{mark}  {report.connection_id:<{width}}  {report.channel:<{cwidth}}  {report.detail}"
        )
    return all(r.ok for r in reports)


async def _check_agents(bridge: Bridge, timeout: float, redact: Callable[[str], str]) -> bool:
    """Try each agent that calls a model (its server, key and model) at once, as connections
    are: one line each, in name order."""
    from talkbridge.agents.base import AgentCheck

    runner = bridge.runner
    checked = [(n, a) for n in runner.agent_names if isinstance(a := runner.agent(n), AgentCheck)]
    # Others answer in process (echo, sentinel, a python agent): nothing to reach.
    verdicts = await asyncio.gather(*(_check_agent(agent, timeout) for _, agent in checked))
    for (name, _), (works, detail) in zip(checked, verdicts, strict=True):
        _console.out(f"{'ok  ' if works else 'FAIL'}  agent {name}  {redact(detail)}")
    return all(works for works, _ in verdicts)


async def _check_agent(agent: AgentCheck, timeout: float) -> tuple[bool, str]:
    try:
        async with asyncio.timeout(timeout):
            return True, await agent.check()
    except TimeoutError:
        return False, f"no answer within {timeout:g}s"
    except AgentUnavailableError as exc:
        return False, str(exc)


# -- pair and hooks dead-letters: the store only ---------------------------------------------------


@contextlib.asynccontextmanager
async def _existing_store(args: argparse.Namespace) -> AsyncIterator[Store | None]:
    """The config's store, open; None when it is a SQLite file that does not exist yet (these
    commands only read or change what a bridge stored, so they do not create it).

    Only the store's keys are loaded: a connection's token missing from the environment is no
    concern of `pair list`."""
    from talkbridge.store import open_store, public_url, sqlite_file

    config, _ = _load(args.config, only=STORE_KEYS)
    file = sqlite_file(config.store)
    if file is not None and not file.exists():
        _console.err(
            f"talkbridge: the store {public_url(config.store)} does not exist yet "
            "(the first `talkbridge run` creates it)"
        )
        yield None
        return
    store = open_store(config.store, prefix=config.store_prefix, short_lived=True)
    await store.open()
    try:
        yield store
    finally:
        await store.close()


async def _pair(args: argparse.Namespace) -> int:
    from talkbridge.message import utcnow

    async with _existing_store(args) as store:
        if args.pair_command == "approve":
            return await _approve(store, args.code, args.config)
        if args.pair_command == "revoke":
            return await _revoke(store, args.code, args.config)
        now = utcnow()
        found = [] if store is None else await store.pairings(include_approved=args.all, now=now)
        if not found:
            _console.out("no pairings" if args.all else "no pending pairings")
            return EXIT_OK
        rows = [("CODE", "STATE", "CONNECTION", "SENDER", "NAME", "SINCE (UTC)")]
        for p in found:
            rows.append(
                (
                    p.code,
                    _state(p, now),
                    p.connection_id,
                    _shown(p.channel_user_id),
                    _shown(p.display_name),
                    f"{p.created_at:%Y-%m-%d %H:%M}",
                )
            )
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
        for row in rows:
            cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
            _console.out("  ".join([*cells, row[-1]]))
        return EXIT_OK


def _state(pairing: Pairing, now: datetime) -> str:
    if pairing.approved:
        return "approved"
    return "expired" if pairing.expired(now) else "pending"


def _error_shown(error: str, limit: int) -> str:
    """A dead letter's error, `_shown`; a long one is cut in its message, not in the
    `(at FILE line N)` at its end that says where the hook raised."""
    where = re.search(r" \(at [^()]+ line \d+\)$", error)
    if where is None or len(error) <= limit or len(where.group()) > limit - 40:
        return _shown(error, limit)
    tail = where.group()
    return _shown(error[: where.start()], limit - len(tail)) + _shown(tail, len(tail))


def _shown(text: str, limit: int = 40) -> str:
    """A sender's name or id as the platform gave it, safe to print: it is the untrusted
    sender's own text, and a newline or a terminal escape in it must not rewrite the
    operator's screen (a forged row, a hidden one)."""
    safe = "".join(ch if ch.isprintable() else "?" for ch in text)
    return safe if len(safe) <= limit else safe[: limit - 1] + "…"


async def _pairing(
    store: Store | None, code: str, wanted: str, listing: str, config: str | None
) -> Pairing | int:
    """The pairing with this code, or the exit code after saying why there is none."""
    key = _code_key(code)
    if not _PAIRING_CODE.fullmatch(key):
        _console.err(
            f"{_shown(code, 20)!r} is not a pairing code: a code is 8 letters and digits, "
            "like ABCD-EFGH (the sentinel's message to the sender gives it)"
        )
        return EXIT_USAGE
    known = [] if store is None else await store.pairings(include_approved=True)
    found = next((p for p in known if _code_key(p.code) == key), None)
    if found is None:
        listing = f"talkbridge {listing}" + (f" --config {shlex.quote(config)}" if config else "")
        _console.err(f"no {wanted} has the code {code}; `{listing}` shows the codes")
        return EXIT_RUNTIME
    return found


def _who(pairing: Pairing) -> str:
    name = _shown(pairing.display_name or pairing.channel_user_id)
    return f"{name} ({_shown(pairing.channel_user_id)})"


async def _approve(store: Store | None, code: str, config: str | None) -> int:
    found = await _pairing(store, code, "pending pairing", "pair list", config)
    if isinstance(found, int):
        return found
    assert store is not None
    who = _who(found)
    if found.approved:
        _console.out(f"already approved: {who} on {found.connection_id} is trusted")
        return EXIT_OK
    try:
        await store.approve_pairing(found.code)
    except PairingExpiredError as exc:
        expired = exc.pairing.expires_at
        when = "" if expired is None else f" at {expired.astimezone(UTC):%Y-%m-%d %H:%M} UTC"
        _console.err(
            f"not approved: the code {found.code} of {who} on {found.connection_id} expired"
            f"{when} (codes last `pairing.code_ttl`, an hour by default); they get a new "
            "code by writing again"
        )
        return EXIT_RUNTIME
    _console.out(f"approved: {who} on {found.connection_id} is now trusted")
    return EXIT_OK


async def _revoke(store: Store | None, code: str, config: str | None) -> int:
    """Undo an approval (or drop a pending code): the sender meets the sentinel again."""
    from talkbridge.message import utcnow

    found = await _pairing(store, code, "pairing", "pair list --all", config)
    if isinstance(found, int):
        return found
    assert store is not None
    await store.revoke_pairing(found.code)
    if not found.approved:
        state = "expired" if found.expired(utcnow()) else "pending"
        _console.out(f"dropped the {state} pairing of {_who(found)} on {found.connection_id}")
        return EXIT_OK
    _console.out(
        f"revoked: {_who(found)} on {found.connection_id} is no longer trusted by pairing "
        "(a running bridge sees it within seconds; a `trusted:` entry of the config still "
        "counts)"
    )
    return EXIT_OK


_PAIRING_CODE = re.compile("[a-z0-9]{8}")
"""A code as `_code_key` leaves it (codes are made by `sentinel.new_pairing_code`)."""


def _code_key(code: str) -> str:
    """A pairing code as typed back: any case, with or without its dash or spaces."""
    return "".join(ch for ch in code.casefold() if ch.isalnum())


async def _hooks(args: argparse.Namespace) -> int:
    if args.dead_command == "replay" and args.all == bool(args.ids):
        _console.err("talkbridge hooks dead-letters replay: give ID(s) or --all")
        return EXIT_USAGE
    async with _existing_store(args) as store:
        if args.dead_command == "replay":
            return await _replay(store, args)
        dead = (
            []
            if store is None
            else await store.hook_backlog(app_id=args.app, dead=True, limit=args.limit)
        )
        if not dead:
            _console.out("no dead letters")
        for d in dead:
            _console.out(
                f"{d.id}  {d.app_id}  {d.handler}  {d.event_id}  {d.created_at:%Y-%m-%d %H:%M}"
                f"  attempts={d.attempts}  {_error_shown(d.last_error or '', 200)}"
            )
        return EXIT_OK


async def _replay(store: Store | None, args: argparse.Namespace) -> int:
    from talkbridge.message import utcnow

    now = utcnow()
    if args.all:
        count = 0
        if store is not None:
            count = await store.replay_hook_deliveries(None, now=now, app_id=args.app)
        _console.out(f"replayed {count} dead letter(s); a running bridge delivers them now")
        return EXIT_OK
    # One at a time, so that an id that is no dead letter can be named.
    missing: list[int] = []
    count = 0
    for delivery_id in dict.fromkeys(args.ids):
        replayed = 0
        if store is not None:
            replayed = await store.replay_hook_deliveries([delivery_id], now=now, app_id=args.app)
        if replayed:
            count += 1
        else:
            missing.append(delivery_id)
    if count:
        _console.out(f"replayed {count} dead letter(s); a running bridge delivers them now")
    if not missing:
        return EXIT_OK
    of_app = f" of app {args.app!r}" if args.app else ""
    ids = ", ".join(str(i) for i in missing)
    listing = "talkbridge hooks dead-letters list"
    if args.app:
        listing += f" --app {shlex.quote(args.app)}"
    if args.config:
        listing += f" --config {shlex.quote(args.config)}"
    _console.err(
        f"talkbridge hooks dead-letters replay: no dead letter{of_app} has the id"
        f"{'s' if len(missing) > 1 else ''} {ids}; `{listing}` shows their ids"
    )
    return EXIT_RUNTIME


# -- init ------------------------------------------------------------------------------------------


def _init(args: argparse.Namespace) -> int:
    from talkbridge.init_template import write_starter

    target = Path(args.directory)
    if target.exists() and not target.is_dir():
        _console.err(f"talkbridge init: {target} is a file, not a folder")
        return EXIT_USAGE
    try:
        written, kept = write_starter(target, force=args.force)
    except OSError as exc:
        where = exc.filename or target
        _console.err(f"talkbridge init: cannot write {where}: {exc.strerror or exc}")
        return EXIT_RUNTIME
    for path in written:
        _console.out(f"wrote {path}")
    for path in kept:
        _console.err(f"talkbridge init: {path} already exists: kept (use --force to overwrite)")
    if not written:
        return EXIT_USAGE
    move = "" if target.resolve() == Path.cwd().resolve() else f"cd {target} && "
    _console.out(f"next: {move}{_this_command()} run --config talkbridge.yaml")
    return EXIT_OK


# -- argument types --------------------------------------------------------------------------------


def _log_level(text: str) -> str:
    """argparse type (also for `$TALKBRIDGE_LOG`): a level name, any case."""
    if text.lower() not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a log level (from --log-level or TALKBRIDGE_LOG); "
            f"use {', '.join(LOG_LEVELS)}"
        )
    return text.lower()


def _seconds(text: str) -> float:
    """argparse type: a positive, finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


_MAX_INT = 2**63 - 1
"""The largest integer the stores keep (SQLite's INTEGER): a larger id is no id at all."""


def _positive_int(text: str) -> int:
    """argparse type: a whole number 1 or more (a `--limit`, a dead letter's id), so `-5` or
    an id past any store's range is a usage error, not a traceback."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= _MAX_INT:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number from 1 to {_MAX_INT}")
    return value


def _config_path(text: str) -> str:
    """argparse type: `--config ''` says so, rather than failing to read the folder `.`."""
    if not text.strip():
        raise argparse.ArgumentTypeError("the path is empty")
    return text


def _this_command() -> str:
    """How to run talkbridge again: its name when that is on PATH, else the path it was run by
    (a venv's bin is often not on PATH), absolute so it works from another folder."""
    ran = Path(sys.argv[0])
    if ran.name == "__main__.py":
        return f"{sys.executable} -m talkbridge"
    found = shutil.which("talkbridge")
    if found is not None and Path(found).resolve() == ran.resolve():
        return "talkbridge"
    return str(ran.resolve())


# -- entry point -----------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    from talkbridge import __version__

    parser = argparse.ArgumentParser(
        prog="talkbridge", description="A multi-channel messaging bridge for chat agents."
    )
    parser.add_argument("--version", action="version", version=f"talkbridge {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    def config_arg(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--config",
            "-c",
            type=_config_path,
            default=os.environ.get("TALKBRIDGE_CONFIG") or None,
            help="YAML config file (default: $TALKBRIDGE_CONFIG, else ./talkbridge.yaml if "
            "present, else embedded defaults)",
        )

    run = sub.add_parser("run", help="run the bridge and its webchat")
    config_arg(run)
    run.add_argument("--host", type=_host, help="webchat listen address (default 127.0.0.1)")
    run.add_argument("--port", type=_port, help="webchat port (default 8765; 0 picks a free one)")
    run.add_argument(
        "--node-id",
        default=os.environ.get("TALKBRIDGE_NODE_ID") or None,
        help="this node's id in distributed mode (default: $TALKBRIDGE_NODE_ID, else hostname-pid)",
    )
    run.add_argument(
        "--log-level",
        type=_log_level,
        default=os.environ.get("TALKBRIDGE_LOG") or "info",
        help=f"{'|'.join(LOG_LEVELS)} (default: $TALKBRIDGE_LOG, else info)",
    )
    run.add_argument(
        "--new-token",
        action="store_true",
        help="replace the generated webchat token (kept across restarts), e.g. after a link leaked",
    )

    check = sub.add_parser(
        "check", help="validate the config, then try the store and every connection's credentials"
    )
    config_arg(check)
    check.add_argument(
        "--timeout",
        type=_seconds,
        default=15.0,
        help="seconds for the store and each connection (default 15)",
    )

    init = sub.add_parser("init", help="write a starter config and an example hook")
    init.add_argument(
        "directory", nargs="?", default=".", help="where to write (default: this folder)"
    )
    init.add_argument("--force", action="store_true", help="overwrite existing files")

    pair = sub.add_parser("pair", help="list, approve or revoke sentinel pairing codes")
    pair_sub = pair.add_subparsers(dest="pair_command", required=True)
    pair_list = pair_sub.add_parser("list", help="pending pairing codes")
    config_arg(pair_list)
    pair_list.add_argument(
        "--all", action="store_true", help="include approved ones, and expired ones kept"
    )
    approve = pair_sub.add_parser("approve", help="trust the sender who got CODE")
    config_arg(approve)
    approve.add_argument("code", help="a code from `pair list` (ABCD-EFGH)")
    revoke = pair_sub.add_parser(
        "revoke", help="stop trusting the sender who got CODE (or drop a pending CODE)"
    )
    config_arg(revoke)
    revoke.add_argument("code", help="a code from `pair list --all`")

    hooks = sub.add_parser("hooks", help="durable hook queue")
    hooks_sub = hooks.add_subparsers(dest="hooks_command", required=True)
    dead = hooks_sub.add_parser("dead-letters", help="list or replay durable hook dead letters")
    dead_sub = dead.add_subparsers(dest="dead_command", required=True)
    dead_list = dead_sub.add_parser("list", help="events whose handler gave up after retries")
    config_arg(dead_list)
    dead_list.add_argument("--app", help="only this app id")
    dead_list.add_argument(
        "--limit", type=_positive_int, default=1000, help="show at most this many (default 1000)"
    )
    replay = dead_sub.add_parser("replay", help="queue dead letters again, attempts reset")
    config_arg(replay)
    replay.add_argument("ids", nargs="*", type=_positive_int, metavar="ID", help="ids from `list`")
    replay.add_argument("--all", action="store_true", help="every dead letter")
    replay.add_argument("--app", help="only this app id")
    _name_subcommands(parser)
    return parser


def _name_subcommands(parser: argparse.ArgumentParser) -> None:
    """A command given without its subcommand is told the ones to choose from, as the usage
    line shows them: argparse would name the `dest`, which no user can type."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            action.metavar = "{" + ",".join(action.choices) + "}"
            for subparser in action.choices.values():
                _name_subcommands(subparser)


async def _interruptible(command: Coroutine[Any, Any, int]) -> int:
    """Run `command`; a Ctrl-C is a KeyboardInterrupt even when the code it cut short made
    something else of the cancellation (a client library that retries, or reports a failure)."""
    task = asyncio.current_task()
    assert task is not None
    interrupted = False

    def on_sigint() -> None:
        nonlocal interrupted
        interrupted = True
        task.cancel()

    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, on_sigint)
    try:
        code = await command
    except asyncio.CancelledError:
        if interrupted:
            raise KeyboardInterrupt from None
        raise
    finally:
        loop.remove_signal_handler(signal.SIGINT)
    if interrupted:
        raise KeyboardInterrupt
    return code


def _stdout_to_devnull() -> None:
    """After a reader closed our stdout: what is still buffered, flushed at exit, would raise
    again ("Exception ignored … BrokenPipeError")."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "init":
            return _init(args)
        if args.command == "run":  # handles Ctrl-C itself: finishes the replies under way
            return asyncio.run(_run(args))
        runner = {"check": _check, "pair": _pair, "hooks": _hooks}[args.command]
        return asyncio.run(_interruptible(runner(args)))
    except ConfigError as exc:  # a hook folder that cannot be loaded is one too
        _console.err(f"talkbridge: {exc}")
        return EXIT_USAGE
    except TalkbridgeError as exc:
        _console.err(f"talkbridge: {exc}")
        return EXIT_RUNTIME
    except KeyboardInterrupt:
        if args.command == "run":  # Ctrl-C before `run` handles it itself: nothing started yet
            return EXIT_OK
        _console.err(f"talkbridge {args.command}: interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `talkbridge pair list | head -1`: the reader has had enough
        _stdout_to_devnull()
        return EXIT_RUNTIME
    except Exception:  # a bug: its traceback, still without the secrets
        _console.err(f"talkbridge: internal error:\n{traceback.format_exc().rstrip()}")
        return EXIT_RUNTIME


if __name__ == "__main__":
    raise SystemExit(main())
