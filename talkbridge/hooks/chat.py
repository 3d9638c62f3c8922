"""Chat and reply hooks for message-list pipelines.

Chat hooks run before the agent, in registration order: each may mutate the message list in place or
return a replacement list (None keeps the current one). Reply hooks run after, in registration
order; the first one that returns a reply (not None) wins and the rest are skipped.

Errors: `fail-open` (default) skips the hook and logs; `fail-closed` raises `TurnAbortedError`
naming the hook, so an unchecked payload never goes through. Timeouts count as failures.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from talkbridge.agents.base import TurnContext
from talkbridge.errors import TurnAbortedError
from talkbridge.hooks.calls import check_call, failed_at, hook_code, log_failure
from talkbridge.hooks.engine import DEFAULT_TIMEOUT, ON_ERROR_VALUES, OnError, _takes_two
from talkbridge.hooks.steps import Held, run_hook, say_held

log = logging.getLogger("talkbridge.hooks")

MESSAGES_KEY = "messages"
"""Where a turn keeps its chat message list (`{"role", "content"}` dicts) in `ctx.state`."""


@dataclass(slots=True)
class _Entry:
    name: str
    fn: Callable[..., Any]
    on_error: OnError
    timeout: float | None
    pass_second: bool


@dataclass(frozen=True, slots=True)
class ReplyOutcome:
    reply: Any
    """The winning hook's reply, or the agent's reply passed in when no hook answered."""
    replied_by: str | None
    """Name of the reply hook that won; None when none did."""


class ChatHooks:
    def __init__(self, *, environment: Literal["production", "development"] = "production") -> None:
        self.environment = environment
        self._chat: list[_Entry] = []
        self._reply: list[_Entry] = []
        self._frozen = False

    def _entry(
        self, kind: str, fn: Callable[..., Any], name: str, on_error: OnError, timeout: float | None
    ) -> _Entry:
        if self._frozen:
            raise RuntimeError(
                f"cannot add {kind} hook {name!r}: hooks were frozen when the bridge started"
            )
        if not callable(fn):
            raise TypeError(f"{kind} hook {name!r} is not callable")
        if on_error not in ON_ERROR_VALUES:
            raise ValueError(f"{kind} hook {name!r}: on_error must be 'fail-open' or 'fail-closed'")
        if name in self.names():
            raise ValueError(f"a chat/reply hook named {name!r} is already registered")
        pass_second = kind == "reply" and _takes_two(fn)
        args = ("messages", "reply") if pass_second else ("messages",)
        check_call(fn, args, f"{kind} hook {name!r}")
        return _Entry(name, fn, on_error, timeout, pass_second)

    def add_chat(
        self,
        fn: Callable[..., Any],
        *,
        name: str,
        on_error: OnError = "fail-open",
        timeout: float | None = DEFAULT_TIMEOUT,
    ) -> None:
        """`fn(messages)` may mutate `messages` in place or return a replacement list."""
        self._chat.append(self._entry("chat", fn, name, on_error, timeout))

    def add_reply(
        self,
        fn: Callable[..., Any],
        *,
        name: str,
        on_error: OnError = "fail-open",
        timeout: float | None = DEFAULT_TIMEOUT,
    ) -> None:
        """`fn(messages)` or `fn(messages, reply)`; returning anything but None wins."""
        self._reply.append(self._entry("reply", fn, name, on_error, timeout))

    def remove(self, name: str, *, missing_ok: bool = False) -> int:
        before = len(self._chat) + len(self._reply)
        if self._frozen and name in self.names():
            raise RuntimeError(
                f"cannot remove hook {name!r}: hooks were frozen when the bridge started"
            )
        self._chat = [e for e in self._chat if e.name != name]
        self._reply = [e for e in self._reply if e.name != name]
        removed = before - len(self._chat) - len(self._reply)
        if not removed and not missing_ok:
            raise KeyError(f"no chat/reply hook named {name!r}")
        return removed

    def names(self) -> list[str]:
        return [e.name for e in (*self._chat, *self._reply)]

    def freeze(self) -> None:
        self._frozen = True

    def has_chat_hooks(self) -> bool:
        return bool(self._chat)

    def has_reply_hooks(self) -> bool:
        return bool(self._reply)

    def _failed(self, kind: str, entry: _Entry, detail: str, exc: BaseException | None) -> None:
        closed = entry.on_error == "fail-closed"
        action = "aborting the turn (fail-closed)" if closed else "skipped (fail-open)"
        level = logging.ERROR if closed else logging.WARNING
        code = hook_code(entry.fn)
        if exc is None:
            log.log(level, "%s hook %r: %s %s; %s", kind, entry.name, code, detail, action)
        else:
            shown_where = failed_at(exc)
            message = "%s hook %r: %s %s%s; %s"
            log_failure(
                log, level, message, kind, entry.name, code, detail, shown_where, action, exc=exc
            )
        if closed:
            shown = f": {detail}" if self.environment == "development" else ""
            raise TurnAbortedError(f"{kind} hook {entry.name!r} failed{shown}") from exc

    async def run_chat(self, messages: list[Any]) -> list[Any]:
        """Pass the message list through every chat hook; returns the final list."""
        current = messages
        for entry in self._chat:
            try:
                result = await run_hook(entry.fn, (current,), entry.timeout, _held("chat", entry))
            except Exception as exc:
                self._failed("chat", entry, f"raised {type(exc).__name__}: {exc}", exc)
                continue
            if result is None:
                continue
            if not isinstance(result, list):
                self._failed("chat", entry, f"returned {type(result).__name__}, not a list", None)
                continue
            current = result
        return current

    async def run_reply(self, messages: list[Any], reply: Any = None) -> ReplyOutcome:
        """Ask reply hooks in order; the first non-None answer wins."""
        for entry in self._reply:
            try:
                args = (messages, reply) if entry.pass_second else (messages,)
                result = await run_hook(entry.fn, args, entry.timeout, _held("reply", entry))
            except Exception as exc:
                self._failed("reply", entry, f"raised {type(exc).__name__}: {exc}", exc)
                continue
            if result is not None:
                return ReplyOutcome(result, entry.name)
        return ReplyOutcome(reply, None)

    # -- adapters for the agent runner: the turn's message list lives in ctx.state ---------------

    def turn_messages(self, ctx: TurnContext, seed: list[Any] | None = None) -> list[Any]:
        """The turn's message list (`ctx.state["messages"]`); when there is none yet, `seed`
        (what the agent would send its model), else the user's prompt alone."""
        messages = ctx.state.get(MESSAGES_KEY)
        if not isinstance(messages, list):
            messages = seed if seed is not None else [{"role": "user", "content": ctx.input.prompt}]
            ctx.state[MESSAGES_KEY] = messages
        return messages

    async def run_chat_hooks(self, ctx: TurnContext, seed: list[Any] | None = None) -> None:
        """Run chat hooks on the turn's message list (`seed`: see `turn_messages`); the last
        user message becomes the prompt."""
        if not self._chat:
            return
        messages = await self.run_chat(self.turn_messages(ctx, seed))
        ctx.state[MESSAGES_KEY] = messages
        for item in reversed(messages):
            if isinstance(item, dict) and item.get("role") == "user":
                content = item.get("content")
                if isinstance(content, str):
                    ctx.input.prompt = content
                break

    async def run_reply_hooks(self, ctx: TurnContext, reply: Any) -> Any:
        """The winning reply hook's reply, or None when no hook replied."""
        if not self._reply:
            return None
        outcome = await self.run_reply(self.turn_messages(ctx), reply)
        return outcome.reply if outcome.replied_by is not None else None


def _held(kind: str, entry: _Entry) -> Held:
    """Tells of a step of `entry` that blocked the loop (it is handed the messages, not one)."""

    def held(seconds: float) -> None:
        say_held(log, f"{kind} hook {entry.name!r}", None, entry.fn, seconds)

    return held
