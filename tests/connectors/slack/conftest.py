"""A Slack peer, and connectors pointed at it, for the Slack transport tests."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from talkbridge.connectors.base import ConnectorContext
from talkbridge.connectors.slack.config import SlackConfig
from talkbridge.connectors.slack.transport import SlackConnector, create
from talkbridge.store import SqliteStore
from tests.peers.slack import SlackPeer, Workspace
from tests.support import running
from tests.support.running import Inbox

BOT_TOKEN = "xoxb-1-test-bot-token"
APP_TOKEN = "xapp-1-test-app-token"
SIGNING_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"


@pytest.fixture
async def peer() -> AsyncIterator[SlackPeer]:
    async with SlackPeer(Workspace(BOT_TOKEN, app_token=APP_TOKEN)) as peer:
        peer.add_user("U0ADA0001", "Ada Lovelace", display_name="ada")
        peer.add_user("U0GRACE01", "Grace Hopper")
        yield peer


@dataclass
class Running(running.Running[SlackConnector]):
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
async def start(
    make_connector: Callable[..., SlackConnector],
) -> AsyncIterator[running.Starter[SlackConnector]]:
    """`await start(**config)` runs a connector with an inbox and waits until it is up."""

    def attach(connector: SlackConnector, inbox: Inbox) -> None:
        connector.on_delete(inbox.deleted)

    starter = running.Starter(make_connector, running=Running, attach=attach)
    yield starter
    await starter.stop_all()
