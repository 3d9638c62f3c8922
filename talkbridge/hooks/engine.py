"""The generic engine behind every synchronous hook kind: ordered allow/block/modify chains.

One `HookChain` holds the hooks of one kind. `run(event)` calls them lowest `order` first (ties in
registration order); a hook returns `Allow` (or None), `Block(reason)` or `Modify(new_event)`, or
one of the kind's own terminal results (the channel-message kind adds routing decisions). The chain
stops at the first block or terminal result; a modified event is what later hooks see.

Around that core: a per-hook timeout, `on_error` (fail-open skips a broken hook, fail-closed turns
its failure into a block), pure filters, hooks scoped to one thread or connection, observers that
see every outcome (blocked ones too) without being able to change it, an O(1) `has_listeners` and
lock-free read-only hooks that can be *prefetched* — started before the thread's turn comes — while
their decision still applies in chain order.

Speed: a hook that finishes without suspending costs a call and a coroutine step. The engine drives
the coroutine one step itself and only arms a timeout (`asyncio.timeout`) when the hook actually
suspends.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import itertools
import logging
import types
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Generic, Literal, NamedTuple, TypeVar

from pydantic import BaseModel, ConfigDict, field_validator

from talkbridge.cancellation import cancelling, drain_tasks
from talkbridge.hooks import steps
from talkbridge.hooks.calls import (
    check_call,
    describe_hook_error,
    hook_code,
    log_failure,
    message_ref,
)
from talkbridge.hooks.steps import (
    HookTimeoutError,
    begin,
    bounded,
    end,
    resume,
    run_hook,
    say_held,
)

E = TypeVar("E")

OnError = Literal["fail-open", "fail-closed"]
Direction = Literal["inbound", "outbound"]
ON_ERROR_VALUES: Final = ("fail-open", "fail-closed")
DEFAULT_TIMEOUT: Final = 30.0
_DONE: Final = object()
_CoroutineType: Final = types.CoroutineType

log = logging.getLogger("talkbridge.hooks")


# ---- results ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Allow:
    """Let the event continue unchanged; returning None means the same."""


ALLOW: Final = Allow()


@dataclass(frozen=True, slots=True)
class Block:
    """Stop the chain and refuse the event."""

    reason: str


@dataclass(frozen=True, slots=True)
class Modify(Generic[E]):
    """Continue the chain with `event` in place of the one received."""

    event: E


# ---- what a hook sees: filters and scopes ----------------------------------------------------


class EventAttrs(NamedTuple):
    """The fields filters and scopes read from an event, extracted once per event."""

    channel: str | None = None
    connection_id: str | None = None
    thread_id: str | None = None
    thread_key: str | None = None
    direction: str | None = None
    event_type: str | None = None


def describe_event(event: Any) -> EventAttrs:
    """Default extraction: read same-named attributes, derive `thread_key` when missing."""
    connection_id = getattr(event, "connection_id", None)
    thread_id = getattr(event, "thread_id", None)
    thread_key = getattr(event, "thread_key", None)
    if thread_key is None and connection_id is not None and thread_id is not None:
        thread_key = f"{connection_id}\x1f{thread_id}"
    return EventAttrs(
        channel=getattr(event, "channel", None),
        connection_id=connection_id,
        thread_id=thread_id,
        thread_key=thread_key,
        direction=getattr(event, "direction", None),
        event_type=getattr(event, "event_type", None),
    )


def _as_set(value: Any) -> Any:
    """One value or a list of them; numbers as text, since YAML reads a Telegram group's id
    (`-100123`) unquoted as a number, as `trusted` takes them."""
    if isinstance(value, str | int) and not isinstance(value, bool):
        value = [value]
    if isinstance(value, list | tuple | set | frozenset):
        return [str(v) if isinstance(v, int) and not isinstance(v, bool) else v for v in value]
    return value


class HookFilter(BaseModel):
    """Which events a hook sees; `None` means any. Pure and sync so it can be tested directly.

    A value set to an empty list is refused (it would match nothing; write null for "any").
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    channels: frozenset[str] | None = None
    connection_ids: frozenset[str] | None = None
    direction: Direction | None = None
    event_types: frozenset[str] | None = None
    thread_ids: frozenset[str] | None = None

    @field_validator("channels", "connection_ids", "event_types", "thread_ids", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        value = _as_set(value)
        if value is not None and len(value) == 0:
            raise ValueError("an empty list matches nothing; leave the key out to match any")
        return value

    def matches(self, event: Any) -> bool:
        """True when `event` (an `EventAttrs` or any object with those attributes) passes."""
        if self.channels is not None and getattr(event, "channel", None) not in self.channels:
            return False
        if (
            self.connection_ids is not None
            and getattr(event, "connection_id", None) not in self.connection_ids
        ):
            return False
        if self.direction is not None and getattr(event, "direction", None) != self.direction:
            return False
        if (
            self.event_types is not None
            and getattr(event, "event_type", None) not in self.event_types
        ):
            return False
        return self.thread_ids is None or getattr(event, "thread_id", None) in self.thread_ids


@dataclass(frozen=True, slots=True)
class Scope:
    """Where a hook applies: everywhere (`GLOBAL`), one thread (room) or one connection."""

    kind: Literal["global", "thread", "connection"]
    key: str | None = None

    @classmethod
    def thread(cls, thread_key: str) -> Scope:
        """Only events of this conversation (`NormalizedMessage.thread_key`)."""
        if not thread_key:
            raise ValueError("a thread scope needs a thread_key")
        return cls("thread", thread_key)

    @classmethod
    def connection(cls, connection_id: str) -> Scope:
        if not connection_id:
            raise ValueError("a connection scope needs a connection_id")
        return cls("connection", connection_id)

    def __str__(self) -> str:
        return self.kind if self.key is None else f"{self.kind} {self.key!r}"


GLOBAL: Final = Scope("global")


# ---- outcomes ---------------------------------------------------------------------------------


class HookFailure(NamedTuple):
    """A hook that raised, timed out or returned something unusable during one run."""

    hook: str
    kind: Literal["exception", "timeout", "unusable"]
    detail: str
    on_error: OnError
    error: BaseException | None = None


class ChainOutcome(NamedTuple, Generic[E]):
    """What a chain run decided. `decision` is None when every hook allowed (or was skipped)."""

    event: E
    """The event after every modification."""
    decision: Any = None
    """`Block`, or one of the kind's terminal results."""
    decided_by: str | None = None
    failures: tuple[HookFailure, ...] = ()
    modified_by: tuple[str, ...] = ()

    @property
    def blocked(self) -> bool:
        return isinstance(self.decision, Block)

    @property
    def allowed(self) -> bool:
        return self.decision is None


# ---- registrations ----------------------------------------------------------------------------


class Registration:
    """One hook in a chain. `remove()` or leaving a `with` block takes it out again."""

    __slots__ = (
        "_chain",
        "active",
        "filter",
        "fn",
        "lock_free",
        "name",
        "observer",
        "on_error",
        "order",
        "pass_second",
        "scope",
        "seq",
        "timeout",
    )

    def __init__(
        self,
        chain: HookChain[Any],
        fn: Callable[..., Any],
        *,
        name: str,
        order: int,
        seq: int,
        timeout: float | None,
        on_error: OnError,
        filter: HookFilter | None,
        scope: Scope,
        lock_free: bool,
        observer: bool,
        pass_second: bool,
    ) -> None:
        self._chain = chain
        self.fn = fn
        self.name = name
        self.order = order
        self.seq = seq
        self.timeout = timeout
        self.on_error = on_error
        self.filter = filter
        self.scope = scope
        self.lock_free = lock_free
        self.observer = observer
        self.pass_second = pass_second
        self.active = True

    def remove(self) -> None:
        """Take this hook out of its chain; a no-op when already removed."""
        if self.active:
            self._chain._remove(self)

    def __enter__(self) -> Registration:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def __repr__(self) -> str:
        return f"<hook {self.name!r} order={self.order} scope={self.scope}>"


def _sort_key(reg: Registration) -> tuple[int, int]:
    return (reg.order, reg.seq)


def _takes_two(fn: Callable[..., Any]) -> bool:
    """Whether `fn` accepts a second positional argument (ctx, or the outcome for observers)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params):
        return True
    positional = [
        p
        for p in params
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    return len(positional) >= 2  # none at all: `check_call` says what it is called with


# ---- calling a hook ----------------------------------------------------------------------------


class Prefetch:
    """Lock-free hooks already started for one event; hand it to `HookChain.run(prefetch=...)`."""

    __slots__ = ("_tasks", "event")

    def __init__(self, event: Any, tasks: dict[Registration, asyncio.Task[Any]]) -> None:
        self.event = event
        self._tasks = tasks

    def __len__(self) -> int:
        return len(self._tasks)

    def take(self, reg: Registration) -> asyncio.Task[Any] | None:
        return self._tasks.pop(reg, None)

    def cancel(self) -> None:
        """Cancel what the chain never reached (it blocked first, or the hook was removed)."""
        tasks, self._tasks = self._tasks, {}
        for task in tasks.values():
            if task.done():
                if not task.cancelled():
                    task.exception()  # mark retrieved: nobody needs this result any more
            else:
                task.cancel()


# result classification codes
_ALLOW, _BLOCK, _MODIFY, _TERMINAL, _UNUSABLE = range(5)


# ---- the chain --------------------------------------------------------------------------------


class HookChain(Generic[E]):
    """Ordered synchronous hooks plus observers for one hook kind.

    `terminal` lists a kind's own result types that end the chain as its decision; `allow` adds
    result types that mean "continue"; `modify` maps a kind's own modify types to a function that
    returns the new event; `event_type` (a class) is what a modified event must be an instance of;
    `describe` extracts the filter/scope attributes (default: `describe_event`).
    """

    def __init__(
        self,
        kind: str,
        *,
        terminal: Iterable[type] = (),
        allow: Iterable[type] = (),
        modify: Mapping[type, Callable[[Any], E]] | None = None,
        event_type: type | None = None,
        describe: Callable[[E], EventAttrs] = describe_event,
        logger: logging.Logger | None = None,
    ) -> None:
        self.kind = kind
        self._describe = describe
        self._event_type = event_type
        self._log = logger or log
        self._codes: dict[type, int] = {type(None): _ALLOW, Allow: _ALLOW, Block: _BLOCK}
        self._codes.update(dict.fromkeys(allow, _ALLOW))
        self._codes.update(dict.fromkeys(terminal, _TERMINAL))
        self._modifiers: dict[type, Callable[[Any], E]] = {Modify: _modify_event}
        self._modifiers.update(modify or {})
        self._codes.update(dict.fromkeys(self._modifiers, _MODIFY))
        self._known = tuple(self._codes.items())
        self._seq = itertools.count()
        self._frozen = False
        self._global: list[Registration] = []
        self._global_sync: tuple[Registration, ...] = ()
        self._global_obs: tuple[Registration, ...] = ()
        self._scoped: dict[Scope, list[Registration]] = {}
        self._scoped_count = 0
        self._merged: dict[tuple[str | None, str | None], tuple[tuple[Registration, ...], ...]] = {}
        self._by_key: dict[tuple[Scope, str], Registration] = {}
        self._total = 0
        self._lock_free_count = 0
        self._any_type = 0
        self._by_type: dict[str, int] = {}
        self._background: set[asyncio.Task[Any]] = set()

    # -- registration -------------------------------------------------------------------------

    def add(
        self,
        fn: Callable[..., Any],
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
        """Register a hook. It is called as `fn(event)` or, if it takes two arguments,
        `fn(event, ctx)`; an observer as `fn(event)` or `fn(event, outcome)`. Sync or async.

        `needs_thread_lock=False` marks a read-only hook that `prefetch` may start early; it must
        not return a modification. `timeout=None` disables the timeout. Names are unique per scope.
        """
        if not isinstance(name, str) or not name:
            raise ValueError("a hook needs a non-empty name")
        if not callable(fn):
            raise TypeError(f"hook {name!r}: {fn!r} is not callable")
        if on_error not in ON_ERROR_VALUES:
            raise ValueError(
                f"hook {name!r}: on_error must be 'fail-open' or 'fail-closed', got {on_error!r}"
            )
        if timeout is not None and not timeout > 0:
            raise ValueError(f"hook {name!r}: timeout must be a positive number of seconds")
        if not isinstance(scope, Scope):
            raise TypeError(
                f"hook {name!r}: scope must be GLOBAL, Scope.thread() or Scope.connection()"
            )
        if filter is not None and not isinstance(filter, HookFilter):
            raise TypeError(f"hook {name!r}: filter must be a HookFilter")
        if scope.kind == "global":
            self._check_not_frozen(f"add hook {name!r}")
        if (scope, name) in self._by_key:
            where = "" if scope.kind == "global" else f" in {scope}"
            raise ValueError(f"a {self.kind} hook named {name!r} is already registered{where}")
        reg = Registration(
            self,
            fn,
            name=name,
            order=int(order),
            seq=next(self._seq),
            timeout=timeout,
            on_error=on_error,
            filter=filter,
            scope=scope,
            lock_free=not needs_thread_lock,
            observer=observer,
            pass_second=self._check_call(fn, name, observer),
        )
        self._by_key[(scope, name)] = reg
        if scope.kind == "global":
            self._global.append(reg)
            self._global.sort(key=_sort_key)
            self._rebuild_global()
        else:
            self._scoped.setdefault(scope, []).append(reg)
            self._scoped_count += 1
            self._merged.clear()
        self._count(reg, +1)
        return reg

    def _check_call(self, fn: Callable[..., Any], name: str, observer: bool) -> bool:
        """Whether `fn` is passed a second argument; TypeError when it cannot take its calls."""
        pass_second = _takes_two(fn)
        first = "msg" if self.kind == "channel-message" else "event"
        args = (first, "outcome" if observer else "ctx") if pass_second else (first,)
        check_call(fn, args, f"{self.kind} hook {name!r}")
        return pass_second

    def remove(self, name: str, *, scope: Scope | None = None, missing_ok: bool = False) -> int:
        """Remove the hook(s) named `name`: in every scope, or only in `scope`. Returns how many."""
        regs = [
            reg
            for (reg_scope, reg_name), reg in self._by_key.items()
            if reg_name == name and (scope is None or reg_scope == scope)
        ]
        if not regs and not missing_ok:
            raise KeyError(
                f"no {self.kind} hook named {name!r}" + (f" in {scope}" if scope else "")
            )
        if any(reg.scope.kind == "global" for reg in regs):
            self._check_not_frozen(f"remove hook {name!r}")
        for reg in regs:
            self._remove(reg)
        return len(regs)

    def _remove(self, reg: Registration) -> None:
        if reg.scope.kind == "global":
            self._check_not_frozen(f"remove hook {reg.name!r}")
            self._global.remove(reg)
            self._rebuild_global()
        else:
            regs = self._scoped[reg.scope]
            regs.remove(reg)
            if not regs:
                del self._scoped[reg.scope]
            self._scoped_count -= 1
            self._merged.clear()
        del self._by_key[(reg.scope, reg.name)]
        reg.active = False
        self._count(reg, -1)

    def freeze(self) -> None:
        """Fix the global hooks (done at start); thread/connection scopes stay changeable."""
        self._frozen = True

    @property
    def frozen(self) -> bool:
        return self._frozen

    def _check_not_frozen(self, action: str) -> None:
        if self._frozen:
            raise RuntimeError(
                f"cannot {action}: the {self.kind} hooks were frozen when the bridge started; "
                "register global hooks before start, or use a thread/connection scope"
            )

    def _rebuild_global(self) -> None:
        self._global_sync = tuple(r for r in self._global if not r.observer)
        self._global_obs = tuple(r for r in self._global if r.observer)
        self._merged.clear()

    def _count(self, reg: Registration, delta: int) -> None:
        self._total += delta
        if reg.lock_free and not reg.observer:
            self._lock_free_count += delta
        types_ = reg.filter.event_types if reg.filter is not None else None
        if types_ is None:
            self._any_type += delta
            return
        for event_type in types_:
            left = self._by_type.get(event_type, 0) + delta
            if left:
                self._by_type[event_type] = left
            else:
                del self._by_type[event_type]

    def has_listeners(self, event_type: str | None = None) -> bool:
        """O(1): does any hook (sync or observer, any scope) listen for this event type at all?"""
        if event_type is None:
            return self._total > 0
        return self._any_type > 0 or event_type in self._by_type

    def names(self) -> list[str]:
        return [name for _scope, name in self._by_key]

    def code_of(self, name: str) -> str:
        """`handler (FILE line N)` of the hook named `name`, for a log line; "" for none."""
        for (_scope, reg_name), reg in self._by_key.items():
            if reg_name == name:
                return hook_code(reg.fn)
        return ""

    def __len__(self) -> int:
        return self._total

    def _hooks_for(self, event: E) -> tuple[tuple[Registration, ...], ...]:
        if not self._scoped_count:
            return (self._global_sync, self._global_obs)
        attrs = self._describe(event)
        key = (attrs.connection_id, attrs.thread_key)
        merged = self._merged.get(key)
        if merged is None:
            by_thread = self._scoped.get(Scope("thread", attrs.thread_key), ())
            by_conn = self._scoped.get(Scope("connection", attrs.connection_id), ())
            if not by_thread and not by_conn:
                merged = (self._global_sync, self._global_obs)
            else:
                regs = sorted((*self._global, *by_thread, *by_conn), key=_sort_key)
                merged = (
                    tuple(r for r in regs if not r.observer),
                    tuple(r for r in regs if r.observer),
                )
                self._merged[key] = merged
        return merged

    # -- running ------------------------------------------------------------------------------

    def prefetch(self, event: E, ctx: Any = None) -> Prefetch | None:
        """Start every lock-free hook that matches `event` now, before the thread's turn.

        `run(event, ctx, prefetch=...)` (for the same event) then applies their results in chain
        order. They see the event as it arrived (earlier hooks' modifications come later), which
        suits read-only checks. Returns None when no lock-free hook is registered.
        """
        if not self._lock_free_count:
            return None
        tasks: dict[Registration, asyncio.Task[Any]] = {}
        attrs: EventAttrs | None = None
        for reg in self._hooks_for(event)[0]:
            if not reg.lock_free:
                continue
            if reg.filter is not None:
                if attrs is None:
                    attrs = self._describe(event)
                if not reg.filter.matches(attrs):
                    continue
            args = (event, ctx) if reg.pass_second else (event,)
            held = functools.partial(self._held_the_loop, reg, event)
            tasks[reg] = asyncio.create_task(
                run_hook(reg.fn, args, reg.timeout, held), name=f"{self.kind} hook {reg.name}"
            )
        return Prefetch(event, tasks)

    async def run(
        self, event: E, ctx: Any = None, *, prefetch: Prefetch | None = None
    ) -> ChainOutcome[E]:
        """Run the chain for `event` and return what it decided; observers are started after."""
        sync, observers = self._hooks_for(event)
        current = event
        attrs: EventAttrs | None = None
        failures: list[HookFailure] | None = None
        modified_by: list[str] | None = None
        decision: Any = None
        decided_by: str | None = None
        try:
            for reg in sync:
                if reg.filter is not None:
                    if attrs is None:
                        attrs = self._describe(current)
                    if not reg.filter.matches(attrs):
                        continue
                failure: HookFailure | None = None
                try:
                    task = prefetch.take(reg) if prefetch is not None and reg.lock_free else None
                    if task is not None:
                        result = await task
                    else:  # inline, not `run_hook`: most hooks return without suspending
                        first = _DONE
                        began = begin()
                        try:
                            result = reg.fn(current, ctx) if reg.pass_second else reg.fn(current)
                            if type(result) is _CoroutineType:
                                try:
                                    first = result.send(None)
                                except StopIteration as stop:
                                    result, first = stop.value, _DONE
                        finally:
                            if (held := end(began)) > steps.BLOCKING_WARNING:
                                self._held_the_loop(reg, current, held)
                        if first is not _DONE:
                            later = functools.partial(self._held_the_loop, reg, current)
                            result = await bounded(resume(result, first, later), reg.timeout)
                        elif (
                            result is not None
                            and type(result) not in self._codes  # a decision: not awaitable
                            and inspect.isawaitable(result)
                        ):
                            result = await bounded(result, reg.timeout)
                except HookTimeoutError as exc:
                    failure = HookFailure(reg.name, "timeout", str(exc), reg.on_error, exc)
                except asyncio.CancelledError as exc:
                    if cancelling():
                        raise
                    failure = HookFailure(  # not ours: a task the hook awaited was cancelled
                        reg.name, "exception", "raised CancelledError", reg.on_error, exc
                    )
                except Exception as exc:
                    failure = HookFailure(
                        reg.name,
                        "exception",
                        f"raised {describe_hook_error(exc)}",
                        reg.on_error,
                        exc,
                    )
                if failure is None:
                    code = self._codes.get(type(result))
                    if code is None:
                        code = self._classify(result)
                    if code == _ALLOW:
                        continue
                    if code == _MODIFY:
                        if reg.lock_free:
                            failure = self._unusable(
                                reg,
                                "returned Modify, but a hook with needs_thread_lock: false may "
                                "not modify the message (it may run before earlier ones end)",
                            )
                        else:
                            new = self._modifiers[type(result)](result)
                            if self._event_type is not None and not isinstance(
                                new, self._event_type
                            ):
                                failure = self._unusable(
                                    reg,
                                    f"modified event is a {type(new).__name__}, "
                                    f"not a {self._event_type.__name__}",
                                )
                            else:
                                current = new
                                attrs = None
                                if modified_by is None:
                                    modified_by = []
                                modified_by.append(reg.name)
                                continue
                    elif code == _UNUSABLE:
                        failure = self._unusable(reg, _not_a_decision(result, event))
                    else:  # block or terminal
                        decision, decided_by = result, reg.name
                        break
                assert failure is not None
                if failures is None:
                    failures = []
                failures.append(failure)
                self._log_failure(failure, reg, current)
                if reg.on_error == "fail-closed":
                    decision = Block(
                        f"{self.kind} hook {reg.name!r} failed closed: {failure.detail}"
                    )
                    decided_by = reg.name
                    break
        finally:
            if prefetch is not None:
                prefetch.cancel()
        outcome: ChainOutcome[E] = ChainOutcome(
            current,
            decision,
            decided_by,
            tuple(failures) if failures else (),
            tuple(modified_by) if modified_by else (),
        )
        if observers:
            self._notify(observers, current, outcome)
        return outcome

    def _classify(self, result: Any) -> int:
        for cls, code in self._known:
            if isinstance(result, cls):
                if code == _MODIFY:
                    self._modifiers[type(result)] = self._modifiers[cls]
                self._codes[type(result)] = code
                return code
        return _UNUSABLE

    def _held_the_loop(self, reg: Registration, event: Any, held: float) -> None:
        """A hook that blocked (`time.sleep`, a blocking HTTP call) stalled every conversation,
        and its timeout could not fire: nothing else would say so."""
        what = f"{self.kind} {'observer' if reg.observer else 'hook'} {reg.name!r}"
        say_held(self._log, what, message_ref(event), reg.fn, held)

    def _unusable(self, reg: Registration, detail: str) -> HookFailure:
        return HookFailure(reg.name, "unusable", detail, reg.on_error)

    def _log_failure(self, failure: HookFailure, reg: Registration, event: Any) -> None:
        """One line: the hook (its name, and its code's name and place), the message it was
        handling (its id, never its text), what went wrong and what became of the message."""
        action = (
            "blocking (fail-closed)" if failure.on_error == "fail-closed" else "skipped (fail-open)"
        )
        message = "%s hook %r failed on %s: %s %s; %s"
        args = (self.kind, failure.hook, message_ref(event), hook_code(reg.fn), failure.detail)
        if failure.kind == "exception" and failure.error is not None:
            log_failure(self._log, logging.WARNING, message, *args, action, exc=failure.error)
        else:
            self._log.warning(message, *args, action)

    # -- observers ----------------------------------------------------------------------------

    def _notify(
        self, observers: tuple[Registration, ...], event: E, outcome: ChainOutcome[E]
    ) -> None:
        attrs: EventAttrs | None = None
        for reg in observers:
            if reg.filter is not None:
                if attrs is None:
                    attrs = self._describe(event)
                if not reg.filter.matches(attrs):
                    continue
            # Started eagerly: an observer that never suspends costs no task; one that does
            # continues in a background task, so the caller never waits for it.
            held = functools.partial(self._held_the_loop, reg, event)
            began = begin()
            try:
                result = reg.fn(event, outcome) if reg.pass_second else reg.fn(event)
                if type(result) is _CoroutineType:
                    try:
                        first = result.send(None)
                    except StopIteration:
                        continue
                    rest: Awaitable[Any] = resume(result, first, held)
                elif result is not None and inspect.isawaitable(result):
                    rest = result
                else:
                    continue
            except Exception as exc:
                self._log_observer(reg, event, exc)
                continue
            finally:
                if (took := end(began)) > steps.BLOCKING_WARNING:
                    held(took)
            task = asyncio.create_task(
                self._observe(reg, event, rest), name=f"{self.kind} observer {reg.name}"
            )
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _observe(self, reg: Registration, event: Any, rest: Awaitable[Any]) -> None:
        try:
            await bounded(rest, reg.timeout)
        except Exception as exc:
            self._log_observer(reg, event, exc)

    def _log_observer(self, reg: Registration, event: Any, exc: Exception) -> None:
        message = "%s observer %r failed on %s: %s %s"
        args = (self.kind, reg.name, message_ref(event), hook_code(reg.fn))
        if isinstance(exc, HookTimeoutError):
            self._log.warning(message, *args, exc)
            return
        log_failure(
            self._log,
            logging.WARNING,
            message,
            *args,
            f"raised {describe_hook_error(exc)}",
            exc=exc,
        )

    def running(self) -> set[asyncio.Task[None]]:
        """The observers' calls still under way."""
        return {task for task in self._background if not task.done()}

    async def drain(self) -> None:
        """Wait for every observer started so far (shutdown, tests)."""
        await drain_tasks(self._background)

    async def aclose(self) -> None:
        """Cancel observers still running."""
        for task in list(self._background):
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.drain()


def _modify_event(result: Modify[Any]) -> Any:
    return result.event


def _not_a_decision(result: Any, event: Any) -> str:
    """What is wrong with a hook's return value, by its type: the value itself may hold the
    message's text (`return msg`, `return msg.text`), which stays out of the log."""
    hint = (
        "a hook returns None, or an instance such as Continue(), Modify(msg), "
        "RouteToAgent('name'), RouteToSentinel(), Drop('why') or Forward('connection-id')"
    )
    if type(result) is type(event):
        return (
            f"returned the message itself instead of a decision (to change it: Modify(msg); {hint})"
        )
    if isinstance(result, type):
        return f"returned the class {result.__name__} instead of an instance of it ({hint})"
    return f"returned a value of type {type(result).__qualname__}, which is not a decision ({hint})"
