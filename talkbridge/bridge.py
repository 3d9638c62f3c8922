"""The Bridge wires store, registry, router, hooks and agents into the message path.

    connector --deliver--> router (dedupe, per-thread order) --> Bridge.handle
      --> channel-message hooks (decision) --> default trust routing --> agent turn
      --> router.send (per-connection queue) --> connector

It is also what `talkbridge run` starts and what apps embed. With a Redis store it is one node
of a distributed bridge (`talkbridge.cluster`): same path, with the hops between nodes on Redis.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import secrets as pysecrets
import sys
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal

from talkbridge import replies
from talkbridge.agents.base import Agent, TextDelta, TurnContext
from talkbridge.agents.echo import EchoAgent
from talkbridge.agents.runner import SORRY, AgentRunner, TurnOutcome, earlier_entries
from talkbridge.agents.sentinel import SentinelAgent
from talkbridge.cancellation import cancel_and_wait
from talkbridge.config import BridgeConfig, Secrets
from talkbridge.connectors.base import BaseConnector, ConnectorContext
from talkbridge.deletions import Deletions
from talkbridge.errors import (
    ConnectorError,
    SendFailedError,
    StoreError,
    UnknownConnectionError,
)
from talkbridge.hooks import HookDeps, HookRegistry
from talkbridge.hooks.channel_message import (
    Drop,
    Forward,
    RouteToAgent,
    RouteToSentinel,
)
from talkbridge.hooks.durable import DurableHooks
from talkbridge.hooks.listeners import FileUpload, ThreadCreated
from talkbridge.indicators import TypingIndicators
from talkbridge.message import MessageRouting, NormalizedMessage, OutboundMessage, Trust
from talkbridge.registry import ConnectionRegistry
from talkbridge.retention import sweep_forever
from talkbridge.router import TalkRouter
from talkbridge.store import SqliteStore, Store, open_store
from talkbridge.store.base import HistoryEntry
from talkbridge.talk import Streaming, Talk

if TYPE_CHECKING:
    from talkbridge.cluster import Cluster

log = logging.getLogger("talkbridge")

_TOKEN_KEY = "webchat:generated-token"


@dataclass(frozen=True, slots=True)
class Route:
    """Where one message goes: the outcome of the hooks plus the default trust routing."""

    agent: str | None
    trust: Trust
    routed_by: str | None
    message: NormalizedMessage
    drop_reason: str | None = None
    forward: Forward | None = None
    sender_trusted: bool = False
    """The sender alone is trusted, the message maybe not (`MessageRouting.sender_trusted`)."""


class Bridge:
    def __init__(
        self,
        config: BridgeConfig | None = None,
        secrets: Secrets | None = None,
        *,
        store: Store | None = None,
        agents: Mapping[str, Agent] | None = None,
        hooks: HookRegistry | None = None,
        app_id: str = "talkbridge",
        with_webchat: bool = True,
        node_id: str | None = None,
    ) -> None:
        self.config = config or BridgeConfig()
        self.secrets = secrets or Secrets()
        self.app_id = app_id
        self.store: Store = store or open_store(self.config.store, prefix=self.config.store_prefix)
        self.hooks = hooks or HookRegistry(environment=self.config.environment)
        self.router = TalkRouter(self.store, self.config.router, redact=self.secrets.redact)
        self.registry = ConnectionRegistry(self.store, self.secrets, on_attach=self.router.attach)
        self.router.on_send_trouble = self.registry.send_trouble
        configured = [c.id for c in self.config.connections if c.enabled]
        self.router.expect([*configured, "webchat"] if with_webchat else configured)
        self.cluster: Cluster | None = _cluster_for(self.store, self.config, node_id)
        """Distributed mode (a Redis store): this node's part of the cluster; else None."""
        if self.cluster is not None:
            self.router.use_cluster(self.cluster)
            self.registry.use_cluster(self.cluster)
        self._code_ttl = timedelta(seconds=self.config.pairing.code_ttl)
        builtin: dict[str, Agent] = {
            "echo": EchoAgent(),
            "sentinel": SentinelAgent(self.store, code_ttl=self._code_ttl),
        }
        builtin.update(agents or {})
        self.runner = AgentRunner(
            builtin,
            self.store,
            self.hooks,
            environment=self.config.environment,
            redact=self.secrets.redact,
            history=self._agent_history,
        )
        self.context = ConnectorContext(
            self.store,
            log,
            {"environment": self.config.environment},
            dedupe_for=timedelta(days=self.config.retention.dedupe_days),
        )
        self.deletions = Deletions()
        """Messages deleted while (or before) they are answered: their turns are called off."""
        self.context.on_deleted.append(self.deletions.deleted)
        self.context.deleting = self.router.delete
        self._with_webchat = with_webchat
        self.webchat: Any = None
        self.webchat_token: str | None = None
        self.new_webchat_token = False
        """Set before `start` to replace the generated webchat token (a leaked link)."""
        self.reports_webchat_failure = False
        """Set before `start` by a caller that reports a webchat unable to listen at its first
        attempt itself (`talkbridge run`: `webchat_url` raises, and it stops), so the registry,
        which retries, does not log that failure too. Later ones are logged as usual."""
        self._prefetches: dict[tuple[str, str], Any] = {}
        self._started = False
        self._stopping = False
        """Set while `stop` drains: /healthz says so (503)."""
        # durable hooks (issue 5): register handlers on `bridge.durable` before start
        self.durable = DurableHooks(self.store, app_id, redact=self.secrets.redact)
        self.typing = TypingIndicators(self.secrets.redact)
        self._sweeper: asyncio.Task[None] | None = None
        self._connecting: asyncio.Task[None] | None = None
        """`start_connections`: the connections built while the bridge serves."""
        self.abandoned_turns = 0
        """Set by `stop`: turns that ignored their cancellation and were left running."""
        self.swept = asyncio.Event()
        """Set after each retention sweep (`talkbridge.retention`)."""

    # -- lifecycle ------------------------------------------------------------------------------

    @property
    def node_id(self) -> str | None:
        """This node's id in distributed mode; None when embedded."""
        return self.cluster.node_id if self.cluster is not None else None

    async def start(self, *, connect: bool = True) -> None:
        """Open the store and start serving. `connect=False` (`talkbridge run`): the configured
        connections are checked and registered (`starting` in /healthz; their messages and
        sends wait for them) but their SDKs, which take seconds to import, are not loaded
        yet: `start_connections` builds and starts them while the webchat serves."""
        self._stopping = False
        await self.store.open()
        if isinstance(self.store, SqliteStore):  # before anything reads what the bridge serves
            try:
                self.store.lock_for_serving()
            except StoreError:
                await self.store.close()
                raise
        if self.cluster is not None:
            await self.cluster.start()
        self.add_configured_agents()
        if connect:
            self.registry.build(self.config, self.context)
        else:
            self.registry.expect(self.config)
            for cid in self.registry.pending():
                conn = self.registry.config(cid)
                assert conn is not None  # `expect` keeps the config of each
                self.router.attaching(cid, conn.channel)
        if self._with_webchat:
            await self._add_webchat()
            if self.cluster is not None:
                self.webchat.use_fanout(self.cluster.fanout)
                await self.cluster.fanout.start()
        if self.config.hooks:
            from talkbridge.hooks.loader import load_hook_folders

            load_hook_folders(
                self.config.hook_folders(), self.hook_deps(), self.hooks, self.registry.ids()
            )
            for problem in self.unknown_hook_targets(self.registry.ids()):
                log.warning("%s", problem)
        self.hooks.freeze()
        for cid in self.registry.ids():  # imperative hooks, from folders and from code alike
            self.hooks.register_connection(cid)
        self.router.subscribe_all(self.handle)
        self.router.on_arrival(self._prefetch)
        await self.router.start()
        await self.registry.start()
        if self.cluster is not None:
            await self.cluster.inbound.start()
        for name, handler in self.hooks.durable.items():  # from hook folders (kind: durable)
            if name not in self.durable.names:
                self.durable.register(name, handler)
        await self.durable.start()  # durable hooks (issue 5)
        self._sweeper = asyncio.create_task(
            sweep_forever(self.store, self.config.retention, self.swept), name="retention sweep"
        )
        self._started = True

    def start_connections(self) -> asyncio.Task[None]:
        """After `start(connect=False)`: import the connections' SDKs (in a thread) and build
        and start each connection in the background, as soon as its SDK is in. `stop` cancels
        what is left of it. The task ends once each has been started (or found unable to)."""
        if self._connecting is None:
            self._connecting = asyncio.create_task(
                self.registry.build_pending(self.context, failed=self._not_started),
                name="starting connections",
            )
        return self._connecting

    def _not_started(self, connection_id: str, reason: str) -> None:
        """A connection `start_connections` could not build: what waits for it fails (or, in
        distributed mode, goes to the nodes that run it)."""
        self.router.not_attaching(connection_id, reason)
        if self.cluster is not None:
            self.cluster.cannot_run(connection_id, reason)

    async def stop(self, *, drain_timeout: float = 10.0, cancel_grace: float = 5.0) -> None:
        """Stop taking traffic, let in-flight turns and sends finish, then close everything.

        Turns still running after `drain_timeout` are cancelled; one that ignores it for
        `cancel_grace` seconds more (an agent swallowing `CancelledError`) is left behind,
        counted in `abandoned_turns`, and runs again at the next start: the stop never hangs."""
        if not self._started:
            if self.cluster is not None:
                await self.cluster.stop()
            await self.store.close()
            return
        self._started = False
        self._stopping = True
        if self._connecting is not None:
            await cancel_and_wait(self._connecting)
            self._connecting = None
        if self._sweeper is not None:
            await cancel_and_wait(self._sweeper)
            self._sweeper = None
        if self.cluster is not None:
            await self.cluster.quiesce()  # no new entries or send requests from other nodes
        later = "another node or the next start" if self.cluster is not None else "the next start"
        waiting = self.router.stop_starting()
        if waiting:
            log.info(
                "stopping: %s in the store for %s",
                _count(waiting, "accepted message waits", "accepted messages wait"),
                later,
            )
        try:
            async with asyncio.timeout(drain_timeout):
                await self.router.finish()
        except TimeoutError:
            running = self.router.turns_running
            log.warning(
                "stopping: %s within %g s; %s on %s",
                _count(running, "turn did not finish", "turns did not finish"),
                drain_timeout,
                "it runs again" if running == 1 else "they run again",
                later,
            )
            _log_unsent(self.router.sends_under_way(), later)
        # The turns and sends are cut off before the connections close: a send in flight is
        # cancelled, not failed (and retried) by its connection closing under it. The router
        # still takes what the connections deliver meanwhile (kept for the next start).
        self.abandoned_turns = await self.router.cut_off(cancel_grace)
        await self.registry.stop()  # releases connection leases: other nodes take over now
        if self.cluster is not None:
            await self.cluster.stop()  # releases shards (what was not acked is claimed)
        await self.router.close(cancel_grace)
        if self.abandoned_turns:
            log.warning(
                "stopping: %s within %g s of being cancelled; left behind, %s on %s",
                _count(self.abandoned_turns, "turn did not stop", "turns did not stop"),
                cancel_grace,
                "it runs again" if self.abandoned_turns == 1 else "they run again",
                later,
            )
        self.typing.close()
        cut_off = await self.hooks.close(cancel_grace)
        if cut_off:
            log.warning(
                "stopping: %s within %g s; cancelled",
                _count(
                    cut_off,
                    "hook observer or turn watcher did not finish",
                    "hook observers or turn watchers did not finish",
                ),
                cancel_grace,
            )
        await self.durable.stop()  # durable hooks (issue 5)
        await self.store.close()

    async def __aenter__(self) -> Bridge:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    def add_configured_agents(self) -> None:
        """The agents the config defines; a ConfigError if a role names none of them."""
        from talkbridge.agents import build_agent
        from talkbridge.preflight import check_agent_roles

        for name, spec in self.config.agents.definitions.items():
            agent = build_agent(
                name, spec, self.store, self.config.base_dir, code_ttl=self._code_ttl
            )
            self.runner.add_agent(agent, name)
        check_agent_roles(self)

    def unknown_hook_targets(self, connection_ids: Collection[str]) -> list[str]:
        """The agents and connections the hook folders' code names as literals
        (`RouteToAgent("billing")`) that the bridge lacks: one line each (`talkbridge.hooks.
        targets`). Call once the agents are added and the hooks loaded."""
        from talkbridge.hooks.loader import hook_folders
        from talkbridge.hooks.targets import unknown_targets

        disabled = [conn.id for conn in self.config.connections if not conn.enabled]
        folders = hook_folders(self.config.hook_folders())
        return unknown_targets(folders, self.runner.agent_names, connection_ids, disabled)

    def hook_deps(self) -> HookDeps:
        """What the hooks of the config's folders are given."""
        return HookDeps(
            app_id=self.app_id,
            logger=logging.getLogger(f"talkbridge.hooks.{self.app_id}"),
            router=self.router,
            agent_runner=self.runner,
            context={"config": self.config, "store": self.store, "bridge": self},
            hooks=self.hooks,
            environment=self.config.environment,
        )

    async def _add_webchat(self) -> None:
        from talkbridge.config import ConnectionConfig
        from talkbridge.webchat import WebchatConnector

        settings = self.config.webchat
        tokens = [t.get_secret_value() for t in settings.tokens]
        if not tokens and settings.issuer is None:
            self.webchat_token = await self._generated_token()
            tokens = [self.webchat_token]
        for token in tokens:
            self.secrets.add(token)
        if settings.issuer is not None and settings.issuer.weak_secret:
            log.warning(
                "webchat.issuer.secret is shorter than %d bytes, which HS256 needs (RFC 7518): "
                "whoever guesses it can sign in as anyone; use a long random one "
                "(python3 -c 'import secrets; print(secrets.token_urlsafe(32))')",
                settings.issuer.MIN_SECRET_BYTES,
            )
        self.webchat = WebchatConnector(
            settings,
            self.context,
            tokens,
            self.registry.states,
            node_info=self._node_info,
            generated_token=self.webchat_token is not None,
            dedupe_for=self.context.dedupe_for,
        )
        self.registry.add(
            self.webchat,
            ConnectionConfig(id="webchat", channel="webchat", trusted=settings.trusted),
            caller_reports_first_failure=self.reports_webchat_failure,
        )

    async def _generated_token(self) -> str:
        """The embedded default's token: made at the first start and kept in the store, so the
        printed link, and the pages open with it, keep working across restarts (and the nodes
        of a cluster share it). `new_webchat_token` makes a new one, which `webchat_url` keeps
        once the webchat listens: a start that fails leaves the old link working."""
        if self.new_webchat_token:
            return pysecrets.token_urlsafe(24)
        token = await self.store.get_state(_TOKEN_KEY)
        if token is None:
            await self.store.set_state(_TOKEN_KEY, pysecrets.token_urlsafe(24))
            token = await self.store.get_state(_TOKEN_KEY)  # a node that wrote after us wins
            assert token is not None
        return token

    def _node_info(self) -> dict[str, Any]:
        """What /healthz shows beside the connections: the store, and this node's part."""
        info = self.cluster.describe() if self.cluster is not None else {}
        if self._stopping:  # a load balancer sends new sockets elsewhere meanwhile
            info["stopping"] = True
        watchers = self.hooks.lifecycle.health()
        if watchers:  # a watcher too slow for the traffic has events dropped: how many
            info["watchers"] = watchers
        return {"store": self.store.health(), **info}

    async def webchat_url(self, timeout: float = 30.0) -> str:
        """The address to open once the webchat listens; with the token if we generated it.
        Raises `TransientError` (saying why) if its first attempt to listen failed."""
        async with asyncio.timeout(timeout):
            await self.webchat.listening()
        if self.new_webchat_token and self.webchat_token is not None:
            await self.store.set_state(_TOKEN_KEY, self.webchat_token)  # replaces the old link
            self.new_webchat_token = False
        url: str = self.webchat.url(self.webchat_token)
        return url

    # -- the message path -----------------------------------------------------------------------

    def talk(self, connection_id: str) -> Talk:
        return self.router.talk(connection_id)

    def _prefetch(self, message: NormalizedMessage) -> None:
        prefetch = self.hooks.channel_message.prefetch(message)
        if prefetch is not None:
            self._prefetches[(message.connection_id, message.id)] = prefetch

    async def route(self, message: NormalizedMessage) -> Route:
        """Run the channel-message hooks, then apply the default trust routing."""
        prefetch = self._prefetches.pop((message.connection_id, message.id), None)
        outcome = await self.hooks.channel_message.decide(message, prefetch=prefetch)
        message = outcome.message
        # Trusted by config (the common case) decides without a store call, nor a coroutine.
        if self._trusted_by_config(message):
            trusted = sender_trusted = True
        else:
            trusted, sender_trusted = await self._trust(message)
        trust: Trust = "trusted" if trusted else "untrusted"
        decision = outcome.decision
        by = outcome.decided_by
        sentinel = self.config.agents.sentinel
        if isinstance(decision, Drop):
            reason = decision.reason
            return Route(
                None, trust, by, message, drop_reason=reason, sender_trusted=sender_trusted
            )
        if isinstance(decision, Forward):
            return Route(None, trust, by, message, forward=decision, sender_trusted=sender_trusted)
        if isinstance(decision, RouteToAgent):
            return Route(decision.agent, trust, by, message, sender_trusted=sender_trusted)
        if isinstance(decision, RouteToSentinel):
            return Route(sentinel, trust, by, message, sender_trusted=sender_trusted)
        # No hook decided: trusted senders meet the default agent, everyone else the sentinel.
        agent = self.config.agents.default if trusted else sentinel
        return Route(agent, trust, None, message, sender_trusted=sender_trusted)

    async def is_trusted(self, message: NormalizedMessage) -> bool:
        """Trusted by config, or by approved pairings: of its sender, and of everyone else the
        answer reaches whom the config does not trust (a stranger on an email's Cc)."""
        return self._trusted_by_config(message) or (await self._trust(message))[0]

    async def _trust(self, message: NormalizedMessage) -> tuple[bool, bool]:
        """Whether the message is trusted, and whether its sender is. Kept apart: a trusted
        sender whose mail Cc's a stranger is screened, but is no stranger to pair."""
        if message.sender_verified is False:  # its sender id is a claim (a forged From?)
            return False, False
        cid = message.connection_id
        config = self.registry.config(cid)
        sender = (config is not None and config.trusts_sender(message)) or (
            await self.store.is_trusted(cid, message.channel_user_id)
        )
        if not sender or config is None:
            return sender, sender
        for who in config.others_answered(message):
            if not config.trusts(who) and not await self.store.is_trusted(cid, who):
                return False, True
        return True, True

    def _trusted_by_config(self, message: NormalizedMessage) -> bool:
        if message.sender_verified is False:
            return False
        config = self.registry.config(message.connection_id)
        return config is not None and config.trusts_message(message)

    async def handle(self, message: NormalizedMessage) -> None:
        route = await self.route(message)
        if route.drop_reason is not None:
            await self._screen(route.message)
            log.info(
                "dropped %s/%s: %s (by %s)",
                message.connection_id,
                message.id,
                route.drop_reason,
                route.routed_by,
            )
            await self._note(route.message, "not_answered")
            return
        untrusted = route.trust != "trusted"
        if route.forward is not None:
            if untrusted:  # passed on to a connection, not to an agent
                await self._screen(route.message)
            await self._forward(route)
            return
        agent = route.agent
        assert agent is not None
        if agent not in self.runner.agent_names:
            if untrusted:
                await self._screen(route.message)
            known = ", ".join(sorted(self.runner.agent_names))
            await self._apologize(
                route.message,
                f"{self._hook_named(route.routed_by)} routed the message to agent {agent!r}, "
                f"which is not defined (agents: {known})",
                screen=untrusted,
            )
            return
        sentinel = self.config.agents.sentinel
        if untrusted and agent != sentinel and not route.routed_by:
            agent = sentinel  # never reached: the default routing guarantees it
        if agent == sentinel:
            await self._screen(route.message)
        elif untrusted:  # a hook routed it to `agent`: no other agent sees it as history
            await self._screen(route.message, visible_to=agent)
        routed = route.message.model_copy(
            update={"routing": _routing(agent, route.trust, route.routed_by, route.sender_trusted)}
        )
        if routed.edit_of is None and await self._answered_before(routed):
            return
        await self._notify_listeners(routed)
        await self._turn(routed, agent)

    async def _turn(self, message: NormalizedMessage, agent: str) -> None:
        """Answer `message` (or an edit of it) with `agent`; then end what the turn streamed,
        which its connection drops unless the turn's final message went out. A message
        deleted meanwhile is not answered (`talkbridge.deletions`)."""
        cid = message.connection_id
        stream = self._stream(message)
        try:
            if message.edit_of is not None:
                await self._handle_edit(message, agent, stream)
                return
            if await self._deleted(message, message.id):
                log.info("%s/%s was deleted before its turn: not answered", cid, message.id)
                return
            outcome = None
            with self.deletions.answering(cid, message.id):
                outcome = await self.answer(message, agent, stream)
            if outcome is not None and outcome.text:
                await self._reply(message, outcome)
        finally:
            if stream is not None:
                await stream.end()

    async def _note(
        self, message: NormalizedMessage, kind: Literal["not_answered", "forwarded"]
    ) -> None:
        """Where the sender waits in view for the answer (the webchat), tell them none will come
        here: it is not answered (dropped), or it was passed on (forwarded). Without a word, such
        a message just sat there. Never why, nor where to: that is for the log."""
        notices = self.router.feature(message.connection_id, "notices")
        if notices is None:
            return
        try:
            if kind == "forwarded":
                await notices.forwarded(message.thread_id, message.id)
            else:
                await notices.not_answered(message.thread_id, message.id)
        except Exception as exc:  # the message is handled all the same: say so in the log
            log.warning(
                "%s/%s: could not tell the sender it is %s: %s",
                message.connection_id,
                message.id,
                "passed on" if kind == "forwarded" else "not answered",
                self.secrets.redact(str(exc)),
            )

    async def _screen(
        self, message: NormalizedMessage, *, visible_to: str | None = None, ids: Sequence[str] = ()
    ) -> None:
        """Remember that `message` (or our replies `ids` in its thread) was screened: the
        sentinel answered it, a hook dropped or forwarded it, or it came from an untrusted
        sender. Its text stays in the thread's history, but agents never see it there
        (`_agent_history`), except `visible_to`, the agent a hook routed it to. An edit takes
        the message it edits along: the history shows the edit's words in its place.
        Messages of one thread are handled one at a time, so this update cannot race itself."""
        key = _SCREENED_KEY + message.thread_key
        screened = _screened(await self.store.get_state(key))
        edited = () if message.edit_of is None else (message.edit_of,)
        new = [i for i in (ids or (message.id, *edited)) if i not in screened]
        if not new:
            return  # the same message again (run again after a restart)
        for message_id in new:
            screened[message_id] = visible_to
        entries = [i if a is None else [i, a] for i, a in screened.items()]
        await self.store.set_state(key, json.dumps(entries[-_SCREENED_KEPT:]))

    async def _agent_history(self, message: NormalizedMessage, limit: int) -> list[HistoryEntry]:
        """What an agent sees of its thread's past (`ctx.history`): never a message the
        sentinel screened or a hook dropped, nor the sentinel's answers, nor a note for the
        people of the thread (role `system`: the webchat's "not answered"). An untrusted sender's
        words reach an agent only when a hook routes them there, not later as history (a
        stranger in a group, a sender before the operator approved them).

        At most `MAX_AGENT_HISTORY` entries: the screened ids kept per thread cover every
        screened message among that many, and no more."""
        entries = await earlier_entries(self.store, message, min(limit, MAX_AGENT_HISTORY))
        screened = _screened(await self.store.get_state(_SCREENED_KEY + message.thread_key))
        sentinel = self.config.agents.sentinel
        agent = message.routing.agent if message.routing is not None else None
        return [
            entry
            for entry in entries
            if not (entry.message_id in screened and screened[entry.message_id] != agent)
            and not (entry.role == "assistant" and entry.sender in (sentinel, UNTRUSTED_FORWARD))
            and entry.role != "system"  # notes for the people in the thread ("not answered")
        ]

    async def _notify_listeners(self, message: NormalizedMessage) -> None:
        """`on_file_upload` and `on_thread_create` run listeners; free when nobody listens."""
        listeners = self.hooks.listeners
        if message.attachments and listeners.has_listeners("on_file_upload"):
            for attachment in message.attachments:
                await listeners.on_file_upload(
                    FileUpload(message.connection_id, message.thread_id, attachment)
                )
        if listeners.has_listeners("on_thread_create"):
            # Messages of one thread are handled in order, so this check cannot race itself.
            key = f"thread-seen:{message.thread_key}"
            if await self.store.get_state(key) is None:
                await self.store.set_state(key, message.id)
                await listeners.on_thread_create(
                    ThreadCreated(
                        message.connection_id, message.thread_id, message.channel, implicit=True
                    )
                )

    def _stream(self, message: NormalizedMessage) -> _Stream | None:
        streaming = self.router.feature(message.connection_id, "streaming")
        if streaming is None:
            return None
        return _Stream(streaming, message.thread_id, self.secrets.redact)

    async def answer(
        self, message: NormalizedMessage, agent: str, stream: _Stream | None = None
    ) -> TurnOutcome | None:
        """Run one turn, its deltas to `stream`, and typing to connections that show it."""
        activity = self.router.feature(message.connection_id, "activity")
        typing = self.typing.begin(activity, message.thread_id) if activity is not None else None
        on_event = None
        if stream is not None:
            delta = stream.delta
            end_typing = self.typing.end

            async def on_event(ctx: TurnContext, event: Any) -> None:
                if type(event) is TextDelta:
                    if typing is not None:  # the stream shows the reply coming from now on
                        end_typing(typing)
                    await delta(ctx.session.turn_id, event.text)

        try:
            return await self.runner.run_turn(message, agent, on_event=on_event)
        finally:
            if typing is not None:
                self.typing.end(typing)

    async def _reply(self, message: NormalizedMessage, outcome: TurnOutcome) -> None:
        cid = message.connection_id
        if await self._deleted(message, message.id):  # as the turn ended (or on another node)
            log.info("%s/%s was deleted: its answer is not sent", cid, message.id)
            return
        reply = OutboundMessage(
            thread_id=message.thread_id,
            text=outcome.text,
            reply_to=message.id,
            idempotency_key=_reply_key(message),
            meta={
                "stream_id": outcome.session.turn_id,
                "status": outcome.status,
                "agent": outcome.session.agent_name,  # the history's sender of the reply
            },
        )
        if outcome.ok:  # should the bridge die after the send, the next start queues it
            await self.durable.remember_turn_completed(
                outcome.session, outcome.status, message_id=message.id
            )
        try:
            # A fresh message cannot have been answered before: skip the idempotency lookup.
            result = await self.router.send(
                cid, reply, check_sent=self.router.was_recovered(message)
            )
        except SendFailedError as exc:  # recorded by the queue; nothing else to do here
            log.error("reply to %s/%s not delivered: %s", cid, message.id, exc.reason)
            return
        await self._replied(message, result.message_ids)
        await self._turn_completed(message, outcome)

    async def _replied(self, message: NormalizedMessage, reply_ids: Sequence[str]) -> None:
        """What follows the send of a reply (done again for one found sent before: each step
        keeps what is there already)."""
        cid = message.connection_id
        await self._screen_reply(message, reply_ids)
        if self._edits_or_deletes(cid):  # the map is how an edit or delete finds our reply
            await self._remember_reply(message, message.id, reply_ids)

    async def _screen_reply(self, message: NormalizedMessage, reply_ids: Sequence[str]) -> None:
        """Our reply `reply_ids` to an untrusted sender's `message` a hook routed to an agent
        (or to an edit of it, answered anew) answers words that agent alone saw: no other
        agent reads it either. The sentinel's replies are hidden by their sender."""
        routing = message.routing
        if (
            routing is not None
            and routing.trust != "trusted"
            and routing.agent != self.config.agents.sentinel
        ):
            await self._screen(message, visible_to=routing.agent, ids=reply_ids)

    async def _remember_reply(
        self, message: NormalizedMessage, answered: str, reply_ids: Sequence[str]
    ) -> None:
        """Put our reply to `answered` in the id map; should `answered` have been deleted
        while the reply was being posted (the deletion found no reply on record), the reply
        goes now."""
        cid = message.connection_id
        await replies.remember(self.store, cid, answered, reply_ids)
        if await self._deleted(message, answered):
            connector = self.registry.get(cid)
            if isinstance(connector, BaseConnector):
                await connector.take_back_reply(message.thread_id, answered)

    async def _deleted(self, message: NormalizedMessage, answered: str) -> bool:
        """Whether `answered` (`message`'s id, or the message it edits) was deleted. In
        embedded mode a fresh message's deletion is heard in this process: no store read.
        One handled again after a restart, or by a node of a cluster (the deletion may have
        reached another), asks the store for its tombstone."""
        cid = message.connection_id
        if (cid, answered) in self.deletions:
            return True
        if self.cluster is None and not self.router.was_recovered(message):
            return False
        connector = self.registry.get(cid)
        if not getattr(connector, "reports_deletions", False):
            return False
        return await replies.tombstone(self.store, cid, answered) is not None

    async def _answered_before(self, message: NormalizedMessage) -> bool:
        """Whether a message handled again (accepted before a crash, or left by a node that
        lost its shard) has its reply on record as sent. Its turn is then not run again: its
        agent would be paid twice for an answer whose send is skipped, while its streamed
        pieces reached the webchat's pages under a final message that never came."""
        if not self.router.was_recovered(message):
            return False  # a fresh message: no lookup
        cid = message.connection_id
        try:
            reply_ids = await self.store.sent_result(cid, _reply_key(message))
        except StoreError as exc:  # answer it: its reply's send looks again before it goes
            log.warning("%s/%s: could not tell whether it was answered: %s", cid, message.id, exc)
            return False
        if not reply_ids:
            return False
        log.info("%s/%s was answered before; its turn is not run again", cid, message.id)
        await self._replied(message, reply_ids)
        await self.durable.emit_remembered_turn_completed(cid, message.thread_key, message.id)
        return True

    async def _turn_completed(self, message: NormalizedMessage, outcome: TurnOutcome) -> None:
        """Durable hooks' `TurnCompleted` once a turn's answer is out (a reply, or an edit of
        the earlier one); `message` fixes its event id, so a turn run again repeats it."""
        if outcome.ok and self.durable.wants_turn_completed:
            await self.durable.emit_turn_completed(
                outcome.session, outcome.status, message_id=message.id
            )

    def _edits_or_deletes(self, connection_id: str) -> bool:
        feature = self.router.feature
        return feature(connection_id, "edit") is not None or (
            feature(connection_id, "delete") is not None
        )

    async def _handle_edit(
        self, message: NormalizedMessage, agent: str, stream: _Stream | None
    ) -> None:
        """An edit re-answers by editing our earlier reply; it never starts a second thread."""
        assert message.edit_of is not None
        cid = message.connection_id
        earlier_reply = await self.store.lookup_id(cid, message.edit_of)
        editor = self.router.feature(cid, "edit")
        if earlier_reply is None or editor is None:
            log.info("edit of %s/%s recorded; no reply to update", cid, message.edit_of)
            return
        outcome = None
        with self.deletions.answering(cid, message.edit_of):  # deleted: its reply goes
            outcome = await self.answer(message, agent, stream)
        if outcome is None or not outcome.text or await self._deleted(message, message.edit_of):
            return
        later = await replies.later_parts(self.store, cid, message.edit_of)
        try:
            await editor.edit(message.thread_id, earlier_reply, outcome.text)
        except ConnectorError as exc:  # too long for one message, or the reply is gone
            log.info(
                "could not edit reply %s on %s (%s): the new answer goes as a new reply",
                earlier_reply,
                cid,
                self.secrets.redact(str(exc)),
            )
        else:
            await self._screen_reply(message, [earlier_reply])  # it answers the edit now
            await self._delete_replies(message, later)  # the old answer's later parts
            await self._answer_replaced(message, earlier_reply, outcome)
            await self._turn_completed(message, outcome)
            return
        reply = OutboundMessage(
            thread_id=message.thread_id,
            text=outcome.text,
            reply_to=message.edit_of,
            idempotency_key=_reply_key(message),
            meta={"agent": outcome.session.agent_name},  # the history's sender of the reply
        )
        try:
            result = await self.router.send(cid, reply)
        except SendFailedError as exc:  # the old answer stays: better than none
            log.error("answer to edited %s/%s not delivered: %s", cid, message.id, exc.reason)
            return
        await self._screen_reply(message, result.message_ids)  # as the reply it replaces
        await self._delete_replies(message, [earlier_reply, *later])  # replaced: it goes
        await self._answer_replaced(message, earlier_reply)
        await self._remember_reply(message, message.edit_of, result.message_ids)
        await self._turn_completed(message, outcome)

    async def _answer_replaced(
        self, message: NormalizedMessage, reply_id: str, now: TurnOutcome | None = None
    ) -> None:
        """Our reply `reply_id` was replaced by the answer to the edit `message`: its old words
        leave the thread's history (later turns read the answer as it stands, not both); an
        answer edited in place (`now`) is recorded again, under its id, as it now reads."""
        if self.router.keeps_history(message.connection_id):
            return  # the connector keeps its own
        key = message.thread_key
        await self.store.forget_history(key, [reply_id])
        if now is not None:
            await self.store.append_history(
                key, "assistant", reply_id, now.session.agent_name, now.text
            )

    async def _delete_replies(self, message: NormalizedMessage, ids: list[str]) -> None:
        """Delete our earlier messages `ids` answering `message` (an edit replaced them):
        queued and retried as sends are; one that cannot be deleted is logged."""
        cid = message.connection_id
        if self.router.feature(cid, "delete") is None or not ids:
            return
        assert message.edit_of is not None
        why = f"our answer to {message.edit_of}, replaced after its edit"
        for reply_id in ids:
            await self.router.delete(cid, message.thread_id, reply_id, why=why)
        await replies.forget_later_parts(self.store, cid, message.edit_of)

    async def _forward(self, route: Route) -> None:
        forward = route.forward
        assert forward is not None
        message = route.message
        screen = route.trust != "trusted"
        target = self.registry.config(forward.connection_id)
        if forward.thread_id is None and target is not None and target.channel == "webchat":
            # A webchat thread is one session's conversation: "the same thread id" there is
            # the sender's own conversation (a webchat message), where their words came back
            # as the assistant's under "Passed on", or no conversation at all.
            await self._apologize(
                message,
                f"{self._hook_named(route.routed_by)} forwarded the message to webchat "
                f"connection {forward.connection_id!r} without a thread_id; a webchat thread is "
                "one session's conversation, so name it: Forward(connection_id, "
                "thread_id='<session_id>.<conversation_id>'); nothing was passed on",
                screen=screen,
            )
            return
        if target is None and forward.connection_id not in self.router.connection_ids():
            cid = forward.connection_id
            disabled = any(c.id == cid and not c.enabled for c in self.config.connections)
            why = "disabled (enabled: false)" if disabled else "not configured"
            known = ", ".join(sorted(self.registry.ids()))
            await self._apologize(
                message,
                f"{self._hook_named(route.routed_by)} forwarded the message to connection "
                f"{cid!r}, which is {why} (connections: {known})",
                screen=screen,
            )
            return
        # Said as soon as the hook decided: the send may take a while (a connection still
        # starting, a 429's Retry-After, retries), and the sender waited for it without a word.
        await self._note(message, "forwarded")
        name = message.display_name or message.channel_user_id
        target_thread = forward.thread_id or message.thread_id
        text = f"{name} ({message.connection_id}): {message.text}"
        # A stranger's words become the bridge's own message in the target thread: its history
        # names them as such, so that no agent answering there reads them (`_agent_history`).
        meta = {"agent": UNTRUSTED_FORWARD} if screen else {}
        try:
            await self.router.send(
                forward.connection_id,
                OutboundMessage(
                    thread_id=target_thread,
                    text=text,
                    markup="plain",
                    attachments=message.attachments,
                    idempotency_key=f"forward:{message.connection_id}:{message.id}",
                    meta=meta,
                ),
            )
        except (SendFailedError, UnknownConnectionError) as exc:
            reason = exc.reason if isinstance(exc, SendFailedError) else str(exc)
            log.error("forward of %s/%s failed: %s", message.connection_id, message.id, reason)
            await self._note(message, "not_answered")  # passed on it was not: nobody answers

    def _hook_named(self, name: str | None) -> str:
        """`channel-message hook 'router': Router.on_message (FILE line N)`: the hook behind a
        decision, and its code, for the operator to find it."""
        code = self.hooks.channel_message.chain.code_of(name) if name else ""
        return f"channel-message hook {name!r}" + (f": {code}" if code else "")

    async def _apologize(
        self, message: NormalizedMessage, problem: str, *, screen: bool = False
    ) -> None:
        """A hook's decision that cannot be carried out: the operator's log says which hook and
        why, and the sender is not left waiting in silence (the detail only in development,
        as for a failed turn)."""
        log.error("%s/%s: %s; answered with an apology", message.connection_id, message.id, problem)
        development = self.config.environment == "development"
        reply = OutboundMessage(
            thread_id=message.thread_id,
            text=problem if development else SORRY,
            reply_to=message.id,
            idempotency_key=_reply_key(message),
        )
        try:
            result = await self.router.send(message.connection_id, reply)
        except SendFailedError as exc:
            log.error("apology to %s/%s not delivered: %s", message.connection_id, message.id, exc)
            return
        if screen:  # it answers a screened message: no agent sees it either
            await self._screen(message, ids=result.message_ids)

    # -- operator actions -----------------------------------------------------------------------

    async def approve_pairing(self, code: str) -> bool:
        """Whether `code` was known (and is approved now); `PairingExpiredError` for a code
        past its `pairing.code_ttl`, which trusts nobody."""
        return await self.store.approve_pairing(code) is not None


