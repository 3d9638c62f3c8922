"""Driving a hook's coroutine: its timeout, and each step timed, so a hook that blocks the loop
is named.

A hook runs on the bridge's event loop. While one of its steps (its code from one `await` to
the next) runs, no other conversation moves, and its own timeout cannot fire: `time.sleep`, or a
blocking HTTP or database call, stalls the whole bridge without a word. Every kind of hook is
called through `run_hook` (the channel-message chain steps its hooks itself, with the same
`begin`/`end` and `resume`), which times each step and calls `held(seconds)` for one longer than
`BLOCKING_WARNING`; `say_held` is the one log line.

Steps nest: a turn middleware's step runs what `next()` runs (inner layers, the agent) within
it. A step's time less the time of the steps timed inside it is its own: the inner ones are
told (or not) for themselves, and the middleware is not blamed for the agent.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import time
import types
from collections.abc import Awaitable, Callable, Coroutine, Generator
from typing import Any, Final

from talkbridge.hooks.calls import hook_code

BLOCKING_WARNING: Final = 1.0
"""Seconds a hook may run without awaiting before the log says it held up the event loop."""

Held = Callable[[float], None]
"""Called with the seconds a step of the hook's own code ran without awaiting."""

_monotonic: Final = time.monotonic
_CoroutineType: Final = types.CoroutineType
_NOT_STARTED: Final = object()


class HookTimeoutError(Exception):
    """Internal marker: the hook exceeded its own timeout (not a TimeoutError it raised itself)."""

    def __init__(self, timeout: float) -> None:
        super().__init__(f"timed out after {timeout:g} s")
        self.timeout = timeout


class _Steps(threading.local):
    """The steps under way in this thread, innermost last: each holds the time of the steps
    timed inside it. A step is a synchronous call, so they nest as a stack."""

    def __init__(self) -> None:
        self.inner: list[float] = []


_steps: Final = _Steps()


def begin() -> float:
    """Start timing a step; pair with `end` in a `finally`."""
    _steps.inner.append(0.0)
    return _monotonic()


def end(began: float) -> float:
    """End the step `begin` started: the seconds it ran, less those of the steps inside it."""
    took = _monotonic() - began
    stack = _steps.inner
    inner = stack.pop()
    if stack:
        stack[-1] += took
    return took - inner


def _told(held: Held | None, own: float) -> None:
    if held is not None and own > BLOCKING_WARNING:
        held(own)


@types.coroutine
def resume(
    coro: Coroutine[Any, Any, Any], first: Any, held: Held | None
) -> Generator[Any, Any, Any]:
    """Continue a coroutine already stepped once, passing every yield to the task, timing each
    step (`held` is told of a long one; None: only counted, as the inner part of a step).

    This is what `await coro` would have done had the first step not been taken by hand: the task
    sees the same futures, and cancellation (a timeout) is thrown into the hook.
    """
    yielded = first
    while True:
        try:
            sent = yield yielded
        except GeneratorExit:
            coro.close()
            raise
        except BaseException as exc:
            began = begin()
            try:
                yielded = coro.throw(exc)
            except StopIteration as stop:
                return stop.value
            finally:
                _told(held, end(began))
        else:
            began = begin()
            try:
                yielded = coro.send(sent)
            except StopIteration as stop:
                return stop.value
            finally:
                _told(held, end(began))


async def bounded(awaitable: Awaitable[Any], limit: float | None) -> Any:
    """`await awaitable` within `limit` seconds (None: no limit); `HookTimeoutError` past it."""
    if limit is None:
        return await awaitable
    cm = asyncio.timeout(limit)
    try:
        async with cm:
            return await awaitable
    except TimeoutError:
        if cm.expired():
            raise HookTimeoutError(limit) from None
        raise


async def settle(result: Any, limit: float | None) -> Any:
    """`result` itself, or what it resolves to when awaitable (within `limit` seconds)."""
    if inspect.isawaitable(result):
        return await bounded(result, limit)
    return result


async def run_hook(
    fn: Callable[..., Any], args: tuple[Any, ...], limit: float | None, held: Held | None
) -> Any:
    """`fn(*args)`, sync or async, awaited within `limit` seconds, every step of it timed."""
    began = begin()
    first = _NOT_STARTED
    try:
        result = fn(*args)
        if type(result) is _CoroutineType:
            try:
                first = result.send(None)
            except StopIteration as stop:
                result = stop.value
    finally:
        _told(held, end(began))
    if first is not _NOT_STARTED:
        return await bounded(resume(result, first, held), limit)
    return await settle(result, limit)


def say_held(logger: logging.Logger, what: str, on: str | None, fn: Any, held: float) -> None:
    """The line for a hook that blocked the loop: which (`what`: "channel-message hook 'x'"), on
    what it was working (when known), its code, how long, and what to use instead."""
    logger.warning(
        "%s held up every conversation%s: %s ran %.1f s without awaiting "
        "(time.sleep, or blocking I/O such as requests or a database driver?); use await "
        "asyncio.sleep, an async client, or await asyncio.to_thread(...)",
        what,
        f" on {on}" if on else "",
        hook_code(fn),
        held,
    )
