"""The embedded default agent: answers with what it was told, streamed in a few pieces.

A few pieces show the streaming path end to end; more would only cost frames, since pieces that
arrive together are merged anyway (`talkbridge.webchat.streams`).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

from talkbridge.agents.base import Result, TextDelta, TurnContext

_PIECES = re.compile(r"\S+\s*|\s+")
MAX_DELTAS = 4
MIN_DELTA = 32
"""Characters per delta at least: short answers come in one piece, long ones word by word."""


class EchoAgent:
    name = "echo"

    def stream(self, ctx: TurnContext) -> AsyncIterator[Any]:
        text = ctx.input.prompt
        if ctx.input.attachments:
            names = ", ".join(a.name or a.kind for a in ctx.input.attachments)
            text = f"{text}\n\n(received: {names})" if text else f"(received: {names})"
        if not text:
            text = "(empty message)"
        return _Events([*(TextDelta(text=piece) for piece in _pieces(text)), Result(text=text)])


class _Events:
    """Events that are all known up front, as an async iterator. Not an async generator: the
    event loop keeps a weak set of every generator it starts (for shutdown), which costs the
    default agent more than its whole answer."""

    __slots__ = ("_events",)

    def __init__(self, events: list[Any]) -> None:
        self._events = iter(events)

    def __aiter__(self) -> _Events:
        return self

    async def __anext__(self) -> Any:
        for event in self._events:
            return event
        raise StopAsyncIteration


def _pieces(text: str) -> list[str]:
    """Split at word boundaries into at most MAX_DELTAS pieces of at least MIN_DELTA chars."""
    if len(text) < 2 * MIN_DELTA:
        return [text]
    words = _PIECES.findall(text)
    target = max(MIN_DELTA, -(-len(text) // MAX_DELTAS))
    pieces: list[str] = []
    current = ""
    for word in words:
        current += word
        if len(current) >= target:
            pieces.append(current)
            current = ""
    if current:
        pieces.append(current)
    return pieces
