"""A Bot API peer, and connectors pointed at it, for the Telegram transport tests."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from typing import Any

import pytest

from talkbridge.connectors.base import ConnectorContext
from talkbridge.connectors.telegram.config import TelegramConfig
from talkbridge.connectors.telegram.transport import TelegramConnector, create
from talkbridge.store import SqliteStore
from tests.peers.telegram import TelegramBotAPIPeer
from tests.support.running import Starter

TOKEN = "123456:TEST-token_abc"


@pytest.fixture
async def peer() -> AsyncIterator[TelegramBotAPIPeer]:
    async with TelegramBotAPIPeer([TOKEN]) as running:
        yield running


@pytest.fixture
def make_connector(
    peer: TelegramBotAPIPeer, sqlite_store: SqliteStore
) -> Callable[..., TelegramConnector]:
    def make(*, dedupe_for: timedelta = timedelta(days=7), **overrides: Any) -> TelegramConnector:
        """A connector of the config `overrides` change; `dedupe_for` is the retention's."""
        values: dict[str, Any] = {
            "id": "tg",
            "channel": "telegram",
            "token": TOKEN,
            "api_base": peer.base_url,
            "poll_timeout": 5,
            **overrides,
        }
        config = TelegramConfig.model_validate(values)
        context = ConnectorContext(sqlite_store, logging.getLogger("test"), dedupe_for=dedupe_for)
        connector = create(config, context)
        connector.retry_base = 0.01
        return connector

    return make


@pytest.fixture
async def start(
    make_connector: Callable[..., TelegramConnector],
) -> AsyncIterator[Starter[TelegramConnector]]:
    """`await start(**config)` runs a connector with an inbox and waits until it is up."""
    starter = Starter(make_connector)
    yield starter
    await starter.stop_all()


def webhook_on(port: int, secret: str = "s3cret-Token_1") -> dict[str, Any]:
    """The settings of a connection in webhook mode, listening on 127.0.0.1:`port` itself."""
    return {
        "mode": "webhook",
        "webhook_url": f"http://127.0.0.1:{port}/telegram/webhook",
        "webhook_secret": secret,
        "webhook_port": port,
    }
