"""Turn lifecycle watchers: event shapes and fire-and-forget dispatch."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from talkbridge.agents.base import Result, ToolCall, ToolResult
from talkbridge.hooks import LifecycleWatchers, TurnFinishedEvent, TurnStartedEvent
from talkbridge.hooks.calls import shown_path

from .support import WAIT, hook_folder_bridge, make_ctx


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


def _turn(event: Any, thread: str, turn_id: str) -> Any:
    """`event` as one of conversation `thread`'s turns."""
    ref = event.turn.model_copy(update={"session_id": thread, "turn_id": turn_id})
    return event.model_copy(update={"turn": ref})


async def test_a_watcher_gets_a_conversations_events_in_order_without_holding_others() -> None:
    """Each event ran as its own task: a watcher awaiting something in `on_turn_started` got
    the turn's `finished` (and the next turn's `started`) first. Now one watcher's events of
    one conversation wait for each other; other conversations and other watchers go on."""
    watchers = LifecycleWatchers()
    release = asyncio.Event()
    seen: list[str] = []
    probed = asyncio.Event()
    other_thread = asyncio.Event()

    class Audit:
        async def on_turn_started(self, event: TurnStartedEvent) -> None:
            if event.turn.session_id == "A" and event.turn.turn_id == "1":
                await release.wait()
            seen.append(f"started {event.turn.session_id}{event.turn.turn_id}")
            if event.turn.session_id == "B":
                other_thread.set()

        async def on_turn_finished(self, event: TurnFinishedEvent) -> None:
            seen.append(f"finished {event.turn.session_id}{event.turn.turn_id}")

    audit = Audit()
    watchers.add("agent-turn-started", audit.on_turn_started, name="audit")
    watchers.add("agent-turn-finished", audit.on_turn_finished, name="audit")
    watchers.add("agent-turn-finished", lambda event: probed.set(), name="probe")

    started = TurnStartedEvent.from_context(make_ctx())
    finished = TurnFinishedEvent.from_context(make_ctx(), "completed")
    watchers.turn_started(_turn(started, "A", "1"))
    watchers.turn_finished(_turn(finished, "A", "1"))
    watchers.turn_started(_turn(started, "A", "2"))
    watchers.turn_started(_turn(started, "B", "1"))
    async with asyncio.timeout(WAIT):
        await probed.wait()  # another watcher got A1's finish: this one had its chance too
        await other_thread.wait()  # and conversation B is not held up behind A
    assert seen == ["started B1"]
    release.set()
    await asyncio.wait_for(watchers.drain(), WAIT)
    assert seen == ["started B1", "started A1", "finished A1", "started A2"]


async def test_a_watcher_too_far_behind_has_events_dropped_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    watchers = LifecycleWatchers(max_behind=2)
    release = asyncio.Event()
    got: list[str] = []

    async def stuck(event: TurnStartedEvent) -> None:
        await release.wait()
        got.append(event.turn.turn_id)

    watchers.add("agent-turn-started", stuck, name="stuck")
    started = TurnStartedEvent.from_context(make_ctx())
    with caplog.at_level(logging.WARNING, logger="talkbridge.hooks"):
        for n in range(5):  # never waits: the turns go on
            watchers.turn_started(_turn(started, "A", str(n)))
        release.set()
        await asyncio.wait_for(watchers.drain(), WAIT)
    assert got == ["0", "1"]
    code = f"stuck ({shown_path(__file__)} line {stuck.__code__.co_firstlineno})"
    assert [r.getMessage() for r in caplog.records] == [
        f"turn watcher 'stuck' ({code}) is 2 events behind: dropping this agent-turn-started "
        "event and the next ones until it catches up (a watcher should return quickly and "
        "start slow work as a task of its own; /healthz counts the dropped events under "
        "watchers)",
        "turn watcher 'stuck' caught up; 3 events were dropped (3 since the start)",
    ]
    assert watchers.health() == {"stuck": {"behind": 0, "dropped": 3}}


async def test_a_watcher_of_both_events_too_far_behind_gets_whole_turns() -> None:
    """Past the bound, a turn's `finished` was dropped although its `started` had been
    delivered (and a later turn's started dropped): a watcher that pairs them (a timer keeping
    each turn's start) never saw those turns end. Now a turn's finish goes where its start went:
    delivered past the bound when its start is in line, dropped when its start was."""
    watchers = LifecycleWatchers(max_behind=2)
    release = asyncio.Event()
    got: list[str] = []

    class Timer:
        async def on_turn_started(self, event: TurnStartedEvent) -> None:
            await release.wait()
            got.append(f"started {event.turn.session_id}")

        async def on_turn_finished(self, event: TurnFinishedEvent) -> None:
            got.append(f"finished {event.turn.session_id}")

    timer = Timer()
    watchers.add("agent-turn-started", timer.on_turn_started, name="timer")
    watchers.add("agent-turn-finished", timer.on_turn_finished, name="timer")
    started = TurnStartedEvent.from_context(make_ctx())
    finished = TurnFinishedEvent.from_context(make_ctx(), "completed")
    for conversation in "ABC":  # three turns under way at once, in three conversations
        watchers.turn_started(_turn(started, conversation, "1"))
    for conversation in "ABC":
        watchers.turn_finished(_turn(finished, conversation, "1"))
    release.set()
    await asyncio.wait_for(watchers.drain(), WAIT)
    assert sorted(got) == ["finished A", "finished B", "started A", "started B"]
    assert watchers.health() == {"timer": {"behind": 0, "dropped": 2}}  # C's start and finish


async def test_an_object_with_both_methods_in_one_folder_gets_both_events(
    tmp_path: Path,
) -> None:
    """A hook folder under agent-turn-started whose object also has `on_turn_finished` was
    registered for the start only: the finish was silently never delivered."""
    from tests.support.talk_connector import make_message

    folder = tmp_path / "hooks" / "agent-turn-started" / "audit"
    code = (
        "import asyncio\n"
        "class Audit:\n"
        "    def __init__(self, bridge):\n"
        "        self.bridge = bridge\n"
        "    async def on_turn_started(self, event):\n"
        "        await self.bridge.release.wait()\n"
        "        self.bridge.seen.append('started')\n"
        "    async def on_turn_finished(self, event):\n"
        "        self.bridge.seen.append('finished ' + event.status)\n"
        "def create_hook(deps):\n"
        "    bridge = deps.context['bridge']\n"
        "    bridge.seen, bridge.release = [], asyncio.Event()\n"
        "    return Audit(bridge)\n"
    )
    async with hook_folder_bridge(tmp_path, folder, code) as (bridge, conn):
        assert bridge.hooks.names() == {"audit": "agent-turn-started"}
        await conn.inject(make_message("hello", thread_id="chat-1"))
        await conn.wait_sent(1)  # the turn is over: its finish is announced
        await bridge.router.join()
        bridge.release.set()
        await asyncio.wait_for(bridge.hooks.drain(), WAIT)
        assert bridge.seen == ["started", "finished completed"]
