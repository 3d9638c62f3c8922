"""The agent runner's own promises: events reach `on_event` with their turn, and a finished turn
leaves nothing for the cycle collector."""

from __future__ import annotations

import gc
import weakref
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from talkbridge.agents.base import Result, TextDelta, TurnContext
from talkbridge.agents.echo import EchoAgent
from talkbridge.agents.runner import AgentRunner, earlier_entries
from talkbridge.hooks import HookRegistry
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


class _Careless:
    """Yields what is no agent event (a plain string, a dict) among its events."""

    name = "careless"

    def __init__(self, final: bool) -> None:
        self.final = final

    async def stream(self, ctx: TurnContext) -> AsyncIterator[Any]:
        yield "hello"
        yield {"type": "text", "text": "world"}
        yield TextDelta(text="hi")
        if self.final:
            yield Result(text="hi")


async def test_events_that_are_no_agent_events_are_skipped_and_named(
    sqlite_store: SqliteStore, caplog: pytest.LogCaptureFixture
) -> None:
    runner = AgentRunner({"careless": _Careless(final=True)}, sqlite_store)
    seen: list[Any] = []

    async def on_event(ctx: TurnContext, event: Any) -> None:
        seen.append(event)

    outcome = await runner.run_turn(make_msg("x"), "careless", on_event=on_event)
    assert outcome.status == "completed" and outcome.text == "hi"
    assert seen == [TextDelta(text="hi"), Result(text="hi")]  # connectors never get a str
    assert "the agent yielded a str, which is no agent event" in caplog.text


async def test_a_turn_of_only_wrong_events_says_what_the_agent_yielded(
    sqlite_store: SqliteStore,
) -> None:
    runner = AgentRunner(
        {"careless": _Careless(final=False)}, sqlite_store, environment="development"
    )
    outcome = await runner.run_turn(make_msg("x"), "careless")
    assert outcome.status == "error"
    assert outcome.text == (
        "the turn ended without a result (it yielded 2 things that no agent event is, such as "
        "str: yield TextDelta(...) and a final Result(...))"
    )


async def test_a_middleware_that_answers_nothing_is_named_in_the_turns_error(
    sqlite_store: SqliteStore,
) -> None:
    """A middleware that returned without `next()` and without emitting a result left only
    "the turn ended without a result", naming neither it nor what it should have done."""
    hooks = HookRegistry()

    @hooks.turn_middleware(name="gatekeeper")
    async def gatekeeper(ctx: TurnContext, next: Any) -> None:
        if ctx.input.prompt != "secret":
            await next()

    runner = AgentRunner({"echo": EchoAgent()}, sqlite_store, hooks, environment="development")
    assert (await runner.run_turn(make_msg("hi"), "echo")).text == "hi"
    outcome = await runner.run_turn(make_msg("secret"), "echo")
    assert outcome.status == "error"
    assert outcome.text == (
        "the turn ended without a result: turn middleware 'gatekeeper' called neither next() "
        "nor ctx.emit(Result(...))"
    )


async def test_the_history_a_turn_reads_ends_before_its_message_however_far_back(
    sqlite_store: SqliteStore,
) -> None:
    """m10 waited while 290 more messages came: earlier entries are read back page by page
    until it is found; the user messages after it (waiting for their turn) are left out, the
    reply sent meanwhile (m11, answering m9) is kept."""
    answered = make_msg("m10", id="m10")
    for n in range(1, 301):
        role = "assistant" if n == 11 else "user"
        await sqlite_store.append_history(answered.thread_key, role, f"m{n}", "x", f"m{n}")
    entries = await earlier_entries(sqlite_store, answered, 5)
    assert [e.text for e in entries] == ["m6", "m7", "m8", "m9", "m11"]
    entries = await earlier_entries(sqlite_store, answered, 20)
    assert [e.text for e in entries] == [*(f"m{n}" for n in range(1, 10)), "m11"]
    waited = make_msg("m250", id="m250")  # the 50 after it took room in the first read
    entries = await earlier_entries(sqlite_store, waited, 40)
    assert [e.text for e in entries] == [f"m{n}" for n in range(210, 250)]
    latest = make_msg("m299", id="m299")
    entries = await earlier_entries(sqlite_store, latest, 3)
    assert [e.text for e in entries] == ["m296", "m297", "m298"]
    unrecorded = make_msg("never stored", id="m999")
    entries = await earlier_entries(sqlite_store, unrecorded, 2)
    assert [e.text for e in entries] == ["m299", "m300"]


async def test_an_edited_message_is_read_once_as_it_now_reads_in_its_place(
    sqlite_store: SqliteStore,
) -> None:
    """q1 was edited twice: a later turn reads its latest words where it was asked, once. The
    turn answering an edit reads neither the message it re-asks (nor its edits) nor the answer
    it replaces."""
    key = make_msg("x").thread_key
    for role, mid, text, data in [
        ("user", "q0", "old question", None),
        ("user", "q0e1", "old question, edited", {"edit_of": "q0"}),
        ("user", "q1", "helo", None),
        ("assistant", "a1", "answer to helo", None),
        ("user", "q1e1", "hello", {"edit_of": "q1"}),
        ("user", "q1e2", "hello there", {"edit_of": "q1"}),
        ("user", "q2", "next", None),
    ]:
        await sqlite_store.append_history(key, role, mid, "x", text, data)  # type: ignore[arg-type]
    entries = await earlier_entries(sqlite_store, make_msg("next", id="q2"), 20)
    assert [(e.message_id, e.text) for e in entries] == [
        ("q0", "old question, edited"),
        ("q1", "hello there"),
        ("a1", "answer to helo"),
    ]
    await sqlite_store.map_id("conn-a", "q1", "a1")  # a1 answers q1
    editing = make_msg("hello there", id="q1e2", edit_of="q1")
    entries = await earlier_entries(sqlite_store, editing, 20)
    assert [(e.message_id, e.text) for e in entries] == [("q0", "old question, edited")]


class _Lister:
    """Its `stream` is a plain `def` returning a list: no async iterator."""

    name = "lister"

    def stream(self, ctx: TurnContext) -> Any:
        return [TextDelta(text="hi"), Result(text="hi")]


async def test_an_agent_whose_stream_is_no_async_iterator_fails_its_turn_saying_so(
    sqlite_store: SqliteStore, caplog: pytest.LogCaptureFixture
) -> None:
    """Each turn logged a traceback ending in "'async for' requires an object with
    __aiter__", naming neither the agent nor what its `stream` must be."""
    runner = AgentRunner({"helper": _Lister()}, sqlite_store, environment="development")
    outcome = await runner.run_turn(make_msg("x"), "helper")
    assert outcome.status == "error"
    assert outcome.text == (
        f"agent 'helper' ({__name__}._Lister): stream(ctx) returned a list, not an async "
        "iterator: write it as `async def stream(self, ctx)` that yields TextDelta(...) and a "
        "final Result(...)"
    )
    assert "Traceback" not in caplog.text and "__aiter__" not in caplog.text
    assert all(record.exc_info is None for record in caplog.records)
