"""Run and tool listeners: side effects around a run that observe but cannot change it.

A listener raising in a `before_*` event aborts the action before any upstream call with
`ListenerRefusedError` (a `TurnAbortedError`): "the request was refused" in production, the
listener's detail in development. Every other event only logs a listener's failure.
`before_tool_call` is where per-user tool permissions are enforced.

Listeners run in registration order and are awaited (so a `before_*` verdict is known before the
action); each has a timeout, and a timed-out `before_*` listener aborts like a raising one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Literal

from talkbridge.agents.base import Error, Result, ToolCall, ToolResult, TurnContext
from talkbridge.errors import TurnAbortedError
from talkbridge.hooks.calls import (
    check_call,
    describe_hook_error,
    failed_at,
    hook_code,
    log_failure,
    message_ref,
)
from talkbridge.hooks.engine import DEFAULT_TIMEOUT
from talkbridge.hooks.steps import run_hook, say_held
from talkbridge.message import Attachment

log = logging.getLogger("talkbridge.hooks")

ListenerEvent = Literal[
    "before_run",
    "after_run",
    "on_error",
    "before_tool_call",
    "after_tool_call",
    "on_file_upload",
    "on_thread_create",
    "on_memory_write",
]
LISTENER_EVENTS: Final[tuple[str, ...]] = ListenerEvent.__args__  # type: ignore[attr-defined]
ABORTING_EVENTS: Final = frozenset({"before_run", "before_tool_call"})
ARGUMENTS: Final[dict[str, tuple[str, ...]]] = {
    "before_run": ("ctx",),
    "after_run": ("ctx", "result"),
    "on_error": ("ctx", "phase", "error"),
    "before_tool_call": ("ctx", "call"),
    "after_tool_call": ("ctx", "call", "result"),
    "on_file_upload": ("upload",),
    "on_thread_create": ("thread",),
    "on_memory_write": ("write",),
}
"""What each event's listener is called with."""
REFUSED: Final = "the request was refused"
Environment = Literal["production", "development"]


@dataclass(frozen=True, slots=True)
class RunResult:
    """What `after_run` listeners see; an in-band `Error` event sets `errored`, not `on_error`."""

    text: str
    event_count: int
    interrupted: bool = False
    errored: bool = False


@dataclass(frozen=True, slots=True)
class FileUpload:
    connection_id: str
    thread_id: str
    attachment: Attachment


@dataclass(frozen=True, slots=True)
class ThreadCreated:
    connection_id: str
    thread_id: str
    channel: str
    implicit: bool = False
    """True when the thread came into being with its first message rather than explicitly."""


@dataclass(frozen=True, slots=True)
class MemoryWrite:
    session_id: str
    key: str
    value: Any = None


class ListenerRefusedError(TurnAbortedError):
    """A `before_*` listener refused; `listener`/`event` are for logs, not for users."""

    def __init__(self, message: str, *, listener: str, event: str) -> None:
        super().__init__(message)
        self.listener = listener
        self.event = event


