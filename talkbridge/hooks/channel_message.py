"""The channel-message hook kind: every inbound message passes through it and it decides the route.

Declarative hooks are `async def on_message(msg) -> Decision | None` (sync functions work too). A
routing decision (`RouteToAgent`, `RouteToSentinel`, `Forward`) or `Drop` ends the chain; `Modify`
continues it with a new message; `Continue()` or None lets the next hook decide. When no hook
decides, `RoutingOutcome.decision` is None and the Bridge applies its default routing (trust →
agent, otherwise the sentinel).

Imperative hooks implement `ChannelMessageHook` (`register()`, `register_connection(id)`) and wire
themselves into the message loop through the TalkRouter; they are not part of the chain.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, TypeAlias, TypeVar, overload, runtime_checkable

from talkbridge.hooks.engine import (
    DEFAULT_TIMEOUT,
    GLOBAL,
    Block,
    EventAttrs,
    HookChain,
    HookFailure,
    HookFilter,
    OnError,
    Prefetch,
    Registration,
    Scope,
)
from talkbridge.message import NormalizedMessage

KIND = "channel-message"
MESSAGE_EVENT = "message"
EDIT_EVENT = "message.edited"


@runtime_checkable
class ChannelMessageHook(Protocol):
    def register(self) -> None:
        """Wire into the message loop (called once at load)."""
        ...

    def register_connection(self, connection_id: str) -> None:
        """Subscribe via the TalkRouter (called by the Bridge for each connection)."""
        ...


@dataclass(frozen=True, slots=True)
class RouteToAgent:
    agent: str


@dataclass(frozen=True, slots=True)
class RouteToSentinel:
    pass


@dataclass(frozen=True, slots=True)
class Drop:
    reason: str


@dataclass(frozen=True, slots=True)
class Forward:
    connection_id: str
    thread_id: str | None = None
    """None: the thread with the same id on the target connection (the Bridge decides); a
    webchat target needs one, as its threads are sessions' conversations (refused without)."""


@dataclass(frozen=True, slots=True)
class Modify:
    """Replace the message and let the next hook decide."""

    message: NormalizedMessage


@dataclass(frozen=True, slots=True)
class Continue:
    """Let the next hook decide (same as returning None)."""


Routing: TypeAlias = RouteToAgent | RouteToSentinel | Drop | Forward
"""The decisions that end the chain."""
Decision: TypeAlias = Routing | Modify | Continue

OnMessage = Callable[[NormalizedMessage], Any]
F = TypeVar("F", bound=Callable[..., Any])


class RoutingOutcome(NamedTuple):
    message: NormalizedMessage
    """The message after every modification."""
    decision: Routing | None
    """None when no hook decided: the Bridge applies the default routing."""
    decided_by: str | None
    failures: tuple[HookFailure, ...] = ()
    modified_by: tuple[str, ...] = ()


def describe_message(msg: NormalizedMessage) -> EventAttrs:
    """Filter/scope fields of an inbound message."""
    return EventAttrs(
        channel=msg.channel,
        connection_id=msg.connection_id,
        thread_id=msg.thread_id,
        thread_key=msg.thread_key,
        direction="inbound",
        event_type=EDIT_EVENT if msg.edit_of is not None else MESSAGE_EVENT,
    )


class ChannelMessageHooks:
    """The channel-message chain: declarative hooks in order, plus observers."""

    def __init__(self, register: Callable[..., Any] | None = None) -> None:
        self._register = register
        """How the decorator registers: the owning `HookRegistry.register`, or `self.add`."""
        self.chain: HookChain[NormalizedMessage] = HookChain(
            KIND,
            terminal=(RouteToAgent, RouteToSentinel, Drop, Forward),
            allow=(Continue,),
            modify={Modify: _modified_message},
            event_type=NormalizedMessage,
            describe=describe_message,
        )

    def add(
        self,
        on_message: OnMessage,
        *,
        name: str,
        order: int = 0,
        timeout: float | None = DEFAULT_TIMEOUT,
        on_error: OnError = "fail-open",
        filter: HookFilter | None = None,
        scope: Scope = GLOBAL,
        needs_thread_lock: bool = True,
        observer: bool = False,
    ) -> Registration:
        """Add a declarative hook (see `HookChain.add` for the options)."""
        return self.chain.add(
            on_message,
            name=name,
            order=order,
            timeout=timeout,
            on_error=on_error,
            filter=filter,
            scope=scope,
            needs_thread_lock=needs_thread_lock,
            observer=observer,
        )

    def hook(self, *, name: str | None = None, **options: Any) -> Callable[[F], F]:
        """Decorator form: `@chain.hook(order=10)` above `async def on_message(msg)`."""

        def decorate(fn: F) -> F:
            if self._register is not None:
                self._register(KIND, fn, name=name or fn.__name__, **options)
            else:
                self.add(fn, name=name or fn.__name__, **options)
            return fn

        return decorate

    @overload
    def __call__(self, fn: F, /) -> F: ...
    @overload
    def __call__(
        self, fn: None = None, /, *, name: str | None = None, **options: Any
    ) -> Callable[[F], F]: ...
    def __call__(self, fn: F | None = None, /, *, name: str | None = None, **options: Any) -> Any:
        """`@hooks.channel_message` or `@hooks.channel_message(order=10, filter=...)`."""
        decorate = self.hook(name=name, **options)
        return decorate if fn is None else decorate(fn)

    def remove(self, name: str, *, scope: Scope | None = None, missing_ok: bool = False) -> int:
        return self.chain.remove(name, scope=scope, missing_ok=missing_ok)

    def has_listeners(self, event_type: str | None = None) -> bool:
        return self.chain.has_listeners(event_type)

    def freeze(self) -> None:
        self.chain.freeze()

    def prefetch(self, msg: NormalizedMessage) -> Prefetch | None:
        """Start the lock-free hooks for `msg` now (on arrival, before its thread's turn) and
        pass the result to `decide`; None when there are no lock-free hooks."""
        return self.chain.prefetch(msg)

    async def decide(
        self, msg: NormalizedMessage, prefetch: Prefetch | None = None
    ) -> RoutingOutcome:
        """Run the chain; a block (a fail-closed failure) comes back as `Drop`."""
        if not self.chain._total:
            return RoutingOutcome(msg, None, None)
        outcome = await self.chain.run(msg, None, prefetch=prefetch)
        decision = outcome.decision
        if isinstance(decision, Block):
            decision = Drop(decision.reason)
        return RoutingOutcome(
            outcome.event, decision, outcome.decided_by, outcome.failures, outcome.modified_by
        )

    def running(self) -> set[asyncio.Task[None]]:
        return self.chain.running()

    async def drain(self) -> None:
        await self.chain.drain()


def _modified_message(result: Modify) -> NormalizedMessage:
    return result.message
