"""A Discord peer, and connectors pointed at it, for the Discord transport tests."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from talkbridge.connectors.base import ConnectorContext
from talkbridge.connectors.discord.config import DiscordConfig
from talkbridge.connectors.discord.sdk import discord
from talkbridge.connectors.discord.transport import DiscordConnector, create
from talkbridge.message import NormalizedMessage
from talkbridge.store import SqliteStore
from tests.peers.discord import DiscordPeer

TOKEN = "MTIzNDU2Nzg5MDEyMzQ1Njc4.GaBcDe.test-token_abcdefghijklmnopqrstuv"
TOKEN_B = "OTg3NjU0MzIxMDk4NzY1NDMy.HxYzAb.second-token_abcdefghijklmnopq"


@pytest.fixture(autouse=True)
def restore_discord_endpoints() -> Iterator[None]:
    """discord.py's REST base and gateway URL are process-wide: put them back after each test."""
    base = discord.http.Route.BASE
    gateway = discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY
    yield
    discord.http.Route.BASE = base
    discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = gateway


@pytest.fixture
async def peer() -> AsyncIterator[DiscordPeer]:
    async with DiscordPeer({TOKEN: "Bridgebot", TOKEN_B: "Otherbot"}) as running:
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

    def count(self, kind: str) -> int:
        return sum(1 for k, _ in self.reports if k == kind)

    async def wait(self, condition: Callable[[], bool], timeout: float = 10.0) -> None:
        async def wait() -> None:
            while not condition():
                await self._changed.wait()

        await asyncio.wait_for(wait(), timeout)


@dataclass
class Inbox:
    messages: list[NormalizedMessage] = field(default_factory=list)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def __call__(self, message: NormalizedMessage) -> None:
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
    connector: DiscordConnector
    status: Status
    inbox: Inbox
    task: asyncio.Task[None]

    async def stop(self) -> BaseException | None:
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


def connection(peer: DiscordPeer, **overrides: Any) -> dict[str, Any]:
    return {
        "id": "dc",
        "channel": "discord",
        "token": TOKEN,
        "api_base": peer.base_url,
        "gateway_url": peer.gateway_url,
        "guild_ready_timeout": 0.05,
        **overrides,
    }


@pytest.fixture
def make_connector(peer: DiscordPeer, sqlite_store: SqliteStore) -> Callable[..., DiscordConnector]:
    def make(**overrides: Any) -> DiscordConnector:
        config = DiscordConfig.model_validate(connection(peer, **overrides))
        return create(config, ConnectorContext(sqlite_store, logging.getLogger("test")))

    return make


@pytest.fixture
async def start(
    make_connector: Callable[..., DiscordConnector],
) -> AsyncIterator[Callable[..., Any]]:
    """`await start(**config)` runs a connector with an inbox and waits until it is up."""
    running: list[Running] = []

    async def start_one(wait: bool = True, **overrides: Any) -> Running:
        connector = make_connector(**overrides)
        status = Status()
        inbox = Inbox()
        connector.subscribe(inbox)
        task = asyncio.create_task(connector.run(status))
        handle = Running(connector, status, inbox, task)
        running.append(handle)
        if wait:
            up = asyncio.create_task(status.wait(lambda: status.count("up") >= 1))
            await asyncio.wait({up, task}, return_when=asyncio.FIRST_COMPLETED)
            if task.done():
                up.cancel()
                task.result()
            await up
        return handle

    yield start_one
    for handle in running:
        await handle.stop()
