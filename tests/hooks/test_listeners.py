"""Run and tool listeners: before_* abort with sanitized or detailed errors; others only log."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from talkbridge.agents.base import Error, Result, ToolCall, ToolResult, TurnContext
from talkbridge.errors import TurnAbortedError
from talkbridge.hooks import RunListeners, RunResult, ThreadCreated

from .support import make_ctx


class Permissions:
    """Only admins may call the 'shell' tool."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def before_tool_call(self, ctx: TurnContext, call: ToolCall) -> None:
        self.seen.append(call.name)
        if call.name == "shell":
            raise PermissionError("user-1 may not call shell")

    def after_tool_call(self, ctx: TurnContext, call: ToolCall, result: ToolResult) -> None:
        self.seen.append(f"after:{call.name}")


async def test_before_listener_aborts_with_sanitized_message_in_production() -> None:
    listeners = RunListeners(environment="production")
    perms = Permissions()
    assert listeners.add(perms, name="perms") == ["before_tool_call", "after_tool_call"]
    ctx = make_ctx()
    await listeners.before_tool_call(ctx, ToolCall(call_id="1", name="search"))
    with pytest.raises(TurnAbortedError) as info:
        await listeners.before_tool_call(ctx, ToolCall(call_id="2", name="shell"))
    assert str(info.value) == "the request was refused"
    assert "shell" not in str(info.value)
    assert perms.seen == ["search", "shell"]


async def test_development_mode_carries_the_listener_detail() -> None:
    listeners = RunListeners(environment="production")

    def deny(ctx: TurnContext) -> None:
        raise ValueError("quota exceeded for user-1")

    listeners.add(deny, name="quota", event="before_run")
    with pytest.raises(TurnAbortedError) as info:
        await listeners.before_run(make_ctx(), environment="development")
    assert "quota exceeded for user-1" in str(info.value) and "'quota'" in str(info.value)


async def test_after_and_other_listeners_only_log(caplog: pytest.LogCaptureFixture) -> None:
    listeners = RunListeners()
    got: list[Any] = []

    async def after(ctx: TurnContext, result: RunResult) -> None:
        got.append(result)

    def broken(*args: Any) -> None:
        raise RuntimeError("listener bug")

    listeners.add(broken, name="broken-after", event="after_run")
    listeners.add(after, name="after", event="after_run")
    listeners.add(broken, name="broken-thread", event="on_thread_create")
    listeners.add(broken, name="broken-tool", event="after_tool_call")
    ctx = make_ctx()
    ctx.events.append(Error(message="model said no"))
    with caplog.at_level(logging.WARNING, logger="talkbridge.hooks"):
        await listeners.after_run(ctx, status="error")
        await listeners.on_thread_create(ThreadCreated("c", "t", "webchat", implicit=True))
        await listeners.after_tool_call(
            ctx, ToolCall(call_id="1", name="x"), ToolResult(call_id="1", output="")
        )
    assert got == [RunResult(text="", event_count=1, interrupted=False, errored=True)]
    assert "'broken-after'" in caplog.text and "'broken-thread'" in caplog.text


async def test_after_run_builds_result_text_and_on_error_gets_phase() -> None:
    listeners = RunListeners()
    got: list[Any] = []
    listeners.add(lambda ctx, result: got.append(result), name="after", event="after_run")
    listeners.add(
        lambda ctx, phase, exc: got.append((phase, str(exc))), name="err", event="on_error"
    )
    ctx = make_ctx()
    ctx.events.append(Result(text="fine"))
    await listeners.after_run(ctx, status="completed")
    await listeners.on_error(ctx, "agent", ConnectionError("upstream"))
    assert got == [RunResult("fine", 1), ("agent", "upstream")]


def test_listener_registration_errors() -> None:
    listeners = RunListeners()
    with pytest.raises(TypeError, match="none of the listener methods"):
        listeners.add(object(), name="empty")
    with pytest.raises(ValueError, match="unknown event 'before_everything'"):
        listeners.add(print, name="x", event="before_everything")
    listeners.add(print, name="x", event="after_run")
    assert listeners.has_listeners("after_run") and not listeners.has_listeners("before_run")
    listeners.remove("x")
    assert not listeners.has_listeners("after_run")
