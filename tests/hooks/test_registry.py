"""HookRegistry: registration by kind, decorators, unregister, freeze."""

from __future__ import annotations

from typing import Any

import pytest

from talkbridge.agents.base import Result, TurnContext
from talkbridge.hooks import HookRegistry, RouteToAgent, Scope
from talkbridge.hooks.middleware import Next

from .support import make_ctx, make_msg


async def test_decorators_register_each_kind() -> None:
    hooks = HookRegistry()
    log: list[str] = []

    @hooks.turn_middleware(order=1)
    async def tag(ctx: TurnContext, next: Next) -> None:
        log.append("mw")
        await next()

    @hooks.on_turn_started
    def started(event: Any) -> None:
        log.append("started")

    @hooks.on_turn_finished(name="finished")
    async def fin(event: Any) -> None:
        log.append("finished")

    @hooks.run_listener("before_run")
    def before(ctx: TurnContext) -> None:
        log.append("before_run")

    @hooks.chat_hook
    def chat(messages: list[Any]) -> None:
        messages.append("x")

    @hooks.reply_hook(name="canned")
    def reply(messages: list[Any]) -> str:
        return "canned"

    assert hooks.names() == {
        "tag": "turn-middleware",
        "started": "agent-turn-started",
        "finished": "agent-turn-finished",
        "before": "run-listener",
        "chat": "chat",
        "canned": "reply",
    }

    async def agent(ctx: TurnContext) -> None:
        await ctx.emit(Result(text="ok"))

    ctx = make_ctx()
    hooks.lifecycle.started(ctx)
    await hooks.listeners.before_run(ctx)
    await hooks.compose_turn(agent)(ctx)
    hooks.lifecycle.finished(ctx, "completed")
    await hooks.drain()
    assert sorted(log) == ["before_run", "finished", "mw", "started"]
    assert await hooks.chat.run_reply_hooks(ctx, "ok") == "canned"


async def test_register_and_unregister_by_name() -> None:
    hooks = HookRegistry()

    async def vip(msg: Any) -> RouteToAgent:
        return RouteToAgent("vip")

    handle = hooks.register("channel-message", vip, order=3)
    assert (await hooks.channel_message.decide(make_msg())).decided_by == "vip"
    with pytest.raises(ValueError, match="'vip' is already registered"):
        hooks.register("reply", vip)
    handle.remove()
    assert (await hooks.channel_message.decide(make_msg())).decision is None
    with pytest.raises(KeyError, match="vip"):
        hooks.unregister("vip")


def test_bad_kind_and_options_are_named() -> None:
    hooks = HookRegistry()
    with pytest.raises(ValueError, match=r"unknown hook kind 'routing'; kinds: channel-message"):
        hooks.register("routing", print)
    with pytest.raises(TypeError, match=r"option\(s\) order do not apply; allowed: none"):
        hooks.register("agent-turn-started", print, name="p", order=2)


def test_freeze_keeps_scoped_channel_hooks_changeable() -> None:
    hooks = HookRegistry()
    hooks.freeze()
    with pytest.raises(RuntimeError, match="frozen"):
        hooks.register("channel-message", print, name="late")
    with pytest.raises(RuntimeError, match="frozen"):
        hooks.register("turn-middleware", print, name="late-mw")
    room = Scope.thread(make_msg().thread_key)
    handle = hooks.register("channel-message", print, name="room-guard", scope=room)
    assert hooks.channel_message.has_listeners()
    handle.remove()
    assert not hooks.channel_message.has_listeners()
