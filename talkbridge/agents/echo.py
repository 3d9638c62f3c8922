"""The embedded default agent: answers with what it was told, streamed word by word."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

from talkbridge.agents.base import Result, TextDelta, TurnContext

_PIECES = re.compile(r"\S+\s*|\s+")
MAX_DELTAS = 16


class EchoAgent:
    name = "echo"

    async def stream(self, ctx: TurnContext) -> AsyncIterator[Any]:
        text = ctx.input.prompt
        if ctx.input.attachments:
            names = ", ".join(a.name or a.kind for a in ctx.input.attachments)
            text = f"{text}\n\n(received: {names})" if text else f"(received: {names})"
        if not text:
            text = "(empty message)"
        pieces = _PIECES.findall(text)
        if len(pieces) > MAX_DELTAS:  # stream in at most MAX_DELTAS steps, whatever the length
            size = -(-len(pieces) // MAX_DELTAS)
            pieces = ["".join(pieces[i : i + size]) for i in range(0, len(pieces), size)]
        for piece in pieces:
            yield TextDelta(text=piece)
        yield Result(text=text)
