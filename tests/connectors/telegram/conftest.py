"""A Bot API peer, and connectors pointed at it, for the Telegram transport tests."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from talkbridge.connectors.base import ConnectorContext
from talkbridge.connectors.telegram.config import TelegramConfig
from talkbridge.connectors.telegram.transport import TelegramConnector, create
from talkbridge.message import NormalizedMessage
from talkbridge.store import SqliteStore
from tests.peers.telegram import TelegramBotAPIPeer

TOKEN = "123456:TEST-token_abc"


@pytest.fixture
async def peer() -> AsyncIterator[TelegramBotAPIPeer]:
    async with TelegramBotAPIPeer([TOKEN]) as running:
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

    async def wait_up(self, times: int = 1) -> None:
        await self.wait(lambda: sum(1 for kind, _ in self.reports if kind == "up") >= times)


@dataclass
class Inbox:
    """A subscriber that records what it was handed; `fail_on` makes it refuse a message id."""

    messages: list[NormalizedMessage] = field(default_factory=list)
    fail_on: set[str] = field(default_factory=set)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def __call__(self, message: NormalizedMessage) -> None:
        if message.id in self.fail_on:
            self.fail_on.discard(message.id)
            raise RuntimeError(f"store unavailable while accepting {message.id}")
        self.messages.append(message)
        event, self._changed = self._changed, asyncio.Event()
        event.set()

    async def wait_count(self, count: int, timeout: float = 10.0) -> list[NormalizedMessage]:
        async def wait() -> None:
            while len(self.messages) < count:
                await self._changed.wait()

        await asyncio.wait_for(wait(), timeout)
        return self.messages

    @property
    def texts(self) -> list[str]:
        return [m.text for m in self.messages]


@dataclass
class Running:
    connector: TelegramConnector
    status: Status
    inbox: Inbox
    task: asyncio.Task[None]

    async def stop(self) -> BaseException | None:
        """Cancel `run` (as the registry does) and close; returns what `run` raised, if anything."""
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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture
def make_connector(
    peer: TelegramBotAPIPeer, sqlite_store: SqliteStore
) -> Callable[..., TelegramConnector]:
    def make(**overrides: Any) -> TelegramConnector:
        values: dict[str, Any] = {
            "id": "tg",
            "channel": "telegram",
            "token": TOKEN,
            "api_base": peer.base_url,
            "poll_timeout": 5,
            **overrides,
        }
        config = TelegramConfig.model_validate(values)
        connector = create(config, ConnectorContext(sqlite_store, logging.getLogger("test")))
        connector.retry_base = 0.01
        return connector

    return make


@pytest.fixture
async def start(
    make_connector: Callable[..., TelegramConnector],
) -> AsyncIterator[Callable[..., Any]]:
    """`await start(**config)` runs a connector with an inbox and waits until it is up."""
    running: list[Running] = []

    async def start_one(inbox: Inbox | None = None, wait: bool = True, **overrides: Any) -> Running:
        connector = make_connector(**overrides)
        status = Status()
        inbox = inbox if inbox is not None else Inbox()
        connector.subscribe(inbox)
        task = asyncio.create_task(connector.run(status))
        handle = Running(connector, status, inbox, task)
        running.append(handle)
        if wait:
            up = asyncio.create_task(status.wait_up())
            await asyncio.wait({up, task}, return_when=asyncio.FIRST_COMPLETED)
            if task.done():
                up.cancel()
                task.result()  # raises what run raised
            await up
        return handle

    yield start_one
    for handle in running:
        await handle.stop()
