"""What an agent is: a prompt (with thread context) in, a stream of `AgentMessage` events out."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from talkbridge.message import Attachment, NormalizedMessage
from talkbridge.store.base import HistoryEntry


class _Event(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class TextDelta(_Event):
    type: Literal["text_delta"] = "text_delta"
    text: str


class ToolCall(_Event):
    type: Literal["tool_call"] = "tool_call"
    call_id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class ToolResult(_Event):
    type: Literal["tool_result"] = "tool_result"
    call_id: str
    output: str
    is_error: bool = False


class Result(_Event):
    """The final answer of a turn: saving it is what records the assistant message."""

    type: Literal["result"] = "result"
    text: str
    usage: dict[str, int] = Field(default_factory=dict)


class Error(_Event):
    type: Literal["error"] = "error"
    message: str
    code: str = "agent_error"


AgentMessage = Annotated[
    TextDelta | ToolCall | ToolResult | Result | Error, Field(discriminator="type")
]
TERMINAL_TYPES = frozenset({"result", "error"})
_TERMINAL = (Result, Error)


@dataclass(slots=True)
class TurnInput:
    """Mutable by turn middleware: rewrite `prompt` before calling `next()`."""

    prompt: str
    attachments: list[Attachment] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class TurnSession:
    session_id: str
    """The conversation: the message's `thread_key`."""
    turn_id: str
    agent_name: str
    connection_id: str
    thread_id: str
    channel: str


HistoryLoader = Callable[[int], Awaitable[Sequence[HistoryEntry]]]


@dataclass(slots=True, weakref_slot=True)
class TurnContext:
    """Everything one turn sees; middleware, agents and listeners share this object."""

    session: TurnSession
    input: TurnInput
    message: NormalizedMessage
    emit: Callable[[Any], Awaitable[None]]
    """Emit an `AgentMessage` event as if the agent produced it."""
    started_at: datetime
    load_history: HistoryLoader
    events: list[Any] = field(default_factory=list)
    state: dict[str, Any] = field(default_factory=dict)
    """Free space for middleware to pass notes to each other within one turn."""

    @property
    def final(self) -> Result | Error | None:
        for event in reversed(self.events):
            if isinstance(event, _TERMINAL):
                return event
        return None

    async def history(self, limit: int = 20) -> Sequence[HistoryEntry]:
        """Earlier messages of this thread, oldest first (loaded on demand only): not this
        turn's own message, nor those that came after it and wait for their turn."""
        return await self.load_history(limit)


@runtime_checkable
class Agent(Protocol):
    name: str

    def stream(self, ctx: TurnContext) -> AsyncIterator[Any]:
        """Yield `AgentMessage` events; end with a `Result` or an `Error`."""
        ...


@runtime_checkable
class ChatMessages(Protocol):
    async def messages(self, ctx: TurnContext) -> list[dict[str, str]]:
        """What the agent would send its model (system prompt, history, the prompt): chat hooks
        are handed this list, and the agent sends the list they leave."""
        ...


@runtime_checkable
class AgentCheck(Protocol):
    async def check(self) -> str:
        """Try the agent's model and credentials (`talkbridge check`): return what answers, or
        raise `AgentUnavailableError` saying what does not."""
        ...
