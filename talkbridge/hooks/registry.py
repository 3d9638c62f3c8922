"""`HookRegistry`: one place holding every hook kind, for code registration and hook folders alike.

    hooks = HookRegistry()

    @hooks.channel_message(order=10)
    async def vip(msg): ...

    hooks.register("turn-middleware", MyMiddleware(), order=5)
    hooks.unregister("vip")
    hooks.freeze()          # at start: later global changes raise RuntimeError

Each kind checks its interface on registration and raises `TypeError` naming the hook when the
object does not implement it (the loader turns that into a `HookLoadError` naming the folder).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Literal, TypeVar, overload

from talkbridge.cancellation import cancel_and_wait
from talkbridge.hooks.calls import check_async, check_call, defined_at, is_async
from talkbridge.hooks.channel_message import ChannelMessageHook, ChannelMessageHooks
from talkbridge.hooks.chat import ChatHooks
from talkbridge.hooks.engine import HookFilter
from talkbridge.hooks.lifecycle import (
    TURN_FINISHED,
    TURN_STARTED,
    LifecycleKind,
    LifecycleWatchers,
)
from talkbridge.hooks.listeners import LISTENER_EVENTS, RunListeners
from talkbridge.hooks.middleware import (
    ConfiguredMiddleware,
    FunctionMiddleware,
    MiddlewareStack,
    TurnHandler,
    TurnMiddleware,
    middleware_name,
)

HookKind = Literal[
    "channel-message",
    "turn-middleware",
    "agent-turn-started",
    "agent-turn-finished",
    "run-listener",
    "chat",
    "reply",
    "durable",
]
KINDS: Final[tuple[str, ...]] = HookKind.__args__  # type: ignore[attr-defined]
Environment = Literal["production", "development"]

KIND_OPTIONS: Final[dict[str, frozenset[str]]] = {
    "channel-message": frozenset(
        {"order", "timeout", "on_error", "filter", "scope", "needs_thread_lock", "observer"}
    ),
    "turn-middleware": frozenset({"order", "on_error"}),
    "agent-turn-started": frozenset(),
    "agent-turn-finished": frozenset(),
    "run-listener": frozenset({"event"}),
    "chat": frozenset({"on_error", "timeout"}),
    "reply": frozenset({"on_error", "timeout"}),
    "durable": frozenset(),
}
"""The options each kind takes (`register(kind, hook, **options)`, and hook.yaml's keys
besides `kind` and `name`; `scope` is for code only). docs/hooks.md has them as a table."""
# the method an object hook of each kind provides when it is not itself callable
_METHOD: Final[dict[str, str]] = {
    "channel-message": "on_message",
    "agent-turn-started": "on_turn_started",
    "agent-turn-finished": "on_turn_finished",
    "chat": "on_chat",
    "reply": "on_reply",
    "durable": "on_event",
}

# the methods through which each kind calls an object hook; `on_error` is left out: it is also
# the fail-open/fail-closed option of several kinds, so it tells nothing about the kind meant
_METHODS_OF: Final[dict[str, frozenset[str]]] = {
    "channel-message": frozenset({"on_message", "register_connection"}),
    "turn-middleware": frozenset({"handle"}),
    "agent-turn-started": frozenset({"on_turn_started", "on_turn_finished"}),
    "agent-turn-finished": frozenset({"on_turn_started", "on_turn_finished"}),
    "run-listener": frozenset(LISTENER_EVENTS) - {"on_error"},
    "chat": frozenset({"on_chat"}),
    "reply": frozenset({"on_reply"}),
    "durable": frozenset({"on_event"}),
}

log = logging.getLogger("talkbridge.hooks")

# kinds whose function is called with one argument (the others check their own calls)
_ONE_ARGUMENT: Final[dict[str, str]] = {
    "agent-turn-started": "event",
    "agent-turn-finished": "event",
    "durable": "event",
}

if TYPE_CHECKING:
    from talkbridge.agents.runner import AgentRunner
    from talkbridge.router import TalkRouter

F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class HookDeps:
    """What `create_hook(deps)` receives."""

    app_id: str
    logger: logging.Logger
    router: TalkRouter
    """The TalkRouter: `router.talk(id)`, `router.subscribe(...)`, `router.send(...)`."""
    agent_runner: AgentRunner
    context: dict[str, Any] = field(default_factory=dict)
    """The app context (shared state the app put there)."""
    hooks: HookRegistry | None = None
    environment: Environment = "production"


class RegisteredHook:
    """Handle for a registered hook: `remove()` or a `with` block unregisters it."""

    __slots__ = ("kind", "name", "registry")

    def __init__(self, registry: HookRegistry, kind: str, name: str) -> None:
        self.registry = registry
        self.kind = kind
        self.name = name

    def remove(self) -> None:
        self.registry.unregister(self.name, missing_ok=True)

    def __enter__(self) -> RegisteredHook:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def __repr__(self) -> str:
        return f"<{self.kind} hook {self.name!r}>"


def is_connection_hook(obj: Any) -> bool:
    """Whether `obj` is an imperative `ChannelMessageHook` (register/register_connection)."""
    return callable(getattr(obj, "register", None)) and callable(
        getattr(obj, "register_connection", None)
    )


def _callable_of(kind: str, obj: Any, name: str) -> Callable[..., Any]:
    method = getattr(obj, _METHOD[kind], None)
    fn = method if callable(method) else obj
    if callable(fn) and not isinstance(fn, type):
        if kind in _ONE_ARGUMENT:
            check_call(fn, (_ONE_ARGUMENT[kind],), f"{kind} hook {name!r}")
        return fn  # type: ignore[no-any-return]
    raise TypeError(
        f"{kind} hook {name!r}: {type(obj).__name__} is not a function and has no "
        f"{_METHOD[kind]}() method"
    )


def _warn_of_other_kinds(kind: str, hook: Any, name: str) -> None:
    """An object registered as one kind that has another kind's method (`on_turn_finished` on a
    channel-message hook): that method is never called, which would pass unnoticed."""
    if inspect.isroutine(hook):
        return
    for other in sorted(set().union(*_METHODS_OF.values()) - _METHODS_OF[kind]):
        method = getattr(hook, other, None)
        if not callable(method):
            continue
        kinds = [k for k, methods in _METHODS_OF.items() if other in methods]
        log.warning(
            "%s hook %r: its %s()%s is never called: the hook is registered as %s, and %s() "
            "is what %s hooks call; to have it called, register it as that kind too (a hook "
            "folder of its own)",
            kind,
            name,
            other,
            defined_at(method),
            kind,
            other,
            " or ".join(kinds),
        )


class HookRegistry:
    """Every hook kind of one bridge."""

    def __init__(self, *, environment: Environment = "production") -> None:
        self.environment: Environment = environment
        self.channel_message = ChannelMessageHooks(register=self.register)
        """The chain (`decide`, `prefetch`), and the decorator `@hooks.channel_message(...)`."""
        self.middleware = MiddlewareStack()
        self.lifecycle = LifecycleWatchers()
        self.listeners = RunListeners(environment=environment)
        self.chat = ChatHooks(environment=environment)
        self.connection_hooks: dict[str, ChannelMessageHook] = {}
        """Imperative channel-message hooks; the Bridge calls `register_connection` on each."""
        self.durable: dict[str, Callable[..., Any]] = {}
        """Durable hooks by name: the Bridge hands them to its `DurableHooks` at start."""
        self._kinds: dict[str, str] = {}
        self._frozen = False

    # -- registering --------------------------------------------------------------------------

    def register(
        self, kind: str, hook: Any, *, name: str | None = None, **options: Any
    ) -> RegisteredHook:
        """Register `hook` as a hook of `kind` (see `KINDS`) with the kind's options."""
        if kind not in KIND_OPTIONS:
            raise ValueError(f"unknown hook kind {kind!r}; kinds: {', '.join(KINDS)}")
        name = name or _default_name(hook)
        unknown = set(options) - KIND_OPTIONS[kind]
        if unknown:
            allowed = ", ".join(sorted(KIND_OPTIONS[kind])) or "none"
            raise TypeError(
                f"{kind} hook {name!r}: option(s) {', '.join(sorted(unknown))} do not apply; "
                f"allowed: {allowed}"
            )
        scope = options.get("scope")
        if self._frozen and (scope is None or scope.kind == "global"):
            raise RuntimeError(
                f"cannot register {kind} hook {name!r}: hooks were frozen when the bridge started;"
                " register before start (channel-message hooks may still use a thread/connection"
                " scope)"
            )
        owner = self._kinds.get(name)
        if owner is not None and (owner != kind or kind != "channel-message"):
            raise ValueError(f"a hook named {name!r} is already registered (kind {owner})")
        getattr(self, "_add_" + kind.replace("-", "_"))(hook, name, options)
        self._kinds[name] = kind
        _warn_of_other_kinds(kind, hook, name)
        return RegisteredHook(self, kind, name)

    def _add_channel_message(self, hook: Any, name: str, options: dict[str, Any]) -> None:
        if is_connection_hook(hook):
            if options:
                raise TypeError(
                    f"channel-message hook {name!r} wires itself in (register/register_connection);"
                    f" options {', '.join(sorted(options))} apply only to on_message hooks"
                )
            if self.channel_message.chain.frozen:
                raise RuntimeError(f"cannot add channel-message hook {name!r}: hooks are frozen")
            what = f"channel-message hook {name!r}"
            check_call(hook.register, (), what)
            check_call(hook.register_connection, ("connection_id",), what)
            hook.register()
            self.connection_hooks[name] = hook
            return
        if not callable(getattr(hook, "on_message", None)) and not (
            callable(hook) and not isinstance(hook, type)
        ):
            raise TypeError(
                f"channel-message hook {name!r}: {type(hook).__name__} is neither a "
                "ChannelMessageHook (register() and register_connection(connection_id)) nor a "
                "declarative hook (an on_message(msg) method or function)"
            )
        fn = _callable_of("channel-message", hook, name)
        flt = options.get("filter")
        if isinstance(flt, dict):
            options = {**options, "filter": HookFilter.model_validate(flt)}
        self.channel_message.add(fn, name=name, **options)

    def _add_turn_middleware(self, hook: Any, name: str, options: dict[str, Any]) -> None:
        what = f"turn-middleware hook {name!r}"
        handle = getattr(hook, "handle", None)
        if callable(handle):
            check_call(handle, ("ctx", "next"), what)
            check_async(handle, what, "async def handle(self, ctx, next)")
            self.middleware.add(
                ConfiguredMiddleware(
                    hook,
                    name=name,
                    order=int(options.get("order", getattr(hook, "order", 0))),
                    on_error=options.get("on_error", getattr(hook, "on_error", "fail-open")),
                )
            )
        elif inspect.isroutine(hook):
            check_call(hook, ("ctx", "next"), what)
            check_async(hook, what, f"async def {getattr(hook, '__name__', 'mw')}(ctx, next)")
            self.middleware.add(FunctionMiddleware(hook, name=name, **options))
        else:
            raise TypeError(
                f"{what}: {type(hook).__name__}{defined_at(type(hook))} has no "
                "async handle(ctx, next) method and is not an async function (ctx, next)"
            )

    def _add_agent_turn_started(self, hook: Any, name: str, options: dict[str, Any]) -> None:
        self._add_watcher(TURN_STARTED, hook, name)

    def _add_agent_turn_finished(self, hook: Any, name: str, options: dict[str, Any]) -> None:
        self._add_watcher(TURN_FINISHED, hook, name)

    def _add_watcher(self, kind: str, hook: Any, name: str) -> None:
        """A function watches `kind`; an object gets the events it has methods for, both when
        it has both, whichever of the two kinds it is registered as (one watcher, one name,
        its events in order)."""
        kinds: list[LifecycleKind] = [
            k for k in (TURN_STARTED, TURN_FINISHED) if callable(getattr(hook, _METHOD[k], None))
        ]
        if not kinds:
            kinds = [TURN_STARTED if kind == TURN_STARTED else TURN_FINISHED]
        calls = [(k, _callable_of(k, hook, name)) for k in kinds]  # all checked before adding
        for k, fn in calls:
            self.lifecycle.add(k, fn, name=name)

    def _add_run_listener(self, hook: Any, name: str, options: dict[str, Any]) -> None:
        self.listeners.add(hook, name=name, event=options.get("event"))

    def _add_chat(self, hook: Any, name: str, options: dict[str, Any]) -> None:
        self.chat.add_chat(_callable_of("chat", hook, name), name=name, **options)

    def _add_reply(self, hook: Any, name: str, options: dict[str, Any]) -> None:
        self.chat.add_reply(_callable_of("reply", hook, name), name=name, **options)

    def _add_durable(self, hook: Any, name: str, options: dict[str, Any]) -> None:
        handler = _callable_of("durable", hook, name)
        if not is_async(handler):
            raise TypeError(
                f"durable hook {name!r} must be an async function (event) -> None, or have an "
                "async on_event(event)"
            )
        self.durable[name] = handler

    def unregister(self, name: str, *, missing_ok: bool = False) -> None:
        """Remove the hook named `name`, whatever its kind (all its scopes for channel-message)."""
        kind = self._kinds.get(name)
        if kind is None:
            if missing_ok:
                return
            raise KeyError(f"no hook named {name!r}")
        if kind == "channel-message":
            if name in self.connection_hooks:
                if self._frozen:
                    raise RuntimeError(f"cannot unregister hook {name!r}: hooks are frozen")
                del self.connection_hooks[name]
            else:
                self.channel_message.remove(name, missing_ok=True)
        elif kind == "turn-middleware":
            self.middleware.remove(name)
        elif kind in (TURN_STARTED, TURN_FINISHED):
            self.lifecycle.remove(name)
        elif kind == "run-listener":
            self.listeners.remove(name)
        elif kind == "durable":
            if self._frozen:
                raise RuntimeError(f"cannot unregister hook {name!r}: hooks are frozen")
            del self.durable[name]
        else:
            self.chat.remove(name)
        del self._kinds[name]

    def kind_of(self, name: str) -> str | None:
        return self._kinds.get(name)

    def names(self) -> dict[str, str]:
        """Registered hook names and their kinds."""
        return dict(self._kinds)

    def freeze(self) -> None:
        """Called at start: global hooks are fixed from now on (thread/connection scopes stay)."""
        self._frozen = True
        self.channel_message.freeze()
        self.middleware.freeze()
        self.lifecycle.freeze()
        self.listeners.freeze()
        self.chat.freeze()

    @property
    def frozen(self) -> bool:
        return self._frozen

    def register_connection(self, connection_id: str) -> None:
        """Let every imperative channel-message hook subscribe to `connection_id`."""
        for hook in self.connection_hooks.values():
            hook.register_connection(connection_id)

    def middlewares(self) -> list[TurnMiddleware]:
        """The registered turn middlewares in registration order (give them to `compose`)."""
        return self.middleware.items()

    def compose_turn(self, innermost: TurnHandler) -> TurnHandler:
        """Build the middleware onion around `innermost` (the agent call); do it once."""
        return self.middleware.compose(innermost, environment=self.environment)

    async def drain(self) -> None:
        """Wait for observers and lifecycle watchers already started."""
        await self.channel_message.drain()
        await self.lifecycle.drain()

    async def close(self, grace: float) -> int:
        """At a stop: wait up to `grace` seconds for the observers and watchers under way,
        then cancel the rest (giving them as long again to end). Each is bounded only by its
        own timeout (30 s by default, or what its hook.yaml says): one that hangs must not hold
        the stop that long. Returns how many were cut off."""
        tasks = self.channel_message.running() | self.lifecycle.running()
        if not tasks:
            return 0
        _, pending = await asyncio.wait(tasks, timeout=grace)
        if pending:
            await cancel_and_wait(*pending, within=grace)
        return len(pending)

    # -- decorators ---------------------------------------------------------------------------

    def _decorator(self, kind: str, fn: Any, name: str | None, options: dict[str, Any]) -> Any:
        def decorate(target: F) -> F:
            self.register(kind, target, name=name, **options)
            return target

        return decorate if fn is None else decorate(fn)

    @overload
    def turn_middleware(self, fn: F, /) -> F: ...
    @overload
    def turn_middleware(
        self, fn: None = None, /, *, name: str | None = None, **options: Any
    ) -> Callable[[F], F]: ...
    def turn_middleware(
        self, fn: F | None = None, /, *, name: str | None = None, **options: Any
    ) -> Any:
        """`@hooks.turn_middleware(order=5)` above `async def mw(ctx, next)`."""
        return self._decorator("turn-middleware", fn, name, options)

    @overload
    def on_turn_started(self, fn: F, /) -> F: ...
    @overload
    def on_turn_started(
        self, fn: None = None, /, *, name: str | None = None
    ) -> Callable[[F], F]: ...
    def on_turn_started(self, fn: F | None = None, /, *, name: str | None = None) -> Any:
        return self._decorator(TURN_STARTED, fn, name, {})

    @overload
    def on_turn_finished(self, fn: F, /) -> F: ...
    @overload
    def on_turn_finished(
        self, fn: None = None, /, *, name: str | None = None
    ) -> Callable[[F], F]: ...
    def on_turn_finished(self, fn: F | None = None, /, *, name: str | None = None) -> Any:
        return self._decorator(TURN_FINISHED, fn, name, {})

    def run_listener(self, event: str, *, name: str | None = None) -> Callable[[F], F]:
        """`@hooks.run_listener("before_tool_call")` above `async def check(ctx, call)`."""
        decorate: Callable[[F], F] = self._decorator("run-listener", None, name, {"event": event})
        return decorate

    @overload
    def chat_hook(self, fn: F, /) -> F: ...
    @overload
    def chat_hook(
        self, fn: None = None, /, *, name: str | None = None, **options: Any
    ) -> Callable[[F], F]: ...
    def chat_hook(self, fn: F | None = None, /, *, name: str | None = None, **options: Any) -> Any:
        return self._decorator("chat", fn, name, options)

    @overload
    def reply_hook(self, fn: F, /) -> F: ...
    @overload
    def reply_hook(
        self, fn: None = None, /, *, name: str | None = None, **options: Any
    ) -> Callable[[F], F]: ...
    def reply_hook(self, fn: F | None = None, /, *, name: str | None = None, **options: Any) -> Any:
        return self._decorator("reply", fn, name, options)


def _default_name(hook: Any) -> str:
    name = getattr(hook, "name", None)
    if isinstance(name, str) and name:
        return name
    name = getattr(hook, "__name__", None)
    if isinstance(name, str) and name:
        return name
    return middleware_name(hook)
