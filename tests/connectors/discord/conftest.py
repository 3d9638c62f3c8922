"""A Discord peer, and connectors pointed at it, for the Discord transport tests."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from talkbridge.connectors.base import ConnectorContext
from talkbridge.connectors.discord.config import DiscordConfig
from talkbridge.connectors.discord.sdk import discord
from talkbridge.connectors.discord.transport import DiscordConnector, create
from talkbridge.store import SqliteStore
from tests.peers.discord import DiscordPeer
from tests.support.running import Starter

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
) -> AsyncIterator[Starter[DiscordConnector]]:
    """`await start(**config)` runs a connector with an inbox and waits until it is up."""
    starter = Starter(make_connector)
    yield starter
    await starter.stop_all()
