"""Agents the tests share."""

from __future__ import annotations

import asyncio
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