class _Stream:
    """A turn's reply as a connection with `streaming` shows it while it is produced."""

    __slots__ = ("_redact", "_stream_id", "_streaming", "_thread_id")

    def __init__(self, streaming: Streaming, thread_id: str, redact: Callable[[str], str]) -> None:
        self._streaming = streaming
        self._thread_id = thread_id
        self._redact = redact
        self._stream_id: str | None = None

    async def delta(self, stream_id: str, text: str) -> None:
        self._stream_id = stream_id
        await self._streaming.delta(self._thread_id, stream_id, text)

    async def end(self) -> None:
        """The turn is over: the connection drops what it showed of a reply whose final
        message did not go out. Never raises: a failure here must not fail the turn, nor
        stand in for its cancellation (the message would count as handled)."""
        if self._stream_id is None:
            return  # nothing was shown
        try:
            await self._streaming.end(self._thread_id, self._stream_id)
        except Exception as exc:
            log.warning(
                "could not end the stream of %s: %s", self._thread_id, self._redact(str(exc))
            )


_SCREENED_KEY = "screened:"
MAX_AGENT_HISTORY = 1000
"""The most earlier messages an agent is given (`history`, `ctx.history(n)`)."""
UNTRUSTED_FORWARD = "(untrusted forward)"
"""The history's sender of an untrusted sender's message a hook forwarded into another thread:
a name no agent is given, and hidden from every agent."""
_SCREENED_KEPT = MAX_AGENT_HISTORY
"""Screened ids remembered per thread: as many as the longest history an agent is given, so
every screened message in it is known."""


