"""The agent runner's own promises: events reach `on_event` with their turn, and a finished turn
leaves nothing for the cycle collector."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from typing import Any

import pytest

from talkbridge.agents.base import Result, TextDelta, TurnContext
from talkbridge.agents.echo import EchoAgent
from talkbridge.agents.runner import AgentRunner
from talkbridge.store import SqliteStore
from tests.hooks.support import make_msg


@pytest.fixture
def no_cycle_collector() -> Iterator[None]:
    gc.collect()
    gc.disable()
    yield
    gc.enable()


async def test_on_event_gets_every_event_with_its_turn(sqlite_store: SqliteStore) -> None:
    runner = AgentRunner({"echo": EchoAgent()}, sqlite_store)
    seen: list[tuple[str, Any]] = []

    async def on_event(ctx: TurnContext, event: Any) -> None:
        seen.append((ctx.session.turn_id, event))

    outcome = await runner.run_turn(make_msg("hi there"), "echo", on_event=on_event)
    turn_id = outcome.session.turn_id
    assert [(t, type(e)) for t, e in seen] == [(turn_id, TextDelta), (turn_id, Result)]
    assert outcome.text == "hi there"


@pytest.mark.usefixtures("no_cycle_collector")
async def test_a_finished_turn_is_freed_as_soon_as_nobody_holds_it(
    sqlite_store: SqliteStore,
) -> None:
    """A turn made a reference cycle (its context held `emit`, which held the context): ~20
    objects a message waited for the cycle collector, which then ran twice as often."""
    runner = AgentRunner({"echo": EchoAgent()}, sqlite_store)

    async def on_event(ctx: TurnContext, event: Any) -> None:
        return None

    outcome = await runner.run_turn(make_msg("hi"), "echo", on_event=on_event)
    assert outcome.context is not None
    context = weakref.ref(outcome.context)
    del outcome
    assert context() is None  # freed by reference counting alone (the collector is off)
