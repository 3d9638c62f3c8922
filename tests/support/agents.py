"""Agents the tests share."""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from collections.abc import AsyncIterator
from typing import Any

from talkbridge.agents import Result, TextDelta, TurnContext


class Storyteller:
    """The default agent: streams its first words, finishes once `go` is set; counts its runs."""

    name = "echo"

    def __init__(self) -> None:
        self.runs = 0
        self.go = asyncio.Event()

    async def stream(self, ctx: TurnContext) -> AsyncIterator[Any]:
        self.runs += 1
        yield TextDelta(text="Once upon ")
        await self.go.wait()
        yield Result(text="Once upon a time.")


class GatedAgent:
    """The default agent: each prompt's turn answers once its own gate opens, and says whether
    it was cancelled meanwhile."""

    name = "echo"

    def __init__(self) -> None:
        self.started: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self.gates: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self.cancelled: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self.turns: Counter[str] = Counter()

    async def stream(self, ctx: TurnContext) -> AsyncIterator[Any]:
        prompt = ctx.input.prompt
        self.turns[prompt] += 1
        self.started[prompt].set()
        try:
            await self.gates[prompt].wait()
        except asyncio.CancelledError:
            self.cancelled[prompt].set()
            raise
        yield Result(text=f"answer to {prompt}")


class HistoryReader:
    """The default agent: answers "answer to PROMPT", and records the history each turn read
    (`ctx.history`), as (role, text) pairs, by prompt."""

    name = "echo"

    def __init__(self) -> None:
        self.seen: dict[str, list[tuple[str, str]]] = {}

    async def stream(self, ctx: TurnContext) -> AsyncIterator[Any]:
        self.seen[ctx.input.prompt] = [(e.role, e.text) for e in await ctx.history(20)]
        yield Result(text=f"answer to {ctx.input.prompt}")