def _screened(value: str | None) -> dict[str, str | None]:
    """The screened ids of a thread, oldest first, each with the one agent that may see it
    (None: no agent). Stored as a JSON list of ids and `[id, agent]` pairs."""
    if not value:
        return {}
    try:
        items = json.loads(value)
    except ValueError:
        return {}
    screened: dict[str, str | None] = {}
    for item in items if isinstance(items, list) else ():
        if isinstance(item, str):
            screened[item] = None
        elif isinstance(item, list) and len(item) == 2 and all(isinstance(i, str) for i in item):
            screened[item[0]] = item[1]
    return screened


def _reply_key(message: NormalizedMessage) -> str:
    """The idempotency key of the bridge's answer to `message`: one answer per message."""
    return f"reply:{message.id}"


@functools.lru_cache(maxsize=1024)
def _routing(
    agent: str, trust: Trust, routed_by: str | None, sender_trusted: bool
) -> MessageRouting:
    """Routings are frozen and few (agents x trust x hook names): build each once."""
    return MessageRouting(
        agent=agent, trust=trust, routed_by=routed_by, sender_trusted=sender_trusted
    )


def _cluster_for(store: Store, config: BridgeConfig, node_id: str | None) -> Cluster | None:
    """A Redis store means distributed mode; embedded mode never imports redis."""
    redis_store = sys.modules.get("talkbridge.store.redis")
    if redis_store is None or not isinstance(store, redis_store.RedisStore):
        return None
    from talkbridge.cluster import Cluster

    return Cluster(store, config.cluster, node_id)


def _log_unsent(unsent: Mapping[str, int], later: str) -> None:
    """What a stop cuts off, by connection: a turn's reply goes again when the turn runs again
    (`later`); any other send fails to its caller and stays in the failed-send record."""
    if not unsent:
        return
    counts = ", ".join(f"{_count(n, 'send', 'sends')} to {cid}" for cid, n in unsent.items())
    log.warning(
        "stopping: %s cut off (in flight or queued): a turn's reply goes out when the turn "
        "runs again on %s; any other send fails, kept in the failed-send record",
        counts,
        later,
    )


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"
