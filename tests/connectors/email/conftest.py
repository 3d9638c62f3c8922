"""Dovecot + aiosmtpd peers, and email connectors pointed at them."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from email.message import EmailMessage
from email.utils import make_msgid
from pathlib import Path
from typing import Any

import pytest

from talkbridge.connectors.base import ConnectorContext
from talkbridge.connectors.email.config import EmailConfig
from talkbridge.connectors.email.transport import EmailConnector, create
from talkbridge.message import NormalizedMessage
from talkbridge.store import SqliteStore
from tests.conftest import require
from tests.peers.email import DovecotPeer, SmtpPeer, dovecot_available
from tests.support import running
from tests.support.bridge import StartBridge, bridges

USERS = {"help": "imap-pw-help", "other": "imap-pw-other"}
SMTP_USERS = {"help": "smtp-pw-help", "other": "smtp-pw-other"}


@pytest.fixture
async def dovecot(request: pytest.FixtureRequest) -> AsyncIterator[DovecotPeer]:
    """Options of `DovecotPeer` by indirect parametrization: `{"sent": "Sent"}`."""
    require(dovecot_available(), "dovecot is not installed (apt-get install dovecot-imapd)")
    async with DovecotPeer(USERS, **getattr(request, "param", {})) as peer:
        yield peer


@pytest.fixture
async def smtp(dovecot: DovecotPeer) -> AsyncIterator[SmtpPeer]:
    peer = SmtpPeer(users=dict(SMTP_USERS))
    for user in USERS:
        peer.route[f"{user}@example.com"] = lambda raw, user=user: dovecot.deliver(user, raw)
    async with peer:
        yield peer


def mail(
    sender: str = "Ada <ada@example.org>",
    to: str = "help@example.com",
    subject: str = "Printer",
    body: str = "hello",
    message_id: str | None = None,
    **headers: str,
) -> bytes:
    msg = EmailMessage()
    msg["From"] = sender
    msg["To"] = to
    msg["Subject"] = subject
    msg["Message-ID"] = message_id or make_msgid(domain="example.org")
    for name, value in headers.items():
        msg[name.replace("_", "-")] = value
    msg.set_content(body)
    return msg.as_bytes()


def connection(
    dovecot: DovecotPeer, smtp: SmtpPeer, user: str = "help", **overrides: Any
) -> dict[str, Any]:
    user = overrides.pop("user", user)
    return {
        "id": user,
        "channel": "email",
        "address": f"{user}@example.com",
        "imap": {
            "host": "127.0.0.1",
            "port": dovecot.port,
            "security": "none",
            "username": user,
            "password": USERS[user],
        },
        "smtp": {
            "host": "127.0.0.1",
            "port": smtp.port,
            "security": "none",
            "username": user,
            "password": SMTP_USERS[user],
        },
        "trusted": ["*@example.org"],
        **overrides,
    }


@dataclass
class Inbox(running.Inbox):
    """Refuses by text: a mail's id is a Message-ID the test may not know."""

    wait_timeout = 15.0  # IMAP IDLE and polling take longer than a bot API

    def refusal_key(self, message: NormalizedMessage) -> str:
        return message.text


@pytest.fixture
async def bridge(
    dovecot: DovecotPeer, smtp: SmtpPeer, tmp_path: Path
) -> AsyncIterator[StartBridge]:
    """The whole Bridge over these peers (`tests.support.bridge`)."""
    async with bridges(tmp_path, lambda c: connection(dovecot, smtp, **c), timeout=15) as start:
        yield start


@pytest.fixture
def make_connector(
    dovecot: DovecotPeer, smtp: SmtpPeer, sqlite_store: SqliteStore
) -> Callable[..., EmailConnector]:
    def make(user: str = "help", **overrides: Any) -> EmailConnector:
        config = EmailConfig.model_validate(connection(dovecot, smtp, user, **overrides))
        return create(config, ConnectorContext(sqlite_store, logging.getLogger("test")))

    return make


@pytest.fixture
async def start(
    make_connector: Callable[..., EmailConnector],
) -> AsyncIterator[running.Starter[EmailConnector]]:
    """`await start(**config)` runs a connector; it does not wait until it is up."""
    starter = running.Starter(make_connector, inbox=Inbox, wait=False)
    yield starter
    await starter.stop_all()
