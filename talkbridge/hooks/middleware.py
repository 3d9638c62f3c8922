"""Turn middleware: an onion around the agent call, built once with `compose`.

A middleware may rewrite `ctx.input.prompt` then `await next()`, post-process after `next()`, or
never call `next()` and drive the turn itself with `ctx.emit(...)` (ending with a `Result` or
`Error`). Lowest `order` is outermost; ties keep registration order; the agent call is innermost.

Errors: `fail-open` skips a middleware that raised before calling `next()` (the rest of the onion
still runs, once) and only logs one that raised after; `fail-closed` ends the turn with an `Error`
event naming the middleware. An exception coming *out of* `next()` belongs to the inner layers and
passes through unchanged. There is no per-middleware timeout: the layers wrap the agent's whole
turn.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Literal, Protocol, runtime_checkable

from talkbridge.agents.base import Error, TurnContext
from talkbridge.cancellation import cancelling
from talkbridge.hooks.calls import (
    check_async,
    describe_hook_error,
    hook_code,
    log_failure,
    message_ref,
)
from talkbridge.hooks.engine import ON_ERROR_VALUES, OnError
from talkbridge.hooks.steps import run_hook, say_held

log = logging.getLogger("talkbridge.hooks")

Next = Callable[[], Awaitable[None]]
TurnHandler = Callable[[TurnContext], Awaitable[None]]
Environment = Literal["production", "development"]


@runtime_checkable
class TurnMiddleware(Protocol):
    order: int
    """Lowest runs furthest out."""
    on_error: OnError

    async def handle(self, ctx: TurnContext, next: Next) -> None: ...


def middleware_name(mw: object) -> str:
    name = getattr(mw, "name", None)
    return name if isinstance(name, str) and name else type(mw).__name__


class _Next:
    """The `next` handed to one layer for one turn: runs the inner layers at most once."""

    __slots__ = ("called", "ctx", "inner", "inner_error", "owner")

    def __init__(self, inner: TurnHandler, ctx: TurnContext, owner: str) -> None:
        self.inner = inner
        self.ctx = ctx
        self.owner = owner
        self.called = False
        self.inner_error: BaseException | None = None

    async def __call__(self) -> None:
        if self.called:
            raise RuntimeError(f"turn middleware {self.owner!r} called next() twice")
        self.called = True
        try:  # stepped, so that what runs inside is not counted as the middleware's own time
            await run_hook(self.inner, (self.ctx,), None, None)
        except BaseException as exc:
            self.inner_error = exc
            raise


async def _layer(
    mw: TurnMiddleware,
    name: str,
    on_error: OnError,
    environment: Environment,
    inner: TurnHandler,
    ctx: TurnContext,
) -> None:
    nxt = _Next(inner, ctx, name)

    def held(seconds: float) -> None:
        say_held(log, f"turn middleware {name!r}", message_ref(ctx.message), _code_of(mw), seconds)

    try:
        await run_hook(mw.handle, (ctx, nxt), None, held)
        if not nxt.called:  # it answered itself: the runner names it if it left no answer
            ctx.state["stopped_by"] = name
    except (Exception, asyncio.CancelledError) as exc:
        if exc is nxt.inner_error:
            raise  # an inner layer's (or the agent's) failure, not this middleware's
        if isinstance(exc, asyncio.CancelledError) and cancelling():
            raise  # the turn is being cancelled; a stray one is the middleware's failure
        when = "after calling next()" if nxt.called else "before calling next()"
        failed = "turn middleware %r failed on %s %s: %s raised %s; %s"
        where = (message_ref(ctx.message), when, hook_code(_code_of(mw)), describe_hook_error(exc))
        if on_error == "fail-closed":
            log_failure(log, logging.ERROR, failed, name, *where, "ending the turn", exc=exc)
            detail = f": {type(exc).__name__}: {exc}" if environment == "development" else ""
            await ctx.emit(
                Error(message=f"turn middleware {name!r} failed{detail}", code="middleware_error")
            )
            return
        action = "ignored (fail-open)" if nxt.called else "skipped (fail-open)"
        log_failure(log, logging.WARNING, failed, name, *where, action, exc=exc)
        if not nxt.called:
            await inner(ctx)


def _code_of(mw: TurnMiddleware) -> object:
    """The user's own code behind a middleware, for a log line (not the adapter's)."""
    if isinstance(mw, FunctionMiddleware):
        return mw.fn
    if isinstance(mw, ConfiguredMiddleware):
        return mw.inner.handle
    return mw.handle


def compose(
    middlewares: Sequence[TurnMiddleware],
    innermost: TurnHandler,
    *,
    environment: Environment = "production",
) -> TurnHandler:
    """Build the onion once; call the result per turn. `innermost` calls the agent.

    In production the `Error` of a fail-closed middleware names it but not the exception's text.
    """
    for mw in middlewares:
        what = f"turn middleware {middleware_name(mw)!r}"
        check_async(mw.handle, what, "async def handle(self, ctx, next)")  # its result is awaited
        if getattr(mw, "on_error", "fail-open") not in ON_ERROR_VALUES:
            raise ValueError(
                f"turn middleware {middleware_name(mw)!r}: on_error must be 'fail-open' or "
                f"'fail-closed', got {mw.on_error!r}"
            )
    ordered = sorted(middlewares, key=lambda mw: int(getattr(mw, "order", 0)))  # stable: ties keep
    handler = innermost
    for mw in reversed(ordered):
        handler = functools.partial(
            _layer,
            mw,
            middleware_name(mw),
            getattr(mw, "on_error", "fail-open"),
            environment,
            handler,
        )
    return handler


class FunctionMiddleware:
    """Adapts `async def mw(ctx, next)` (decorator form) to the `TurnMiddleware` shape."""

    def __init__(
        self,
        fn: Callable[[TurnContext, Next], Awaitable[None]],
        *,
        name: str,
        order: int = 0,
        on_error: OnError = "fail-open",
    ) -> None:
        self.fn = fn
        self.name = name
        self.order = order
        self.on_error: OnError = on_error

    async def handle(self, ctx: TurnContext, next: Next) -> None:
        await self.fn(ctx, next)


class ConfiguredMiddleware:
    """An object middleware whose name/order/on_error were set at registration (hook.yaml)."""

    def __init__(self, inner: TurnMiddleware, *, name: str, order: int, on_error: OnError) -> None:
        self.inner = inner
        self.name = name
        self.order = order
        self.on_error: OnError = on_error

    async def handle(self, ctx: TurnContext, next: Next) -> None:
        await self.inner.handle(ctx, next)


class MiddlewareStack:
    """The registered turn middlewares, in registration order, frozen at start."""

    def __init__(self) -> None:
        self._items: list[TurnMiddleware] = []
        self._frozen = False

    def add(self, mw: TurnMiddleware) -> TurnMiddleware:
        if self._frozen:
            raise RuntimeError(
                f"cannot add turn middleware {middleware_name(mw)!r}: middlewares were frozen when "
                "the bridge started; register them before start"
            )
        if not callable(getattr(mw, "handle", None)):
            raise TypeError(f"turn middleware {middleware_name(mw)!r} has no handle(ctx, next)")
        name = middleware_name(mw)
        if name in self.names():
            raise ValueError(f"a turn middleware named {name!r} is already registered")
        self._items.append(mw)
        return mw

    def remove(self, name: str, *, missing_ok: bool = False) -> int:
        found = [mw for mw in self._items if middleware_name(mw) == name]
        if not found and not missing_ok:
            raise KeyError(f"no turn middleware named {name!r}")
        if found and self._frozen:
            raise RuntimeError(
                f"cannot remove turn middleware {name!r}: middlewares were frozen when the bridge "
                "started"
            )
        self._items = [mw for mw in self._items if middleware_name(mw) != name]
        return len(found)

    def names(self) -> list[str]:
        return [middleware_name(mw) for mw in self._items]

    def items(self) -> list[TurnMiddleware]:
        return list(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def freeze(self) -> None:
        self._frozen = True

    def compose(
        self, innermost: TurnHandler, *, environment: Environment = "production"
    ) -> TurnHandler:
        return compose(self._items, innermost, environment=environment)
