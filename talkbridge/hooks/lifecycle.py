"""Turn lifecycle watchers: `agent-turn-started` / `agent-turn-finished`, fire and forget.

Watchers get a versioned, serializable event and cannot change the turn; a slow or raising watcher
never delays or breaks it. Each watcher gets one conversation's events in order (`WatcherLine`).
Background tasks are kept until done; `drain()` waits for them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from talkbridge.agents.base import Error, Result, ToolCall, ToolResult, TurnContext
from talkbridge.cancellation import drain_tasks
from talkbridge.hooks.calls import describe_hook_error, hook_code, log_failure
from talkbridge.hooks.engine import DEFAULT_TIMEOUT
from talkbridge.hooks.steps import HookTimeoutError, run_hook, say_held
from talkbridge.hooks.watcher_line import MAX_BEHIND, WatcherLine
from talkbridge.message import utcnow

log = logging.getLogger("talkbridge.hooks")

TURN_STARTED: Final = "agent-turn-started"
TURN_FINISHED: Final = "agent-turn-finished"
LifecycleKind = Literal["agent-turn-started", "agent-turn-finished"]
TurnStatus = Literal["completed", "interrupted", "stopped", "error"]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ThreadContext(_Model):
    connection_id: str
    thread_id: str
    channel: str
    thread_type: Literal["private", "group"] = "private"
    thread_name: str | None = None


class TurnRef(_Model):
    session_id: str
    turn_id: str
    agent_name: str
    thread: ThreadContext


class StartedTiming(_Model):
    started_at: datetime


class FinishedTiming(_Model):
    started_at: datetime
    finished_at: datetime
    duration_ms: float = Field(ge=0)


class TurnInputSummary(_Model):
    prompt_length: int = Field(ge=0)
    attachments_count: int = Field(ge=0)


class TurnOutput(_Model):
    text: str = ""
    terminal_kind: Literal["result", "error"] | None = None
    """Which terminal event ended the turn; None when it ended without one."""
    accounting: dict[str, int] = Field(default_factory=dict)
    """Usage the agent reported with its `Result` (tokens, …)."""
    error: str | None = None


class TurnMetrics(_Model):
    tool_call_count: int = Field(default=0, ge=0)
    tool_error_count: int = Field(default=0, ge=0)
    event_count: int = Field(default=0, ge=0)


def _turn_ref(ctx: TurnContext) -> TurnRef:
    s = ctx.session
    return TurnRef(
        session_id=s.session_id,
        turn_id=s.turn_id,
        agent_name=s.agent_name,
        thread=ThreadContext(
            connection_id=s.connection_id,
            thread_id=s.thread_id,
            channel=s.channel,
            thread_type=ctx.message.thread_type,
            thread_name=ctx.message.thread_name,
        ),
    )


def _input(ctx: TurnContext) -> TurnInputSummary:
    return TurnInputSummary(
        prompt_length=len(ctx.input.prompt), attachments_count=len(ctx.input.attachments)
    )


class TurnStartedEvent(_Model):
    type: Literal["agent-turn-started"] = TURN_STARTED
    version: Literal[1] = 1
    turn: TurnRef
    timing: StartedTiming
    input: TurnInputSummary

    @classmethod
    def from_context(cls, ctx: TurnContext) -> TurnStartedEvent:
        return cls(
            turn=_turn_ref(ctx), timing=StartedTiming(started_at=ctx.started_at), input=_input(ctx)
        )


class TurnFinishedEvent(_Model):
    type: Literal["agent-turn-finished"] = TURN_FINISHED
    version: Literal[1] = 1
    turn: TurnRef
    input: TurnInputSummary
    status: TurnStatus
    timing: FinishedTiming
    output: TurnOutput
    metrics: TurnMetrics

    @classmethod
    def from_context(
        cls,
        ctx: TurnContext,
        status: TurnStatus,
        *,
        error: str | None = None,
        finished_at: datetime | None = None,
    ) -> TurnFinishedEvent:
        """Summarize a finished turn from `ctx.events` (the events it emitted).

        `error` is the (already sanitized) reason when the turn failed without an `Error` event.
        """
        finished = finished_at or utcnow()
        final = ctx.final
        if isinstance(final, Result):
            output = TurnOutput(
                text=final.text, terminal_kind="result", accounting=dict(final.usage)
            )
        elif isinstance(final, Error):
            output = TurnOutput(terminal_kind="error", error=final.message)
        else:
            output = TurnOutput()
        if error is not None and output.error is None:
            output = output.model_copy(update={"error": error})
        return cls(
            turn=_turn_ref(ctx),
            input=_input(ctx),
            status=status,
            timing=FinishedTiming(
                started_at=ctx.started_at,
                finished_at=finished,
                duration_ms=max(0.0, (finished - ctx.started_at).total_seconds() * 1000),
            ),
            output=output,
            metrics=TurnMetrics(
                tool_call_count=sum(isinstance(e, ToolCall) for e in ctx.events),
                tool_error_count=sum(isinstance(e, ToolResult) and e.is_error for e in ctx.events),
                event_count=len(ctx.events),
            ),
        )


Watcher = Callable[[Any], Any]


class LifecycleWatchers:
    """Watchers of turn start/finish, run in background tasks: one watcher's events of one
    conversation one after the other, in order (a name added for both kinds shares the line)."""

    def __init__(
        self, *, timeout: float | None = DEFAULT_TIMEOUT, max_behind: int = MAX_BEHIND
    ) -> None:
        self._watchers: dict[str, dict[str, Watcher]] = {TURN_STARTED: {}, TURN_FINISHED: {}}
        self._timeout = timeout
        self._max_behind = max_behind
        self._frozen = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._lines: dict[str, WatcherLine] = {}

    def add(self, kind: LifecycleKind, fn: Watcher, *, name: str) -> None:
        """Add a watcher called as `fn(event)` (sync or async)."""
        if kind not in self._watchers:
            raise ValueError(
                f"unknown lifecycle event {kind!r}; use {TURN_STARTED!r} or {TURN_FINISHED!r}"
            )
        if not callable(fn):
            raise TypeError(f"{kind} watcher {name!r} is not callable")
        if self._frozen:
            raise RuntimeError(
                f"cannot add {kind} watcher {name!r}: hooks were frozen when the bridge started"
            )
        if name in self._watchers[kind]:
            raise ValueError(f"a {kind} watcher named {name!r} is already registered")
        self._watchers[kind][name] = fn
        if name not in self._lines:
            self._lines[name] = WatcherLine(
                name, self._call, self._tasks, max_behind=self._max_behind
            )
        self._lines[name].paired = all(name in w for w in self._watchers.values())

    def remove(self, name: str, *, missing_ok: bool = False) -> int:
        found = [kind for kind, watchers in self._watchers.items() if name in watchers]
        if not found and not missing_ok:
            raise KeyError(f"no lifecycle watcher named {name!r}")
        if found and self._frozen:
            raise RuntimeError(
                f"cannot remove watcher {name!r}: hooks were frozen when the bridge started"
            )
        for kind in found:
            del self._watchers[kind][name]
        self._lines.pop(name, None)  # events already queued are still delivered
        return len(found)

    def names(self) -> list[str]:
        return [name for watchers in self._watchers.values() for name in watchers]

    def freeze(self) -> None:
        self._frozen = True

    def has_listeners(self, kind: LifecycleKind) -> bool:
        return bool(self._watchers[kind])

    def started(self, ctx: TurnContext) -> None:
        """Announce a turn's start; builds the event only when someone watches."""
        if self._watchers[TURN_STARTED]:
            self._dispatch(TURN_STARTED, TurnStartedEvent.from_context(ctx))

    def finished(self, ctx: TurnContext, status: TurnStatus, *, error: str | None = None) -> None:
        """Announce a turn's end; builds the event only when someone watches."""
        if self._watchers[TURN_FINISHED]:
            self._dispatch(TURN_FINISHED, TurnFinishedEvent.from_context(ctx, status, error=error))

    def turn_started(self, event: TurnStartedEvent) -> None:
        self._dispatch(TURN_STARTED, event)

    def turn_finished(self, event: TurnFinishedEvent) -> None:
        self._dispatch(TURN_FINISHED, event)

    def _dispatch(self, kind: str, event: TurnStartedEvent | TurnFinishedEvent) -> None:
        turn = event.turn
        key = f"{turn.session_id}\x1f{turn.turn_id}"
        for name, fn in self._watchers[kind].items():
            self._lines[name].put(turn.session_id, kind, fn, event, key)

    def health(self) -> dict[str, dict[str, int]]:
        """Each watcher's events waiting (`behind`) and dropped since the start, for /healthz."""
        return {
            name: {"behind": line.behind, "dropped": line.dropped_total}
            for name, line in self._lines.items()
        }

    async def _call(self, kind: str, name: str, fn: Watcher, event: Any) -> None:
        turn = event.turn
        on = f"turn {turn.turn_id} of {turn.thread.connection_id}/{turn.thread.thread_id}"

        def held(seconds: float) -> None:
            say_held(log, f"{kind} watcher {name!r}", on, fn, seconds)

        try:
            await run_hook(fn, (event,), self._timeout, held)
        except Exception as exc:
            message = "%s watcher %r failed on %s: %s %s"
            if isinstance(exc, HookTimeoutError):
                log.warning(message, kind, name, on, hook_code(fn), exc)
                return
            error = f"raised {describe_hook_error(exc)}"
            log_failure(
                log, logging.WARNING, message, kind, name, on, hook_code(fn), error, exc=exc
            )

    def running(self) -> set[asyncio.Task[None]]:
        """The watchers' calls still under way."""
        return {task for task in self._tasks if not task.done()}

    async def drain(self) -> None:
        """Wait for every watcher already started."""
        await drain_tasks(self._tasks)

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.drain()
