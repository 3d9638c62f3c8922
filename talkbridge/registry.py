"""ConnectionRegistry: builds connectors from config and owns their transports' lifecycle.

Each transport runs under a supervisor task: it is (re)started with capped exponential backoff
and jitter after a failure, stopped for good when the platform rejects its credentials (no retry
storm), and its state (`starting, up, degraded, down, stopped`) is kept with the last error in
plain words, scrubbed of secrets.

In distributed mode (`use_cluster`) a connection's transport runs only on the node holding its
lease (`lease:conn:<id>`): the others stand by and keep trying, so when the owner dies another
node takes over within about the lease TTL. A lost renewal stops the transport at once. A
transport stopped for good (credentials refused) gives its lease up, so that a node whose
credentials work takes over; its node tries for the lease again only once they pass a check.
Connectors marked `runs_everywhere` (the webchat) run on every node.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any, TypeVar

from talkbridge.backoff import STABLE_AFTER, Backoff
from talkbridge.cancellation import cancel_and_wait, in_daemon_thread, raise_if_cancelling
from talkbridge.config import BridgeConfig, ConnectionConfig, Secrets
from talkbridge.connectors import load_factory, require_sdk
from talkbridge.connectors.base import (
    CheckWaiting,
    Closable,
    ConnectorContext,
    CredentialCheck,
    Transport,
)
from talkbridge.errors import (
    ConfigError,
    ConnectorError,
    PermanentError,
    UnauthorizedError,
    UnknownConnectionError,
)
from talkbridge.message import utcnow
from talkbridge.store.base import Store
from talkbridge.talk import Talk

if TYPE_CHECKING:
    from talkbridge.cluster import Cluster, Lease

_T = TypeVar("_T")
log = logging.getLogger("talkbridge.registry")


class ConnectionState(StrEnum):
    STARTING = "starting"
    UP = "up"
    DEGRADED = "degraded"
    DOWN = "down"
    STOPPED = "stopped"
    STANDBY = "standby"
    """Distributed mode: another node runs this connection (see `owner`)."""


@dataclass(slots=True)
class ConnectionHealth:
    connection_id: str
    channel: str
    state: ConnectionState = ConnectionState.STOPPED
    last_error: str | None = None
    since: datetime | None = None
    restarts: int = 0
    leased: bool = False
    """Distributed mode: runs on one node at a time."""
    owner: str | None = None
    """The node running it, when leased (None: no node holds it right now)."""

    def as_dict(self) -> dict[str, Any]:
        found = {
            "channel": self.channel,
            "state": self.state.value,
            "last_error": self.last_error,
            "since": self.since.isoformat() if self.since else None,
            "restarts": self.restarts,
        }
        if self.leased:
            found["owner"] = self.owner
        return found


@dataclass(frozen=True, slots=True)
class CheckReport:
    connection_id: str
    channel: str
    ok: bool
    detail: str


def describe_error(exc: BaseException) -> str:
    """A plain-words description: the message if there is one, else the kind of error."""
    text = str(exc).strip()
    if isinstance(exc, ConnectorError) and text:
        return text
    name = type(exc).__name__
    return f"{name}: {text}" if text else name


CHECK_TIMEOUT = 15.0
"""Seconds a credential check may take before it counts as failed."""

_SENDS = "sends are "
"""How `send_trouble` reasons begin: what only a send that works clears."""


class _Status:
    """The `ConnectionStatus` a transport reports through."""

    def __init__(self, registry: ConnectionRegistry, connection_id: str) -> None:
        self._registry = registry
        self._cid = connection_id
        self.went_up_at: float | None = None

    def up(self) -> None:
        self.went_up_at = asyncio.get_running_loop().time()
        if self._registry.health(self._cid).state is ConnectionState.DEGRADED:
            log.info("%s: up again", self._cid)
        self._registry._set_state(self._cid, ConnectionState.UP, None)

    def degraded(self, reason: str) -> None:
        self._registry._degrade(self._cid, reason)


class ConnectionRegistry:
    def __init__(
        self,
        store: Store,
        secrets: Secrets | None = None,
        *,
        backoff: Callable[[], Backoff] = lambda: Backoff(base=1.0, cap=60.0),
        on_attach: Callable[[Talk], None] | None = None,
    ) -> None:
        self._store = store
        self._secrets = secrets or Secrets()
        self._new_backoff = backoff
        self._on_attach = on_attach
        self._connectors: dict[str, Talk] = {}
        self._configs: dict[str, ConnectionConfig] = {}
        self._health: dict[str, ConnectionHealth] = {}
        self._pending: dict[str, ConnectionConfig] = {}
        """Connections of the config registered by `expect`, not built yet (`build_pending`)."""
        self._first_failure_reported: set[str] = set()
        """Connections whose first failed attempt their caller reports (`add`)."""
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._waiters: list[
            tuple[str, frozenset[ConnectionState], asyncio.Future[ConnectionHealth]]
        ] = []
        self._cluster: Cluster | None = None
        self._leases: dict[str, Lease] = {}
        self._work: dict[str, asyncio.Task[None]] = {}
        """Distributed mode: each leased connection's transport supervisor while it is owned."""

    def use_cluster(self, cluster: Cluster) -> None:
        """Distributed mode: run each leased connection only while this node holds its lease."""
        self._cluster = cluster

    # -- building -------------------------------------------------------------------------------

    def add(
        self,
        connector: Talk,
        config: ConnectionConfig | None = None,
        *,
        caller_reports_first_failure: bool = False,
    ) -> None:
        """Register a connector built in code (the webchat, tests, embedding apps).

        `caller_reports_first_failure`: the caller waits for the first attempt and says itself
        why it failed (`talkbridge run` stops on a webchat that cannot listen), so that failure
        is not logged here too; later ones are, as usual."""
        cid = connector.connection_id
        if cid in self._connectors:
            raise ValueError(f"connection {cid!r} is already registered")
        self._connectors[cid] = connector
        if caller_reports_first_failure:
            self._first_failure_reported.add(cid)
        if config is not None:
            self._configs[cid] = config
            for value in config.secret_values():
                self._secrets.add(value)
        if self._pending.pop(cid, None) is None:  # an expected one stays `starting`
            self._health[cid] = ConnectionHealth(cid, connector.channel)
        if self._on_attach is not None:
            self._on_attach(connector)

    def build(self, config: BridgeConfig, context: ConnectorContext) -> None:
        """Create a connector for every enabled connection; imports only the SDKs in use.
        Every connection whose connector cannot be loaded is named, not just the first."""
        for conn, factory in _each_enabled(config, load_factory):
            self.add(factory(conn, context), conn)

    def expect(self, config: BridgeConfig) -> None:
        """What `build` checks, without importing any SDK (milliseconds, not seconds): each
        enabled connection is registered as `starting` (its id known to hooks and shown in
        /healthz); `build_pending` builds and starts them later. A `ConfigError` names every
        connection whose SDK is not installed, as `build` does."""
        for conn, _ in _each_enabled(config, require_sdk):
            if conn.id in self._health:
                raise ValueError(f"connection {conn.id!r} is already registered")
            self._pending[conn.id] = self._configs[conn.id] = conn
            for value in conn.secret_values():
                self._secrets.add(value)
            self._health[conn.id] = ConnectionHealth(conn.id, conn.channel)
            self._set_state(conn.id, ConnectionState.STARTING, None)

    def pending(self) -> list[str]:
        """The connections `expect` registered that are not built yet."""
        return list(self._pending)

    async def build_pending(
        self, context: ConnectorContext, *, failed: Callable[[str, str], None]
    ) -> None:
        """Build and start each connection `expect` registered, in the config's order, each as
        soon as its SDK is imported (in a daemon thread: the event loop, and so the webchat, goes
        on serving meanwhile, and a stop does not wait for an import under way). One that
        cannot be built is `down` with the reason, said in the log and to `failed(id, reason)`;
        the others go on."""
        for cid, conn in list(self._pending.items()):
            try:
                factory = await in_daemon_thread(
                    functools.partial(load_factory, conn.channel), f"import {conn.channel} SDK"
                )
                connector = factory(conn, context)
            except Exception as exc:
                reason = self.redact(describe_error(exc))
                log.error("%s: cannot start: %s", cid, reason)
                self._set_state(cid, ConnectionState.DOWN, reason)
                failed(cid, reason)
                continue
            self.add(connector, conn)
            await self.start()

    # -- lookups --------------------------------------------------------------------------------

    def get(self, connection_id: str) -> Talk:
        try:
            return self._connectors[connection_id]
        except KeyError:
            raise UnknownConnectionError(connection_id, list(self._connectors)) from None

    def config(self, connection_id: str) -> ConnectionConfig | None:
        return self._configs.get(connection_id)

    def ids(self) -> list[str]:
        """Every registered connection, those not built yet (`expect`) too."""
        return list(self._health)

    def health(self, connection_id: str) -> ConnectionHealth:
        if connection_id not in self._health:
            self.get(connection_id)  # raises, naming the known ones
        return self._health[connection_id]

    def states(self) -> dict[str, dict[str, Any]]:
        return {cid: h.as_dict() for cid, h in self._health.items()}

    def redact(self, text: str) -> str:
        return self._secrets.redact(text)

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        for cid, connector in self._connectors.items():
            if cid in self._tasks:
                continue
            if isinstance(connector, Transport):
                self._set_state(cid, ConnectionState.STARTING, None)
                if self._cluster is not None and not getattr(connector, "runs_everywhere", False):
                    self._cluster.leased.add(cid)
                    self._health[cid].leased = True
                    work = self._own(cid, connector, self._cluster)
                else:
                    work = self._supervise(cid, connector)
                self._tasks[cid] = asyncio.create_task(work, name=f"transport:{cid}")
            else:  # a pure Talk with nothing to run is up as soon as it exists
                self._set_state(cid, ConnectionState.UP, None)

    async def stop(self) -> None:
        await cancel_and_wait(*self._tasks.values())
        self._tasks.clear()
        await self._stop_owned()
        for cid, connector in self._connectors.items():
            if isinstance(connector, Closable):
                try:
                    await connector.close()
                except Exception as exc:
                    log.warning("%s: close failed: %s", cid, self.redact(describe_error(exc)))
            self._set_state(cid, ConnectionState.STOPPED, self._health[cid].last_error)
        for cid in self._pending:  # stopped before they were built
            self._set_state(cid, ConnectionState.STOPPED, None)

    def owned(self) -> list[str]:
        """Distributed mode: the leased connections this node runs now."""
        return sorted(self._cluster.owned) if self._cluster is not None else []

    async def _own(self, cid: str, transport: Transport, cluster: Cluster) -> None:
        """Wait for the connection's lease, run the transport while it is held, stand by again
        when it is lost. A transport down for good here (credentials refused) gives the lease
        up, and this node tries for it again only once its credentials pass a check. On
        cancel, `stop` stops the transport and releases the lease (in one place, for every
        owned connection, rather than in each cancelled task)."""
        lease = self._leases[cid] = cluster.lease("conn", cid)
        health = self._health[cid]
        loop = asyncio.get_running_loop()
        refused = self._new_backoff()
        lost: str | None = None
        while True:
            try:
                state = await lease.acquire()
            except Exception as exc:  # redis unreachable: nobody can take it either
                raise_if_cancelling()
                reason = self.redact(describe_error(exc))
                self._set_state(cid, ConnectionState.DEGRADED, f"lease unavailable: {reason}")
                await asyncio.sleep(lease.renew_every)
                continue
            health.owner = state.holder
            if not state.held:
                self._set_state(cid, ConnectionState.STANDBY, lost)
                lost = None
                await asyncio.sleep(lease.retry_delay(state))
                continue
            log.info("%s: node %s owns the connection now", cid, cluster.node_id)
            self._set_state(cid, ConnectionState.STARTING, None)
            try:
                await cluster.acquired(cid)  # its send requests: redis may fail here too
            except Exception as exc:
                raise_if_cancelling()
                cluster.lost(cid)
                with contextlib.suppress(Exception):  # else it runs out by itself
                    await lease.release()
                reason = self.redact(describe_error(exc))
                log.warning("%s: cannot take the connection over: %s; retrying", cid, reason)
                self._set_state(cid, ConnectionState.DEGRADED, f"lease unavailable: {reason}")
                await asyncio.sleep(lease.renew_every)
                continue
            taken_at = loop.time()
            work = self._work[cid] = asyncio.create_task(self._supervise(cid, transport))
            if await lease.keep(until=work):  # the lease was lost (cancelled: see `stop`)
                await cancel_and_wait(work)
                cluster.lost(cid)
                lost = "this node lost the lease and stopped the transport"
                continue
            # The transport is down for good here (its credentials refused): holding the lease
            # on would keep a node whose credentials work from running the connection.
            del self._work[cid]
            cluster.lost(cid)
            health.owner = None
            try:
                await lease.release()
            except Exception:  # else it runs out by itself
                raise_if_cancelling()
            if loop.time() - taken_at > STABLE_AFTER:
                refused.reset()
            await self._until_accepted(cid, refused)

    async def _until_accepted(self, cid: str, backoff: Backoff) -> None:
        """Distributed mode, after this node gave the lease of a connection down for good here
        up: wait, with backoff, until the platform accepts this node's credentials again (the
        transport's credential check; one without: only the backoff), so that a node whose
        credentials are refused never takes the connection from one whose work, nor runs it
        again before they do. The connection stays `down` meanwhile, with the reason."""
        reason = self._health[cid].last_error
        delay = backoff.next()
        log.error(
            "%s: down on this node: %s; lease released, so another node runs the connection; "
            "this node checks its credentials again in %.0fs and runs it only once they pass",
            cid,
            reason,
            delay,
        )
        while True:
            await asyncio.sleep(delay)
            connector = self._connectors[cid]
            if not isinstance(connector, CredentialCheck):
                return
            report = await self._check_one(cid, connector, CHECK_TIMEOUT)
            if report.ok:
                log.info(
                    "%s: credentials accepted again on this node (%s): it may run the "
                    "connection again",
                    cid,
                    report.detail,
                )
                return
            delay = backoff.next()
            log.info(
                "%s: still refused on this node: %s; checking again in %.0fs",
                cid,
                report.detail,
                delay,
            )
            self._set_state(cid, ConnectionState.DOWN, report.detail)

    async def _stop_owned(self) -> None:
        """Stop the transports this node owns and release their leases at once, so another
        node takes over without waiting for them to run out."""
        await cancel_and_wait(*self._work.values())
        self._work.clear()
        cluster = self._cluster
        for cid, lease in self._leases.items():
            if cluster is not None and cid in cluster.owned:
                cluster.lost(cid)
            try:
                await lease.release()
            except Exception as exc:
                log.info("%s: releasing the lease failed (it runs out by itself): %s", cid, exc)
        self._leases.clear()

    async def _supervise(self, cid: str, transport: Transport) -> None:
        backoff = self._new_backoff()
        loop = asyncio.get_running_loop()
        first = True
        while True:
            status = _Status(self, cid)
            try:
                await transport.run(status)
                reason = "the transport stopped by itself"
            except asyncio.CancelledError:
                raise
            except (UnauthorizedError, PermanentError) as exc:
                reason = self.redact(describe_error(exc))
                if not self._health[cid].leased:  # else `_own` says what becomes of it
                    log.error("%s: down, not retrying: %s", cid, reason)
                self._set_state(cid, ConnectionState.DOWN, reason)
                return
            except Exception as exc:
                reason = self.redact(describe_error(exc))
            if status.went_up_at is not None and loop.time() - status.went_up_at > STABLE_AFTER:
                backoff.reset()
            delay = backoff.next()
            self._health[cid].restarts += 1
            # A first attempt that never came up, whose caller says why (and may stop on it).
            reported = first and status.went_up_at is None and cid in self._first_failure_reported
            first = False
            if not reported:
                log.warning("%s: %s; reconnecting in %.1fs", cid, reason, delay)
            self._set_state(cid, ConnectionState.DEGRADED, reason)
            await asyncio.sleep(delay)

    def send_trouble(self, cid: str, what: str | None) -> None:
        """Sends of the connection are in trouble (`what`), or work again (None).

        What a transport cannot see: Slack's bot token revoked while its Socket Mode socket, on
        the app token, stays open; a mail server down while IMAP is fine. The connection is
        degraded, not stopped: inbound may flow.
        """
        health = self._health.get(cid)
        if health is None:
            return
        ours = health.state is ConnectionState.DEGRADED and (health.last_error or "").startswith(
            _SENDS
        )  # degraded by sends, not by the transport (whose own trouble it would hide)
        if what is not None and (health.state is ConnectionState.UP or ours):
            self._degrade(cid, what)
        elif what is None and ours:
            log.info("%s: sends work again", cid)
            self._set_state(cid, ConnectionState.UP, None)

    def _degrade(self, cid: str, reason: str) -> None:
        """Degraded, and said in the log once per change: an operator reading it sees what
        `/healthz` shows (a transport reports the same trouble again on every retry)."""
        health = self._health[cid]
        text = self.redact(reason)
        if health.state is not ConnectionState.DEGRADED or health.last_error != text:
            log.warning("%s: %s", cid, text)
        self._set_state(cid, ConnectionState.DEGRADED, reason)

    def _set_state(self, cid: str, state: ConnectionState, error: str | None) -> None:
        health = self._health[cid]
        if health.state is not state:
            health.since = utcnow()
        health.state = state
        if error is not None:  # an `up` keeps the last error visible after recovery
            health.last_error = self.redact(error)
        for waiter in list(self._waiters):
            waiter_cid, states, future = waiter
            if waiter_cid == cid and state in states and not future.done():
                future.set_result(health)

    async def wait_for(
        self, connection_id: str, *states: ConnectionState, timeout: float = 30.0
    ) -> ConnectionHealth:
        """Wait until the connection reaches one of `states` (tests and `check` use this)."""
        health = self.health(connection_id)
        if health.state in states:
            return health
        future: asyncio.Future[ConnectionHealth] = asyncio.get_running_loop().create_future()
        waiter = (connection_id, frozenset(states), future)
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(timeout):
                return await future
        finally:
            self._waiters.remove(waiter)

    # -- credentials ----------------------------------------------------------------------------

    async def check(self, timeout: float = CHECK_TIMEOUT) -> list[CheckReport]:
        """Every connection's credentials, tried at once (so unreachable ones cost one
        `timeout` in all, not one each), reported in the config's order."""
        return list(
            await asyncio.gather(
                *(
                    self._check_one(cid, connector, timeout)
                    for cid, connector in self._connectors.items()
                )
            )
        )

    async def _check_one(self, cid: str, connector: Talk, timeout: float) -> CheckReport:
        if not isinstance(connector, CredentialCheck):
            return CheckReport(cid, connector.channel, True, "nothing to check")
        try:
            async with asyncio.timeout(timeout):
                detail = await connector.check()
            return CheckReport(cid, connector.channel, True, detail)
        except TimeoutError:
            detail = f"no answer within {timeout:g}s"
            waiting = connector.check_waiting() if isinstance(connector, CheckWaiting) else None
            if waiting:
                detail = f"{waiting} (no other answer within {timeout:g}s)"
            return CheckReport(cid, connector.channel, False, self.redact(detail))
        except Exception as exc:
            return CheckReport(cid, connector.channel, False, self.redact(describe_error(exc)))


def _each_enabled(
    config: BridgeConfig, step: Callable[[str], _T]
) -> list[tuple[ConnectionConfig, _T]]:
    """`step(channel)` for every enabled connection, in the config's order; one `ConfigError`
    names every connection it refused, not just the first."""
    done: list[tuple[ConnectionConfig, _T]] = []
    refused: list[str] = []
    for index, conn in enumerate(config.connections):
        if not conn.enabled:
            continue
        try:
            done.append((conn, step(conn.channel)))
        except ConfigError as exc:
            refused.append(f"connections[{index}] ({conn.id}): {exc}")
    if refused:
        raise ConfigError("\n".join(refused))
    return done
