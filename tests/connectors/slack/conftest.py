"""A Slack peer, and connectors pointed at it, for the Slack transport tests."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from talkbridge.connectors.base import ConnectorContext
from talkbridge.connectors.slack.codec import Deletion
from talkbridge.connectors.slack.config import SlackConfig
from talkbridge.connectors.slack.transport import SlackConnector, create
from talkbridge.message import NormalizedMessage
from talkbridge.store import SqliteStore
from tests.peers.slack import SlackPeer, Workspace

BOT_TOKEN = "xoxb-1-test-bot-token"
APP_TOKEN = "xapp-1-test-app-token"
SIGNING_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"


@pytest.fixture
async def peer() -> AsyncIterator[SlackPeer]:
    async with SlackPeer(Workspace(BOT_TOKEN, app_token=APP_TOKEN)) as running:
        running.add_user("U0ADA0001", "Ada Lovelace", display_name="ada")
        running.add_user("U0GRACE01", "Grace Hopper")
        yield running


class Status:
    """The `ConnectionStatus` a registry would pass, recording every report."""

    def __init__(self) -> None:
        self.reports: list[tuple[str, str]] = []
        self._changed = asyncio.Event()

    def up(self) -> None:
        self.reports.append(("up", ""))
        self._notify()

    def degraded(self, reason: str) -> None:
        self.reports.append(("degraded", reason))
        self._notify()

    def _notify(self) -> None:
        event, self._changed = self._changed, asyncio.Event()
        event.set()

    async def wait(self, condition: Callable[[], bool], timeout: float = 10.0) -> None:
        async def wait() -> None:
            while not condition():
                await self._changed.wait()

        await asyncio.wait_for(wait(), timeout)

    def ups(self) -> int:
        return sum(1 for kind, _ in self.reports if kind == "up")

    async def wait_up(self, times: int = 1) -> None:
        await self.wait(lambda: self.ups() >= times)


@dataclass
class Inbox:
    """A subscriber recording what it was handed; `fail_on` makes it refuse a message id once."""

    messages: list[NormalizedMessage] = field(default_factory=list)
    deletions: list[Deletion] = field(default_factory=list)
    fail_on: set[str] = field(default_factory=set)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def __call__(self, message: NormalizedMessage) -> None:
        if message.id in self.fail_on:
            self.fail_on.discard(message.id)
            raise RuntimeError(f"store unavailable while accepting {message.id}")
        self.messages.append(message)
        self._notify()

    async def deleted(self, deletion: Deletion) -> None:
        self.deletions.append(deletion)
        self._notify()

    def _notify(self) -> None:
        event, self._changed = self._changed, asyncio.Event()
        event.set()

    async def wait(self, condition: Callable[[], bool], timeout: float = 10.0) -> None:
        async def wait() -> None:
            while not condition():
                await self._changed.wait()

        await asyncio.wait_for(wait(), timeout)

    async def wait_count(self, count: int, timeout: float = 10.0) -> list[NormalizedMessage]:
        await self.wait(lambda: len(self.messages) >= count, timeout)
        return self.messages

    @property
    def texts(self) -> list[str]:
        return [m.text for m in self.messages]


@dataclass
class Running:
    connector: SlackConnector
    status: Status
    inbox: Inbox
    task: asyncio.Task[None]

    async def stop(self) -> BaseException | None:
        """Cancel `run` (as the registry does) and close; returns what `run` raised."""
        error: BaseException | None = None
        if not self.task.done():
            self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            try:
                await self.task
            except Exception as exc:
                error = exc
        await self.connector.close()
        return error

    @property
    def events_url(self) -> str:
        assert self.connector.events is not None and self.connector.events.port
        return f"http://127.0.0.1:{self.connector.events.port}/slack/events"


@pytest.fixture
def make_connector(peer: SlackPeer, sqlite_store: SqliteStore) -> Callable[..., SlackConnector]:
    def make(**overrides: Any) -> SlackConnector:
        values: dict[str, Any] = {
            "id": "team",
            "channel": "slack",
            "bot_token": BOT_TOKEN,
            "app_token": APP_TOKEN,
            "api_base": peer.api_base,
            "ping_interval": 0.2,
            **overrides,
        }
        values = {k: v for k, v in values.items() if v is not None}
        config = SlackConfig.model_validate(values)
        connector = create(config, ConnectorContext(sqlite_store, logging.getLogger("test")))
        connector.retry_base = 0.01
        return connector

    return make


@pytest.fixture
async def start(make_connector: Callable[..., SlackConnector]) -> AsyncIterator[Callable[..., Any]]:
    """`await start(**config)` runs a connector with an inbox and waits until it is up."""
    running: list[Running] = []

    async def start_one(inbox: Inbox | None = None, wait: bool = True, **overrides: Any) -> Running:
        connector = make_connector(**overrides)
        status = Status()
        inbox = inbox if inbox is not None else Inbox()
        connector.subscribe(inbox)
        connector.on_delete(inbox.deleted)
        task = asyncio.create_task(connector.run(status))
        handle = Running(connector, status, inbox, task)
        running.append(handle)
        if wait:
            up = asyncio.create_task(status.wait_up())
            await asyncio.wait({up, task}, return_when=asyncio.FIRST_COMPLETED)
            if task.done():
                up.cancel()
                task.result()
            await up
        return handle

    yield start_one
    for handle in running:
        await handle.stop()
