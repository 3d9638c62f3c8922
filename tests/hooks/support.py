"""Small builders shared by the hook tests."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from talkbridge.agents.base import TurnContext, TurnInput, TurnSession
from talkbridge.message import NormalizedMessage

WAIT = 5.0
"""Safety-net timeout for awaiting events; tests never assert on time."""


def make_msg(
    text: str = "hello",
    *,
    id: str = "m1",
    connection_id: str = "conn-a",
    channel: str = "webchat",
    thread_id: str = "t1",
    **extra: Any,
) -> NormalizedMessage:
    return NormalizedMessage(
        id=id,
        connection_id=connection_id,
        channel=channel,
        channel_user_id="user-1",
        thread_id=thread_id,
        timestamp=datetime(2024, 5, 1, 12, 0, tzinfo=UTC),
        text=text,
        **extra,
    )


def make_ctx(prompt: str = "hello", *, agent: str = "echo") -> TurnContext:
    msg = make_msg(prompt)
    events: list[Any] = []

    async def emit(event: Any) -> None:
        events.append(event)

    async def no_history(limit: int) -> list[Any]:
        return []

    return TurnContext(
        session=TurnSession(
            session_id=msg.thread_key,
            turn_id="turn-1",
            agent_name=agent,
            connection_id=msg.connection_id,
            thread_id=msg.thread_id,
            channel=msg.channel,
        ),
        input=TurnInput(prompt=prompt),
        message=msg,
        emit=emit,
        started_at=datetime(2024, 5, 1, 12, 0, tzinfo=UTC),
        load_history=no_history,
        events=events,
    )
