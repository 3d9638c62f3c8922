"""Turn lifecycle watchers: event shapes and fire-and-forget dispatch."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from typing import Any

import pytest

from talkbridge.agents.base import Result, ToolCall, ToolResult
from talkbridge.hooks import LifecycleWatchers, TurnFinishedEvent, TurnStartedEvent

from .support import WAIT, make_ctx


def test_started_event_shape() -> None:
    ctx = make_ctx("twelve chars")
    event = TurnStartedEvent.from_context(ctx)
    data = event.model_dump(mode="json")
    assert set(data) == {"type", "version", "turn", "timing", "input"}
    assert data["type"] == "agent-turn-started" and data["version"] == 1
    assert data["turn"]["agent_name"] == "echo" and data["turn"]["turn_id"] == "turn-1"
    assert data["turn"]["session_id"] == ctx.session.session_id
    assert data["turn"]["thread"]["thread_id"] == "t1"
    assert data["input"] == {"prompt_length": 12, "attachments_count": 0}


def test_finished_event_summarizes_the_turn() -> None:
    ctx = make_ctx()
    ctx.events.extend(
        [
            ToolCall(call_id="1", name="search"),
            ToolResult(call_id="1", output="boom", is_error=True),
            Result(text="done", usage={"output_tokens": 3}),
        ]
    )
    finished_at = ctx.started_at + timedelta(milliseconds=1500)
    event = TurnFinishedEvent.from_context(ctx, "completed", finished_at=finished_at)
    assert event.status == "completed"
    assert event.timing.duration_ms == 1500
    assert event.output.text == "done" and event.output.terminal_kind == "result"
    assert event.output.accounting == {"output_tokens": 3}
    assert event.metrics.tool_call_count == 1 and event.metrics.tool_error_count == 1
    assert event.metrics.event_count == 3
    failed = TurnFinishedEvent.from_context(make_ctx(), "error", error="refused")
    assert failed.output.terminal_kind is None and failed.output.error == "refused"


async def test_watchers_fire_and_forget_and_a_raising_one_breaks_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    watchers = LifecycleWatchers()
    release = asyncio.Event()
    got: list[Any] = []

    async def slow(event: TurnStartedEvent) -> None:
        await release.wait()
        got.append(("slow", event.type))

    def broken(event: TurnStartedEvent) -> None:
        raise RuntimeError("watcher exploded")

    async def finished(event: TurnFinishedEvent) -> None:
        got.append(("finished", event.status))

    assert not watchers.has_listeners("agent-turn-started")
    watchers.add("agent-turn-started", slow, name="slow")
    watchers.add("agent-turn-started", broken, name="broken")
    watchers.add("agent-turn-finished", finished, name="fin")
    assert watchers.has_listeners("agent-turn-started")

    ctx = make_ctx()
    with caplog.at_level(logging.WARNING, logger="talkbridge.hooks"):
        watchers.started(ctx)  # returns at once although "slow" waits
        watchers.finished(ctx, "completed")
        assert got == []
        release.set()
        await asyncio.wait_for(watchers.drain(), WAIT)
    assert sorted(got) == [("finished", "completed"), ("slow", "agent-turn-started")]
    assert "'broken'" in caplog.text

    watchers.remove("slow")
    watchers.remove("broken")
    assert not watchers.has_listeners("agent-turn-started")


def test_unknown_kind_and_frozen() -> None:
    watchers = LifecycleWatchers()
    with pytest.raises(ValueError, match="agent-turn-started"):
        watchers.add("agent-turn-done", print, name="x")  # type: ignore[arg-type]
    watchers.freeze()
    with pytest.raises(RuntimeError, match="frozen"):
        watchers.add("agent-turn-started", print, name="x")