class RunListeners:
    """Listeners by event. An object listener contributes each method named like an event."""

    def __init__(
        self,
        *,
        environment: Environment = "production",
        timeout: float | None = DEFAULT_TIMEOUT,
    ) -> None:
        self.environment = environment
        self._timeout = timeout
        self._by_event: dict[str, dict[str, Callable[..., Any]]] = {e: {} for e in LISTENER_EVENTS}
        self._frozen = False

    def add(self, listener: Any, *, name: str, event: str | None = None) -> list[str]:
        """Add `listener` for `event`, or, with no event, each of its methods named like an event.

        Returns the events it was registered for.
        """
        if self._frozen:
            raise RuntimeError(
                f"cannot add run listener {name!r}: hooks were frozen when the bridge started"
            )
        if any(name in by_name for by_name in self._by_event.values()):
            raise ValueError(f"a run listener named {name!r} is already registered")
        if event is not None:
            if event not in self._by_event:
                raise ValueError(
                    f"run listener {name!r}: unknown event {event!r}; events: "
                    + ", ".join(LISTENER_EVENTS)
                )
            if not callable(listener):
                raise TypeError(f"run listener {name!r} is not callable")
            found = {event: listener}
        else:
            found = {
                e: getattr(listener, e)
                for e in LISTENER_EVENTS
                if callable(getattr(listener, e, None))
            }
            if not found:
                raise TypeError(
                    f"run listener {name!r} defines none of the listener methods: "
                    + ", ".join(LISTENER_EVENTS)
                )
        for ev, fn in found.items():
            check_call(fn, ARGUMENTS[ev], f"run listener {name!r} ({ev})")
        for ev, fn in found.items():
            self._by_event[ev][name] = fn
        return list(found)

    def remove(self, name: str, *, missing_ok: bool = False) -> int:
        found = [by_name for by_name in self._by_event.values() if name in by_name]
        if not found and not missing_ok:
            raise KeyError(f"no run listener named {name!r}")
        if found and self._frozen:
            raise RuntimeError(
                f"cannot remove run listener {name!r}: hooks were frozen when the bridge started"
            )
        for by_name in found:
            del by_name[name]
        return 1 if found else 0

    def names(self) -> list[str]:
        return list(dict.fromkeys(n for by_name in self._by_event.values() for n in by_name))

    def freeze(self) -> None:
        self._frozen = True

    def has_listeners(self, event: ListenerEvent) -> bool:
        return bool(self._by_event[event])

    # -- dispatch ---------------------------------------------------------------------------------

    async def _emit(self, event: str, *args: Any, environment: str | None = None) -> None:
        ctx = args[0] if args and isinstance(args[0], TurnContext) else None
        ref = message_ref(ctx.message) if ctx is not None else None
        on = f" on {ref}" if ref is not None else ""
        for name, fn in list(self._by_event[event].items()):

            def held(seconds: float, name: str = name, fn: Any = fn) -> None:
                say_held(log, f"run listener {name!r} ({event})", ref, fn, seconds)

            try:
                await run_hook(fn, args, self._timeout, held)
            except Exception as exc:
                if event in ABORTING_EVENTS:
                    # Raising is how a listener refuses: a verdict, not a crash (no traceback).
                    message = "run listener %r refused in %s%s: %s%s"
                    where = failed_at(exc)
                    log_failure(log, logging.WARNING, message, name, event, on, exc, where, exc=exc)
                    message = (
                        f"{REFUSED} by listener {name!r} ({event}): {exc}"
                        if (environment or self.environment) == "development"
                        else REFUSED
                    )
                    raise ListenerRefusedError(message, listener=name, event=event) from exc
                message = "run listener %r failed in %s%s: %s raised %s"
                error = describe_hook_error(exc)
                log_failure(
                    log, logging.WARNING, message, name, event, on, hook_code(fn), error, exc=exc
                )

    async def before_run(self, ctx: TurnContext, *, environment: Environment | None = None) -> None:
        """Raises `ListenerRefusedError`; `environment` overrides the registry's for this call."""
        if self._by_event["before_run"]:
            await self._emit("before_run", ctx, environment=environment)

    async def after_run(
        self,
        ctx: TurnContext,
        result: RunResult | None = None,
        *,
        status: str | None = None,
        text: str | None = None,
    ) -> None:
        """Pass a `RunResult`, or let it be built from `ctx.events`, `status` and `text`."""
        if not self._by_event["after_run"]:
            return
        if result is None:
            final = ctx.final
            result = RunResult(
                text=text
                if text is not None
                else (final.text if isinstance(final, Result) else ""),
                event_count=len(ctx.events),
                interrupted=status == "interrupted",
                errored=status == "error" or isinstance(final, Error),
            )
        await self._emit("after_run", ctx, result)

    async def on_error(self, ctx: TurnContext | None, phase: str, error: BaseException) -> None:
        """Only for a raised exception; an in-band `Error` event goes to `after_run`."""
        await self._emit("on_error", ctx, phase, error)

    async def before_tool_call(
        self, ctx: TurnContext, call: ToolCall, *, environment: Environment | None = None
    ) -> None:
        """Enforce tool permissions here; raises `ListenerRefusedError` to deny the call."""
        if self._by_event["before_tool_call"]:
            await self._emit("before_tool_call", ctx, call, environment=environment)

    async def after_tool_call(self, ctx: TurnContext, call: ToolCall, result: ToolResult) -> None:
        await self._emit("after_tool_call", ctx, call, result)

    async def on_file_upload(self, upload: FileUpload) -> None:
        await self._emit("on_file_upload", upload)

    async def on_thread_create(self, thread: ThreadCreated) -> None:
        await self._emit("on_thread_create", thread)

    async def on_memory_write(self, write: MemoryWrite) -> None:
        await self._emit("on_memory_write", write)
