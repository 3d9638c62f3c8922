"""Turn middleware: onion order, the three patterns, fail-open/closed, innermost exactly once."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from talkbridge.agents.base import Error, Result, TurnContext
from talkbridge.hooks.engine import OnError
from talkbridge.hooks.middleware import Next, compose

from .support import make_ctx


class Mw:
    def __init__(
        self,
        name: str,
        log: list[str],
        *,
        order: int = 0,
        on_error: OnError = "fail-open",
        raise_before: bool = False,
        raise_after: bool = False,
    ) -> None:
        self.name, self.log, self.order = name, log, order
        self.on_error: OnError = on_error
        self.raise_before, self.raise_after = raise_before, raise_after

    async def handle(self, ctx: TurnContext, next: Next) -> None:
        self.log.append(f"{self.name}>")
        if self.raise_before:
            raise RuntimeError(f"{self.name} broke before")
        await next()
        self.log.append(f"<{self.name}")
        if self.raise_after:
            raise RuntimeError(f"{self.name} broke after")


def agent(log: list[str]) -> Any:
    async def innermost(ctx: TurnContext) -> None:
        log.append(f"agent({ctx.input.prompt})")
        await ctx.emit(Result(text=ctx.input.prompt.upper()))

    return innermost


async def test_lowest_order_outermost_ties_in_registration_order() -> None:
    log: list[str] = []
    mws = [
        Mw("c", log, order=5),
        Mw("a", log, order=1),
        Mw("b1", log, order=3),
        Mw("b2", log, order=3),
    ]
    turn = compose(mws, agent(log))
    await turn(make_ctx())
    assert log == ["a>", "b1>", "b2>", "c>", "agent(hello)", "<c", "<b2", "<b1", "<a"]


async def test_onion_is_built_once_and_reused_per_turn() -> None:
    log: list[str] = []
    turn = compose([Mw("a", log)], agent(log))
    await turn(make_ctx("one"))
    await turn(make_ctx("two"))
    assert log == ["a>", "agent(one)", "<a", "a>", "agent(two)", "<a"]


async def test_three_patterns_rewrite_postprocess_and_stop_early() -> None:
    log: list[str] = []

    class Rewrite:
        order = 0
        on_error: OnError = "fail-open"
        name = "rewrite"

        async def handle(self, ctx: TurnContext, next: Next) -> None:
            ctx.input.prompt = ctx.input.prompt.replace("secret", "***")
            await next()

    class Post:
        order = 1
        on_error: OnError = "fail-open"
        name = "post"

        async def handle(self, ctx: TurnContext, next: Next) -> None:
            await next()
            ctx.state["post"] = f"saw {ctx.final!r}"

    class Canned:
        order = 2
        on_error: OnError = "fail-open"
        name = "canned"

        async def handle(self, ctx: TurnContext, next: Next) -> None:
            if ctx.input.prompt.startswith("/help"):
                await ctx.emit(Result(text="help text"))
                return  # never calls next: drives the turn itself
            await next()

    turn = compose([Canned(), Post(), Rewrite()], agent(log))
    ctx = make_ctx("my secret")
    await turn(ctx)
    assert log == ["agent(my ***)"] and ctx.final == Result(text="MY ***")
    assert "MY ***" in ctx.state["post"]

    ctx = make_ctx("/help me")
    await turn(ctx)
    assert log == ["agent(my ***)"]  # the agent did not run
    assert ctx.events == [Result(text="help text")] and "help text" in ctx.state["post"]


async def test_fail_open_before_next_is_skipped_rest_runs_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log: list[str] = []
    turn = compose([Mw("outer", log), Mw("broken", log, order=1, raise_before=True)], agent(log))
    with caplog.at_level(logging.WARNING, logger="talkbridge.hooks"):
        await turn(make_ctx())
    assert log == ["outer>", "broken>", "agent(hello)", "<outer"]
    assert "'broken'" in caplog.text and "skipped" in caplog.text


async def test_fail_open_after_next_is_only_logged() -> None:
    log: list[str] = []
    turn = compose([Mw("outer", log), Mw("late", log, order=1, raise_after=True)], agent(log))
    ctx = make_ctx()
    await turn(ctx)
    assert log == ["outer>", "late>", "agent(hello)", "<late", "<outer"]
    assert log.count("agent(hello)") == 1 and ctx.final == Result(text="HELLO")


@pytest.mark.parametrize("development", [False, True])
async def test_fail_closed_emits_error_naming_the_middleware_and_stops(development: bool) -> None:
    log: list[str] = []
    guard = Mw("guard", log, order=1, on_error="fail-closed", raise_before=True)
    turn = compose(
        [Mw("outer", log), guard],
        agent(log),
        environment="development" if development else "production",
    )
    ctx = make_ctx()
    await turn(ctx)
    assert "agent(hello)" not in log
    assert isinstance(ctx.final, Error) and "'guard'" in ctx.final.message
    assert ("guard broke before" in ctx.final.message) is development


async def test_calling_next_twice_never_runs_the_agent_twice() -> None:
    log: list[str] = []

    class Greedy:
        order = 0
        on_error: OnError = "fail-open"
        name = "greedy"

        async def handle(self, ctx: TurnContext, next: Next) -> None:
            await next()
            await next()

    turn = compose([Greedy()], agent(log))
    await turn(make_ctx())
    assert log == ["agent(hello)"]


async def test_agent_failure_passes_through_fail_open_layers() -> None:
    log: list[str] = []

    async def failing(ctx: TurnContext) -> None:
        raise ValueError("agent down")

    turn = compose([Mw("outer", log)], failing)
    with pytest.raises(ValueError, match="agent down"):
        await turn(make_ctx())
    assert log == ["outer>"]  # not mistaken for the middleware's own failure and re-run


def test_a_middleware_whose_handle_is_not_async_is_refused_when_the_onion_is_built() -> None:
    """Added in code (not through the registry, which refuses it too), it was built in, and
    every turn failed on `await None`."""

    class Plain:
        order = 0
        name = "plain"

        def handle(self, ctx: TurnContext, next: Next) -> None:
            pass

    with pytest.raises(TypeError) as err:
        compose([Plain()], agent([]))  # type: ignore[list-item]
    line = Plain.handle.__code__.co_firstlineno
    assert str(err.value) == (
        f"turn middleware 'plain': handle (tests/hooks/test_middleware.py line {line}) is a "
        "plain function (def): it must be async def handle(self, ctx, next), as what it "
        "returns is awaited"
    )
