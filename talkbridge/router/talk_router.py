"""TalkRouter: how apps and hooks address connections without holding their transports.

Inbound, every message is deduped by (connection id, native id) in the store, recorded, and then
handed to subscribers strictly in order per thread, different threads concurrently (bounded).
A message that the store's filter of seen keys (`SeenFilter`) calls new is handled at once,
while its acceptance is still being written; only a "maybe seen" waits for the store's verdict.
Outbound, each connection has its own `OutboundQueue`.

In distributed mode (`use_cluster`) the owner of a connection puts accepted messages on the
Redis inbound bus instead, the node holding the thread's shard feeds them to the same per-thread
executor, and a send to a connection another node owns goes to that node (`talkbridge.cluster`).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Literal, overload

from talkbridge.backoff import Backoff
from talkbridge.cancellation import cancelling
from talkbridge.config import RouterConfig
from talkbridge.errors import (
    ConnectionMovedError,
    ConnectionNotStartedError,
    ConnectionStartFailedError,
    FeatureUnavailableError,
    LeaseLostError,
    SendFailedError,
    UnknownConnectionError,
)
from talkbridge.hooks.calls import defined_at, describe_hook_error, handler_name, log_failure
from talkbridge.message import NormalizedMessage, OutboundMessage, SendResult, thread_key
from talkbridge.router.ordering import KeyedSerialExecutor
from talkbridge.router.outbound import OutboundQueue, TroubleListener
from talkbridge.router.seen_keys import SeenKeys
from talkbridge.store.base import Store
from talkbridge.store.seen import SeenFilter
from talkbridge.talk import (
    FEATURE_NAMES,
    Activity,
    Delete,
    Directory,
    Edit,
    Feature,
    History,
    InboundMedia,
    Interactions,
    MessageHandler,
    Notices,
    Reactions,
    Streaming,
    Subscription,
    Talk,
)

if TYPE_CHECKING:
    from talkbridge.cluster import Cluster
    from talkbridge.cluster.inbound import Ack

log = logging.getLogger("talkbridge.router")

ArrivalListener = Callable[[NormalizedMessage], None]
_Item = tuple[NormalizedMessage, asyncio.Future[bool] | None, "Ack | None"]
"""(message, the store's dedupe verdict still to come, the bus acknowledgement)."""
_answering: contextvars.ContextVar[tuple[str, Ack] | None] = contextvars.ContextVar(
    "talkbridge_answering", default=None
)
"""In distributed mode, the thread key and the acknowledgement of the bus message the current
task is handling: its sends leave only while this node still holds that message's shard
(`InboundBus.still_holds`), and a loss of the shard during one cancels the task only after it."""


class RoutedTalk:
    """A `Talk` for one connection that goes through the router's queues."""

    def __init__(self, router: TalkRouter, connection_id: str, channel: str) -> None:
        self._router = router
        self.connection_id = connection_id
        self.channel = channel

    def subscribe(self, handler: MessageHandler) -> Subscription:
        return self._router.subscribe(self.connection_id, handler)

    async def send(self, message: OutboundMessage) -> SendResult:
        return await self._router.send(self.connection_id, message)

    def feature(self, name: str) -> Any:  # typed by `Talk`'s overloads
        return self._router.feature(self.connection_id, name)


class TalkRouter:
    def __init__(
        self,
        store: Store,
        config: RouterConfig | None = None,
        *,
        redact: Callable[[str], str] = str,
    ) -> None:
        self._store = store
        self._config = config or RouterConfig()
        self._redact = redact
        self._connectors: dict[str, Talk] = {}
        self._channels: dict[str, str] = {}
        self._outbound: dict[str, OutboundQueue] = {}
        self._subscriptions: dict[str, Subscription] = {}
        self._handlers: dict[str, list[MessageHandler]] = {}
        self._all_handlers: list[MessageHandler] = []
        self._arrival: list[ArrivalListener] = []
        self._expected: set[str] = set()
        """Connections of the config not attached yet (`expect`)."""
        self._attaching: dict[str, asyncio.Future[None]] = {}
        """Connections being built after the start (`attaching`): done once attached, or
        failed with the reason they will not be."""
        self._recovered: set[tuple[str, str]] = set()
        self._keeps_history: set[str] = set()
        """Connections whose connector records its own history (the webchat)."""
        self._cluster: Cluster | None = None
        self._abandoned: int | None = None
        """Set by `cut_off`: the turns left running."""
        self.on_send_trouble: TroubleListener | None = None
        """Told when a connection's sends are in trouble (refused credentials, failing again
        and again) and when they work again; the bridge points it at the registry, which keeps
        each connection's health."""
        self._seen = SeenKeys(store)
        self._inbound: KeyedSerialExecutor[str, _Item] = KeyedSerialExecutor(
            self._dispatch,
            max_active=self._config.max_concurrent_threads,
            max_pending=self._config.max_pending_messages,
            name="inbound",
        )

    def use_cluster(self, cluster: Cluster) -> None:
        """Distributed mode: inbound through the Redis bus, sends through connection owners."""
        self._cluster = cluster
        cluster.inbound.set_handler(self._from_bus)
        cluster.outbound.set_local(self._send_local)
        for queue in self._outbound.values():
            queue.claims = cluster.claims
            queue.fence = cluster.fence

    # -- connections ----------------------------------------------------------------------------

    def attach(self, connector: Talk) -> None:
        """Start routing a connection's traffic (the registry calls this for each connection)."""
        cid = connector.connection_id
        self._connectors[cid] = connector
        self._channels[cid] = connector.channel
        self._outbound[cid] = OutboundQueue(
            cid,
            connector.send,
            self._store,
            attempts=self._config.send_attempts,
            retry_for=self._config.send_retry_seconds,
            # A connector may know better: the webchat's sends are local writes, not API calls.
            concurrency=getattr(connector, "send_concurrency", None)
            or self._config.send_concurrency,
            redact=self._redact,
            backoff=lambda: Backoff(base=self._config.retry_base_delay, cap=30.0),
            on_trouble=self._send_trouble,
            claims=self._cluster.claims if self._cluster is not None else None,
            fence=self._cluster.fence if self._cluster is not None else None,
        )
        keeps_history = bool(getattr(connector, "keeps_history", False))
        if keeps_history:
            self._keeps_history.add(cid)
        else:
            self._keeps_history.discard(cid)

        on_inbound = functools.partial(self._accept, keeps_history=keeps_history)
        self._subscriptions[cid] = connector.subscribe(on_inbound)
        attached = self._attaching.pop(cid, None)  # its waiters hold the future
        if attached is not None and not attached.done():
            attached.set_result(None)

    def attaching(self, connection_id: str, channel: str) -> None:
        """The connection (of `channel`) is being built while the bridge serves (`talkbridge
        run` starts the webchat first): until it is attached, its sends (a hook's Forward to
        it, `talk(id).send`) and its messages left from an earlier run wait for it, rather
        than fail."""
        if connection_id not in self._connectors:
            future = asyncio.get_running_loop().create_future()
            future.add_done_callback(_retrieved)
            self._attaching[connection_id] = future
            self._channels[connection_id] = channel

    def not_attaching(self, connection_id: str, reason: str) -> None:
        """The connection `attaching` named will not be attached (`reason`): its waiting sends
        fail with it, as a down connection's do; its waiting messages stay in the store."""
        attached = self._attaching.get(connection_id)
        if attached is not None and not attached.done():
            attached.set_exception(ConnectionStartFailedError(connection_id, reason))

    async def _until_attached(self, connection_id: str) -> None:
        """Return once the connection is attached; raise `ConnectionStartFailedError` when it
        will not be. At once for a connection not being built (as before)."""
        attached = self._attaching.get(connection_id)
        if attached is not None:
            await asyncio.shield(attached)

    def _send_trouble(self, connection_id: str, what: str | None) -> None:
        if self.on_send_trouble is not None:
            self.on_send_trouble(connection_id, what)

    def detach(self, connection_id: str) -> None:
        sub = self._subscriptions.pop(connection_id, None)
        if sub is not None:
            sub.close()

    def keeps_history(self, connection_id: str) -> bool:
        """Whether the connection's connector records its thread history itself (the
        webchat); otherwise the router records what is sent, and the bridge what changes."""
        return connection_id in self._keeps_history

    def connection_ids(self) -> list[str]:
        return sorted(self._connectors)

    def expect(self, connection_ids: Iterable[str]) -> None:
        """The connections the config names, before they are attached (the Bridge builds them
        at start): an app may subscribe to them already, so it sees every message from the
        first; anything else asked of one says it is not started yet."""
        self._expected.update(connection_ids)

    def _known(self, connection_id: str) -> Talk:
        try:
            return self._connectors[connection_id]
        except KeyError:
            known = list(self._connectors.keys() | self._expected)
            if connection_id in self._expected:
                raise ConnectionNotStartedError(
                    connection_id, known, **self._start_state(connection_id)
                ) from None
            raise UnknownConnectionError(connection_id, known) from None

    def _start_state(self, connection_id: str) -> dict[str, Any]:
        """What `ConnectionNotStartedError` says of a connection being built while the bridge
        serves: still starting, or why it could not start."""
        attached = self._attaching.get(connection_id)
        if attached is None:
            return {}
        if not attached.done():
            return {"starting": True}
        failure = attached.exception()
        return {"failed": getattr(failure, "reason", None) or str(failure)}

    def talk(self, connection_id: str) -> Talk:
        """The connection, through the router's queues; one still starting too (its sends
        wait for it, and fail as to a down connection should it not start)."""
        if connection_id in self._attaching:
            return RoutedTalk(self, connection_id, self._channels[connection_id])
        connector = self._known(connection_id)
        return RoutedTalk(self, connection_id, connector.channel)

    @overload
    def feature(self, connection_id: str, name: Literal["history"]) -> History | None: ...
    @overload
    def feature(
        self, connection_id: str, name: Literal["inbound_media"]
    ) -> InboundMedia | None: ...
    @overload
    def feature(self, connection_id: str, name: Literal["activity"]) -> Activity | None: ...
    @overload
    def feature(self, connection_id: str, name: Literal["directory"]) -> Directory | None: ...
    @overload
    def feature(self, connection_id: str, name: Literal["interactions"]) -> Interactions | None: ...
    @overload
    def feature(self, connection_id: str, name: Literal["edit"]) -> Edit | None: ...
    @overload
    def feature(self, connection_id: str, name: Literal["delete"]) -> Delete | None: ...
    @overload
    def feature(self, connection_id: str, name: Literal["reactions"]) -> Reactions | None: ...
    @overload
    def feature(self, connection_id: str, name: Literal["streaming"]) -> Streaming | None: ...
    @overload
    def feature(self, connection_id: str, name: Literal["notices"]) -> Notices | None: ...
    @overload
    def feature(self, connection_id: str, name: str) -> Feature | None: ...
    def feature(self, connection_id: str, name: str) -> Feature | None:
        """The connection's `name` feature, or None when it lacks it. A name that is no
        feature (a typo) raises `ValueError` naming the features, rather than passing for one
        the connection lacks; a plug-in connector may offer features of its own names."""
        found: Feature | None = self._known(connection_id).feature(name)
        if found is None and name not in FEATURE_NAMES:
            raise ValueError(f"{name!r} is not a feature; features: {', '.join(FEATURE_NAMES)}")
        return found

    def outbound(self, connection_id: str) -> OutboundQueue:
        self._known(connection_id)
        return self._outbound[connection_id]

    # -- subscribing ----------------------------------------------------------------------------

    # The handler lists are replaced, never changed in place: a message being dispatched goes
    # to the subscribers it started with, even when one of them (un)subscribes meanwhile.

    def subscribe(self, connection_id: str, handler: MessageHandler) -> Subscription:
        if connection_id not in self._expected:
            self._known(connection_id)
        self._handlers[connection_id] = [*self._handlers.get(connection_id, ()), handler]
        return Subscription(functools.partial(self._unsubscribe, connection_id, handler))

    def _unsubscribe(self, connection_id: str, handler: MessageHandler) -> None:
        self._handlers[connection_id] = _without(self._handlers[connection_id], handler)

    def subscribe_all(self, handler: MessageHandler) -> Subscription:
        self._all_handlers = [*self._all_handlers, handler]
        return Subscription(functools.partial(self._unsubscribe_all, handler))

    def _unsubscribe_all(self, handler: MessageHandler) -> None:
        self._all_handlers = _without(self._all_handlers, handler)

    def on_arrival(self, listener: ArrivalListener) -> Subscription:
        """Called synchronously the moment a new (non-duplicate) message is accepted, before it
        waits for its thread: lets read-only hooks start early."""
        self._arrival.append(listener)
        return Subscription(lambda: self._arrival.remove(listener))

    # -- inbound --------------------------------------------------------------------------------

    async def _accept(self, message: NormalizedMessage, keeps_history: bool) -> None:
        if self._cluster is not None:
            # Dedupe and onto the bus in one step; the shard's holder handles it.
            if not await self._cluster.inbound.publish(message, record_history=not keeps_history):
                log.debug("duplicate %s/%s ignored", message.connection_id, message.id)
            return
        new = self._seen.add((message.connection_id, message.id))  # every key, either path
        # Only when its place in line is free to take at once: were it to wait for room, a
        # redelivery meanwhile would reach the store first and be taken for the original.
        if new and self._inbound.has_room:
            # Handled at once, while the store writes it; `deliver` returns once it has. The
            # store queues the write as it is called (`Store.seen_inbound`), before any worker
            # can run: so it precedes every write the handling makes (its completion included).
            self._inbound.put(message.thread_key, (message, None, None))
            self._arrived(message)
            await self._written(message, keeps_history)
            return
        # The thread slot is taken before the store answers, so messages delivered concurrently
        # keep their arrival order; `deliver` returns once the store has the message.
        verdict: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        await self._inbound.submit(message.thread_key, (message, verdict, None), verdict)
        try:
            accepted = await self._store.accept_inbound(message, record_history=not keeps_history)
        except asyncio.CancelledError:
            verdict.cancel()  # the connector gave up delivering; it will deliver again
            raise
        except BaseException as exc:
            verdict.set_exception(exc)
            raise
        self._inbound.opened(message.thread_key, verdict)  # now, not a loop turn later
        verdict.set_result(accepted)
        if accepted:
            self._arrived(message)

    def _arrived(self, message: NormalizedMessage) -> None:
        for listener in self._arrival:
            listener(message)

    async def _written(self, message: NormalizedMessage, keeps_history: bool) -> None:
        """Wait for the store to have a message already being handled."""
        try:  # (a cancelled wait leaves the write queued: the connector may deliver it again)
            accepted = await self._store.accept_inbound(message, record_history=not keeps_history)
        except Exception as exc:
            log.error(
                "the store refused %s/%s while it was being handled: %s",
                message.connection_id,
                message.id,
                exc,
            )
            raise
        if not accepted:  # only if something else writes to the store: the filter has no misses
            log.warning(
                "%s/%s was handled although the store had it already",
                message.connection_id,
                message.id,
            )

    async def seen_filter(self) -> SeenFilter | None:
        """The filter in use once the one being built (if any) is in place; None: no filter,
        every message waits for the store's verdict."""
        return await self._seen.current()

    async def _from_bus(self, message: NormalizedMessage, recovered: bool, ack: Ack) -> None:
        """A message from a held inbound shard; `recovered` when another node may have worked
        on it already (it was left unacknowledged)."""
        if recovered:
            self._recovered.add((message.connection_id, message.id))
        self._arrived(message)
        await self._inbound.submit(message.thread_key, (message, None, ack))

    async def start(self) -> int:
        """Begin taking traffic: have the store build its filter of seen messages (in the
        background: until it is there, each message waits for the store's verdict), then
        re-dispatch what an earlier run left unfinished (`recover`)."""
        if self._cluster is None:
            self._seen.start()
        return await self.recover()

    async def recover(self) -> int:
        """Re-dispatch messages accepted before a crash but never completed.

        In distributed mode the inbound bus does this: unacknowledged entries are claimed by
        whichever node takes their shard, so this node must not replay other nodes' work.
        """
        if self._cluster is not None:
            return 0
        pending = await self._store.pending_inbound()
        for message in pending:
            self._recovered.add((message.connection_id, message.id))
            self._arrived(message)
            await self._inbound.submit(message.thread_key, (message, None, None))
        return len(pending)

    async def _dispatch(self, _thread_key: str, item: _Item) -> None:
        message, accepted, ack = item
        if accepted is not None and not await self._was_accepted(message, accepted):
            return
        if self._attaching:  # one left from an earlier run of a connection still starting
            try:  # waits for it
                await self._until_attached(message.connection_id)
            except ConnectionStartFailedError:  # kept in the store: the next start answers it
                if ack is not None:
                    ack.abandon()
                return
        if ack is not None:
            await self._answer_from_bus(message, ack)
            return
        await self._handle(message)
        # Not reached when cancelled (shutdown, crash): the message stays pending and is
        # handled again by `recover()` at the next start.
        await self._store.complete_inbound(message.connection_id, message.id)
        self._recovered.discard((message.connection_id, message.id))

    async def _was_accepted(
        self, message: NormalizedMessage, accepted: asyncio.Future[bool]
    ) -> bool:
        """The store's dedupe verdict on a message handled while it was being written."""
        try:
            if await accepted:
                return True
            log.debug("duplicate %s/%s ignored", message.connection_id, message.id)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # we are being stopped, not the delivery
            # else the delivery was abandoned before the store took it
        except Exception:  # the store refused it: `deliver` raised to the connector already
            pass
        return False

    async def _handle(self, message: NormalizedMessage) -> None:
        for handlers in (self._handlers.get(message.connection_id, ()), self._all_handlers):
            for handler in handlers:
                try:
                    await handler(message)
                except LeaseLostError:
                    raise  # the message is the shard's new holder's now
                except (Exception, asyncio.CancelledError) as exc:
                    if isinstance(exc, asyncio.CancelledError) and cancelling():
                        raise  # we are being stopped (or the shard was lost)
                    # (a stray one: the subscriber awaited a task something else
                    # cancelled; raised on, it ended the task serving the thread)
                    log_failure(
                        log,
                        logging.ERROR,
                        "a subscriber failed on %s/%s: %s%s raised %s; the other subscribers "
                        "still get the message, this one does not get it again",
                        message.connection_id,
                        message.id,
                        handler_name(handler),
                        defined_at(handler),
                        describe_hook_error(exc),
                        exc=exc,
                    )

    async def _answer_from_bus(self, message: NormalizedMessage, ack: Ack) -> None:
        """Handle a message of a held shard, then acknowledge it. Should the shard be lost
        meanwhile, the turn is cancelled (or its next send refused) and the message left
        unacknowledged for the shard's new holder; one still waiting for its thread then is
        left without being started. Cancelled otherwise (a stop), it stays pending too."""
        if not ack.begin():
            ack.abandon()
            return
        answering = _answering.set((message.thread_key, ack))
        try:
            await self._handle(message)
            if ack.interrupted:  # asked for as a send ended: a cancel still to be delivered
                await asyncio.sleep(0)
        except LeaseLostError:
            ack.abandon()
            return
        except asyncio.CancelledError:
            if not _uncancel_interruption(ack):
                raise
            ack.abandon()
            return
        finally:
            ack.end()
            _answering.reset(answering)
        if _uncancel_interruption(ack):  # its cancel was swallowed (an agent catching it)
            ack.abandon()
            return
        await ack()
        self._recovered.discard((message.connection_id, message.id))

    def was_recovered(self, message: NormalizedMessage) -> bool:
        """True for a message accepted by an earlier run: work for it may already be done."""
        return (message.connection_id, message.id) in self._recovered

    async def join(self) -> None:
        """Wait until every accepted message has been handled and every queued send is done."""
        await self._inbound.join()
        for queue in list(self._outbound.values()):
            await queue.join()

    def stop_starting(self) -> int:
        """Shutdown: start no more turns (messages still arriving are accepted into the store,
        as are those waiting for their thread: they are handled at the next start). Returns
        how many accepted messages wait."""
        return self._inbound.stop_starting()

    @property
    def turns_running(self) -> int:
        return self._inbound.running

    async def finish(self) -> None:
        """After `stop_starting`: wait for the turns under way, then for every queued send."""
        await self._inbound.finish_running()
        for queue in list(self._outbound.values()):
            await queue.join()

    # -- outbound -------------------------------------------------------------------------------

    async def send(
        self, connection_id: str, message: OutboundMessage, *, check_sent: bool = True
    ) -> SendResult:
        """Send through the connection's queue; see `OutboundQueue.send` for `check_sent`.

        Buttons to a connection without the `interactions` feature raise
        `FeatureUnavailableError`: the choices would silently be missing from the message.
        To a connection still starting (`attaching`) it waits until it is attached; one that
        fails to start fails the send (`SendFailedError`), as a down connection does."""
        if self._attaching:
            try:
                await self._until_attached(connection_id)
            except ConnectionStartFailedError as exc:
                raise SendFailedError(connection_id, message.thread_id, exc.reason) from None
        queue = self.outbound(connection_id)
        if message.buttons and self.feature(connection_id, "interactions") is None:
            raise FeatureUnavailableError(
                f"connection {connection_id!r} ({self._channels[connection_id]}) cannot show "
                "buttons: it has no 'interactions' feature; send the choices in the text, or "
                "ask router.feature(id, 'interactions') first"
            )
        answering = _answering.get()
        if self._cluster is not None and answering is not None:
            thread, ack = answering
            if not await self._cluster.inbound.still_holds(thread):
                raise LeaseLostError(
                    f"no longer holding the shard of {thread!r}: its new holder answers it"
                )
            with ack.sending():
                result = await self._send_routed(queue, message, check_sent)
        else:
            result = await self._send_routed(queue, message, check_sent)
        if connection_id not in self._keeps_history:
            agent = message.meta.get("agent")  # the agent that answered, when one did
            self._store.queue_history(
                thread_key(connection_id, message.thread_id),
                "assistant",
                result.message_id,
                agent if isinstance(agent, str) else "bridge",
                message.text,
            )
        return result

    async def delete(
        self, connection_id: str, thread_id: str, message_id: str, *, why: str
    ) -> asyncio.Future[None]:
        """Delete our message `message_id` with the connection's `delete` feature, through its
        send queue: after the sends queued for the thread, retried as a send is, a final
        failure logged naming the message (`why` says what it is). Returns once queued; the
        future says how it went (`OutboundQueue.delete`)."""
        deleter = self.feature(connection_id, "delete")
        if deleter is None:
            raise FeatureUnavailableError(
                f"connection {connection_id!r} ({self._channels[connection_id]}) cannot delete "
                "messages: it has no 'delete' feature"
            )
        call = functools.partial(deleter.delete, thread_id, message_id)
        return await self.outbound(connection_id).delete(thread_id, message_id, call, why=why)

    async def _send_routed(
        self, queue: OutboundQueue, message: OutboundMessage, check_sent: bool
    ) -> SendResult:
        """Through this node's queue, or the connection's owner on another node."""
        cid = queue.connection_id
        cluster = self._cluster
        if cluster is not None and cluster.is_remote(cid):
            return await cluster.outbound.request(cid, message, check_sent=check_sent)
        try:
            return await queue.send(message, check_sent=check_sent)
        except ConnectionMovedError:
            if cluster is None:
                raise
            # Nothing of it went out from here (an earlier try may have: the owner checks).
            log.info("%s: moved to another node before a send went out; asking it to", cid)
            return await cluster.outbound.request(cid, message, check_sent=True)

    async def _send_local(
        self, connection_id: str, message: OutboundMessage, check_sent: bool
    ) -> SendResult:
        """A send another node asked this one (the owner) for; that node records history."""
        self._known(connection_id)
        return await self._outbound[connection_id].send(message, check_sent=check_sent)

    async def cut_off(self, grace: float = 5.0) -> int:
        """Shutdown, before the connections close: cancel the turns and sends under way (a
        send in flight is cancelled, not failed by its connection closing under it). Messages
        still arriving are accepted into the store for the next start, as after
        `stop_starting`. Returns how many turns ignored their cancellation for `grace` seconds
        and were left running (their messages stay pending: the next start answers them)."""
        if self._abandoned is None:
            self._abandoned = await self._inbound.cancel(grace)
            for queue in self._outbound.values():
                await queue.cancel()
        return self._abandoned

    async def close(self, grace: float = 5.0) -> int:
        """Stop everything (`cut_off` first, if not done); returns what `cut_off` does."""
        for cid in list(self._subscriptions):
            self.detach(cid)
        for cid in list(self._attaching):
            self.not_attaching(cid, "the bridge stopped before the connection started")
        self._seen.close()
        return await self.cut_off(grace)

    def sends_under_way(self) -> dict[str, int]:
        """Per connection, the sends accepted and not done yet (in flight, retried, queued)."""
        return {cid: q.under_way for cid, q in self._outbound.items() if q.under_way}

    def sent_counts(self) -> dict[str, tuple[int, int]]:
        return {cid: (q.sent, q.failed) for cid, q in self._outbound.items()}


def _retrieved(future: asyncio.Future[None]) -> None:
    """A failure nobody waited for is no "exception never retrieved" warning."""
    if not future.cancelled():
        future.exception()


def _uncancel_interruption(ack: Ack) -> bool:
    """Take back the cancel of a turn whose shard was lost; True unless the task is being
    cancelled for another reason too (a stop), which then goes on."""
    task = asyncio.current_task()
    if not ack.interrupted or task is None:
        return False
    return task.uncancel() == 0


def _without(handlers: list[MessageHandler], handler: MessageHandler) -> list[MessageHandler]:
    """A copy of `handlers` without (one subscription of) `handler`."""
    remaining = list(handlers)
    remaining.remove(handler)
    return remaining


__all__: Sequence[str] = ["ConnectionStartFailedError", "RoutedTalk", "TalkRouter"]
"""`ConnectionStartFailedError` lives in `talkbridge.errors`; importing it from here still works."""
