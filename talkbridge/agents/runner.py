"""AgentRunner: wraps each agent turn in its session, lifecycle events and middleware onion.

The order of one turn (outermost first):
  turn-started watchers -> before_run listeners -> chat hooks -> middleware onion -> agent
  -> reply hooks -> after_run listeners -> turn-finished watchers.
The onion is composed once per agent (middleware chains are frozen at start), not per turn.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import logging
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from talkbridge.agents.base import (
    Agent,
    Error,
    Result,
    TextDelta,
    ToolCall,
    ToolResult,
    TurnContext,
    TurnInput,
    TurnSession,
)
from talkbridge.cancellation import cancelling
from talkbridge.errors import TurnAbortedError
from talkbridge.ids import unique_id
from talkbridge.message import NormalizedMessage, utcnow
from talkbridge.store.base import HistoryEntry, Store

log = logging.getLogger("talkbridge.agents")

TurnStatus = Literal["completed", "interrupted", "stopped", "error"]

SORRY = "Sorry, something went wrong while answering."


EventSink = Callable[[TurnContext, Any], Awaitable[None]]
HistorySource = Callable[[NormalizedMessage, int], Awaitable[list[HistoryEntry]]]
"""`(message, limit)` -> the earlier messages of its thread an agent may see, oldest first."""


@dataclass(slots=True)
class TurnOutcome:
    session: TurnSession
    status: TurnStatus
    text: str
    """The final reply (a `Result`'s text, or the error text to show the user)."""
    events: list[Any] = field(default_factory=list)
    error: str | None = None
    context: TurnContext | None = None

    @property
    def ok(self) -> bool:
        return self.status in ("completed", "stopped")


class AgentRunner:
    def __init__(
        self,
        agents: Mapping[str, Agent],
        store: Store,
        hooks: Any = None,
        *,
        environment: Literal["production", "development"] = "production",
        redact: Callable[[str], str] | None = None,
        history: HistorySource | None = None,
    ) -> None:
        from talkbridge.hooks import HookRegistry

        self._agents = dict(agents)
        self._store = store
        self.hooks: HookRegistry = hooks if hooks is not None else HookRegistry()
        self._environment = environment
        self._redact = redact or str
        """Scrubs the config's secrets from a failed turn's error: development shows it to the
        user, and an error names what failed (a base URL, an exception's message)."""
        self._onions: dict[str, Callable[[TurnContext], Awaitable[None]]] = {}
        self._history: HistorySource = history or self._stored_history

    @property
    def agent_names(self) -> list[str]:
        return sorted(self._agents)

    def agent(self, name: str) -> Agent:
        try:
            return self._agents[name]
        except KeyError:
            known = ", ".join(sorted(self._agents))
            raise LookupError(f"unknown agent {name!r}; known agents: {known}") from None

    def add_agent(self, agent: Agent, name: str | None = None) -> None:
        self._agents[name or agent.name] = agent
        self._onions.pop(name or agent.name, None)

    def _onion(self, agent_name: str) -> Callable[[TurnContext], Awaitable[None]]:
        onion = self._onions.get(agent_name)
        if onion is None:
            agent = self.agent(agent_name)

            async def innermost(ctx: TurnContext) -> None:
                ctx.state["agent_ran"] = True
                stream = agent.stream(ctx)
                if not hasattr(stream, "__aiter__"):
                    await ctx.emit(Error(message=not_a_stream(agent_name, agent, stream)))
                    return
                calls: dict[str, ToolCall] = {}
                emit = ctx.emit
                try:
                    async for event in stream:
                        kind = type(event)
                        if kind not in _EVENT_TYPES and not isinstance(event, _EVENTS):
                            _ignore(ctx, agent_name, event)
                            continue
                        if kind is ToolCall:
                            # The agent is suspended at this yield: a refusal here means the tool
                            # never runs (the generator is closed, not resumed).
                            await self._before_tool(ctx, event)
                            calls[event.call_id] = event
                        await emit(event)
                        if kind is ToolResult and event.call_id in calls:
                            await self.hooks.listeners.after_tool_call(
                                ctx, calls.pop(event.call_id), event
                            )
                        elif kind is Result or kind is Error:
                            break
                finally:
                    aclose = getattr(stream, "aclose", None)
                    if aclose is not None:  # close now rather than in the GC's finalizer task
                        await aclose()

            onion = self.hooks.compose_turn(_timed(innermost, agent_name, agent))
            self._onions[agent_name] = onion
        return onion

    async def run_turn(
        self,
        message: NormalizedMessage,
        agent_name: str,
        *,
        prompt: str | None = None,
        on_event: EventSink | None = None,
    ) -> TurnOutcome:
        agent = self.agent(agent_name)
        session = TurnSession(
            session_id=message.thread_key,
            turn_id=unique_id(),
            agent_name=agent.name if agent_name == agent.name else agent_name,
            connection_id=message.connection_id,
            thread_id=message.thread_id,
            channel=message.channel,
        )

        async def load_history(limit: int) -> list[HistoryEntry]:
            return await self._history(message, limit)

        events: list[Any] = []
        emit = _Emitter(events, on_event)
        ctx = TurnContext(
            session=session,
            input=TurnInput(
                prompt=message.text if prompt is None else prompt,
                attachments=list(message.attachments),
            ),
            message=message,
            emit=emit,
            started_at=utcnow(),
            load_history=load_history,
            events=events,
        )
        emit.context = weakref.ref(ctx)
        hooks = self.hooks
        listeners, chat = hooks.listeners, hooks.chat
        hooks.lifecycle.started(ctx)
        status: TurnStatus
        error: str | None = None
        try:
            # Each step is skipped outright when nobody registered for it: most turns have none.
            if listeners.has_listeners("before_run"):
                await listeners.before_run(ctx, environment=self._environment)
            if chat.has_chat_hooks():
                await chat.run_chat_hooks(ctx, await _chat_seed(agent, ctx))
            await self._onion(agent_name)(ctx)
            final = ctx.final
            if final is None:
                why = "the turn ended without a result"
                stopped_by = ctx.state.get("stopped_by")
                if stopped_by is not None:
                    why += (
                        f": turn middleware {stopped_by!r} called neither next() nor "
                        "ctx.emit(Result(...))"
                    )
                ignored = ctx.state.get("ignored_events")
                if ignored:
                    why += (
                        f" (it yielded {_count_of(ignored)} that no agent event is, such as "
                        f"{ignored[0]}: yield TextDelta(...) and a final Result(...))"
                    )
                final = Error(message=why, code="no_result")
                await emit(final)
            if isinstance(final, Error):
                status, error = "error", final.message
            else:
                status = "completed" if ctx.state.get("agent_ran") else "stopped"
                reply = None
                if chat.has_reply_hooks():
                    reply = await chat.run_reply_hooks(ctx, final.text)
                if reply is not None and reply != final.text:
                    final = Result(text=reply, usage=final.usage)
                    await emit(final)
        except TurnAbortedError as exc:
            status, error = "error", str(exc)
            await emit(Error(message=str(exc), code="refused"))
        except (Exception, asyncio.CancelledError) as exc:
            if isinstance(exc, asyncio.CancelledError) and cancelling():
                status, error = "interrupted", _why_interrupted(exc)
                try:  # each listener bounded by its timeout, as always
                    if listeners.has_listeners("after_run"):
                        await listeners.after_run(ctx, status=status)
                finally:
                    hooks.lifecycle.finished(ctx, status, error=error)
                raise
            # A stray CancelledError (the agent awaited a task something else cancelled) fails
            # the turn like any error: re-raised, it would stall the conversation for good.
            status = "error"
            error = self._sanitize(exc)
            log.exception("turn %s of %s failed", session.turn_id, agent_name)
            await hooks.listeners.on_error(ctx, "turn", exc)
            await emit(Error(message=error, code="internal_error"))
        final_event = ctx.final
        if error is not None:
            error = self._redact(error)
        if isinstance(final_event, Result):
            text = final_event.text
        else:
            text = self._redact(self._shown_error(final_event, error))
            log.warning("turn %s of %s ended in error: %s", session.turn_id, agent_name, error)
        if listeners.has_listeners("after_run"):
            await listeners.after_run(ctx, status=status, text=text)
        hooks.lifecycle.finished(ctx, status, error=error)
        return TurnOutcome(session, status, text, events, error, ctx)

    async def _stored_history(self, message: NormalizedMessage, limit: int) -> list[HistoryEntry]:
        return await earlier_entries(self._store, message, limit)

    async def _before_tool(self, ctx: TurnContext, call: ToolCall) -> None:
        """Per-user tool permissions: a `before_tool_call` listener that raises denies the call."""
        await self.hooks.listeners.before_tool_call(ctx, call, environment=self._environment)

    def _shown_error(self, event: Error | None, detail: str | None) -> str:
        """What the user reads when a turn fails: the detail in development; in production only
        a refusal's own (already sanitized) words, else a generic apology — the operator's log
        has the detail."""
        if self._environment == "development" or (event is not None and event.code == "refused"):
            return detail or (event.message if event else "")
        return SORRY

    def _sanitize(self, exc: BaseException) -> str:
        if self._environment == "development":
            return f"{type(exc).__name__}: {exc}"
        return SORRY


class _Emitter:
    """`ctx.emit` of one turn: records the event and hands it to `on_event`.

    It holds the turn's context weakly: a closure over the context (which holds the closure)
    made a reference cycle per turn, so every turn's objects (~20 of them) waited for the cycle
    collector instead of going as soon as nobody needed the turn.
    """

    __slots__ = ("_events", "_on_event", "context")

    def __init__(self, events: list[Any], on_event: EventSink | None) -> None:
        self._events = events
        self._on_event = on_event
        self.context: weakref.ref[TurnContext] | None = None

    async def __call__(self, event: Any) -> None:
        self._events.append(event)
        on_event = self._on_event
        if on_event is not None and self.context is not None:
            ctx = self.context()
            if ctx is not None:  # (gone only if emitted to after the turn, and nobody holds it)
                await on_event(ctx, event)


async def _chat_seed(agent: Agent, ctx: TurnContext) -> list[Any] | None:
    """The message list chat hooks are handed: what the agent would send its model, when it
    can say (`ChatMessages`); else None (the prompt alone). Handed less, a hook that only
    redacts would make such an agent send neither its system prompt nor the history."""
    messages = getattr(agent, "messages", None)
    if not inspect.iscoroutinefunction(messages):
        return None
    return list(await messages(ctx))


_LOOKAHEAD = 32
"""Entries read beyond `limit` at first: room for the messages that came in after the one
answered (they are skipped), so one read usually does."""
_PAGE = 256
_MAX_SCAN = 10_000
"""How far back the answered message is looked for (about `router.max_pending_messages`)."""


async def earlier_entries(
    store: Store, message: NormalizedMessage, limit: int
) -> list[HistoryEntry]:
    """The latest `limit` entries of `message`'s thread from before it: what its turn may call
    the conversation so far (`ctx.history`).

    Not `message` itself (it is the prompt), nor the messages that came in after it and wait
    behind it: a thread is answered in order, so those are still to come, and an agent given
    them would answer a question as if it had been asked after them. Replies recorded after
    `message` came are kept: they were sent before its turn began. A message that is not in
    the history (never recorded) leaves the latest entries, as they are. Messages deleted on
    their platform, and our replies taken back with them (`HistoryEntry.deleted`), are not
    given: the user asked the bot to forget them. An edited message is given once, as it now
    reads, in its place (`_as_now`); the turn answering an edit is given neither the message
    it edits nor the answer it replaces."""
    if limit <= 0:
        return []
    key = message.thread_key
    entries = list(await store.history(key, limit=limit + _LOOKAHEAD))
    more = len(entries) == limit + _LOOKAHEAD
    at = _position(entries, message.id)
    while at is None and more and len(entries) < _MAX_SCAN:
        older = list(await store.history(key, limit=_PAGE, before_seq=entries[0].seq))
        more = len(older) == _PAGE
        entries = older + entries
        at = _position(entries, message.id)
    replaced: tuple[str, ...] = ()
    if message.edit_of is not None:  # re-asked: the old words and their answer are gone
        answer = await store.lookup_id(message.connection_id, message.edit_of)
        replaced = (message.edit_of,) if answer is None else (message.edit_of, answer)
    if at is None:
        return _as_now([e for e in entries if not e.deleted], replaced)[-limit:]
    kept = [e for e in entries[:at] if not e.deleted]
    kept += [e for e in entries[at + 1 :] if e.role != "user" and not e.deleted]
    missing = limit - len(kept)
    if missing > 0 and more:  # later messages took the room of earlier ones in the read
        earlier = await store.history(key, limit=missing, before_seq=entries[0].seq)
        kept = [*(e for e in earlier if not e.deleted), *kept]
    return _as_now(kept, replaced)[-limit:]


def _as_now(entries: list[HistoryEntry], replaced: tuple[str, ...]) -> list[HistoryEntry]:
    """`entries` with each edited message once, as its latest edit among them says, in the
    original's place (an agent reading the old words, then the new ones, took them for two
    questions); without the entries of `replaced` (a message re-asked by an edit, with its
    edits, and the answer to it)."""
    latest: dict[str, HistoryEntry] = {}
    for entry in entries:
        if entry.role == "user" and isinstance(original := entry.data.get("edit_of"), str):
            latest[original] = entry
    if not latest and not replaced:
        return entries  # most threads: nothing edited
    originals = {e.message_id for e in entries if e.role == "user" and e.message_id in latest}
    now: list[HistoryEntry] = []
    for entry in entries:
        original = entry.data.get("edit_of") if entry.role == "user" else None
        if entry.message_id in replaced or original in replaced:
            continue
        if isinstance(original, str):  # an edit: shown in the original's place, else once
            if original not in originals and latest[original] is entry:
                now.append(entry)
        elif entry.message_id in originals:
            now.append(dataclasses.replace(entry, text=latest[entry.message_id].text))
        else:
            now.append(entry)
    return now


def _position(entries: list[HistoryEntry], message_id: str) -> int | None:
    """Where the inbound entry `message_id` is, searching from the newest."""
    for index in range(len(entries) - 1, -1, -1):
        entry = entries[index]
        if entry.message_id == message_id and entry.role == "user":
            return index
    return None


_EVENTS = (TextDelta, ToolCall, ToolResult, Result, Error)
_EVENT_TYPES = frozenset(_EVENTS)


def not_a_stream(agent_name: str, agent: Any, returned: Any) -> str:
    """Why an agent whose `stream(ctx)` gave no async iterator (a plain `def` returning a
    list, a generator without `async`) cannot answer, in words that say what to write.
    A coroutine it returned is closed, so Python does not warn it was never awaited."""
    if inspect.iscoroutine(returned):
        returned.close()
    what = (
        "a generator (a `def` that yields: it needs `async def`)"
        if inspect.isgenerator(returned)
        else f"a {type(returned).__name__}"
    )
    kind = type(agent)
    return (
        f"agent {agent_name!r} ({kind.__module__}.{kind.__qualname__}): stream(ctx) returned "
        f"{what}, not an async iterator: write it as `async def stream(self, ctx)` that "
        "yields TextDelta(...) and a final Result(...)"
    )


_BUILT_IN = f"{__package__}."
"""The built-in agents' modules (`talkbridge.agents.`)."""


def _timed(
    innermost: Callable[[TurnContext], Coroutine[Any, Any, None]], agent_name: str, agent: Agent
) -> Callable[[TurnContext], Awaitable[None]]:
    """`innermost` with each of its steps timed, as a hook's are: an agent whose `stream`
    blocks the loop (`time.sleep`, `requests`) stalls every conversation just the same, and
    the log names it. The steps are those of the whole call, not one per delta; the hooks it
    runs (tool listeners, timed themselves) are not counted as the agent's. The built-in
    agents (echo, sentinel, openai) await all they wait for: they are not timed, and their
    turns cost nothing more."""
    if type(agent).__module__.startswith(_BUILT_IN):
        return innermost
    from talkbridge.hooks import steps
    from talkbridge.hooks.calls import message_ref

    what = f"agent {agent_name!r}"

    def held(ctx: TurnContext, seconds: float) -> None:
        on = f"{message_ref(ctx.message)} (turn {ctx.session.turn_id})"
        steps.say_held(log, what, on, agent.stream, seconds)

    async def timed(ctx: TurnContext) -> None:
        began = steps.begin()
        coro = innermost(ctx)
        try:
            first = coro.send(None)
        except StopIteration:
            return
        finally:
            if (took := steps.end(began)) > steps.BLOCKING_WARNING:
                held(ctx, took)
        await steps.resume(coro, first, functools.partial(held, ctx))

    return timed


def _ignore(ctx: TurnContext, agent_name: str, event: Any) -> None:
    """An agent yielded something that is no `AgentMessage` (a plain string, a dict): it is
    skipped, and named once per turn in the log (and in the error if no `Result` follows)."""
    ignored: list[str] = ctx.state.setdefault("ignored_events", [])
    what = type(event).__name__
    ignored.append(what)
    if len(ignored) == 1:
        log.warning(
            "turn %s of %s: the agent yielded a %s, which is no agent event (TextDelta, "
            "ToolCall, ToolResult, Result, Error): ignored",
            ctx.session.turn_id,
            agent_name,
            what,
        )


def _why_interrupted(exc: asyncio.CancelledError) -> str:
    """The reason whoever cancelled the turn gave (`task.cancel(msg)`), if it gave one."""
    reason = exc.args[0] if exc.args else None
    return reason if isinstance(reason, str) and reason else "the turn was interrupted"


def _count_of(ignored: list[str]) -> str:
    return "1 thing" if len(ignored) == 1 else f"{len(ignored)} things"


def tool_call_count(events: list[Any]) -> int:
    return sum(1 for e in events if isinstance(e, ToolCall))


def streamed_text(events: list[Any]) -> str:
    return "".join(e.text for e in events if isinstance(e, TextDelta))
