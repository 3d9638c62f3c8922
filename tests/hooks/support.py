"""Small builders shared by the hook tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from talkbridge.agents.base import TurnContext, TurnInput, TurnSession
from talkbridge.message import NormalizedMessage
from tests.support.talk_connector import TalkConnector

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


def _write_hook(folder: Path, code: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)  # a hook.yaml may be there already
    (folder / "hook.py").write_text(code, encoding="utf-8")


@asynccontextmanager
async def hook_folder_bridge(
    tmp_path: Path,
    folder: Path,
    code: str,
    *,
    prepare: Callable[[Any], None] = lambda bridge: None,
    also: Mapping[Path, str] | None = None,
    **options: Any,
) -> AsyncIterator[tuple[Any, TalkConnector]]:
    """A Bridge that loads the hook folder `folder` (its `hook.py` is `code`) from its config,
    as a user's does, over a connection "test" trusting alice; `also` maps more hook folders
    to their `hook.py`, listed after it; `prepare(bridge)` runs before the start.
    `deps.context["bridge"]` is the Bridge. Stopped at the end."""
    from talkbridge.bridge import Bridge
    from talkbridge.config import BridgeConfig, ConnectionConfig

    folders = {folder: code, **(also or {})}
    for path, text in folders.items():
        _write_hook(path, text)
    config = BridgeConfig.model_validate(
        {"store": f"sqlite:///{tmp_path / 'talkbridge.db'}", "hooks": [str(f) for f in folders]}
    )
    bridge = Bridge(config, with_webchat=False, **options)
    conn = TalkConnector("test")
    bridge.registry.add(conn, ConnectionConfig(id="test", channel="telegram", trusted=["alice"]))
    prepare(bridge)
    await bridge.start()
    try:
        yield bridge, conn
    finally:
        await bridge.stop()
