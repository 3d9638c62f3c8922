"""Dovecot + aiosmtpd peers, and email connectors pointed at them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from email.message import EmailMessage
from email.utils import make_msgid
from typing import Any

import pytest

from talkbridge.connectors.base import ConnectorContext
from talkbridge.connectors.email.config import EmailConfig
from talkbridge.connectors.email.transport import EmailConnector, create
from talkbridge.message import NormalizedMessage
from talkbridge.store import SqliteStore
from tests.conftest import require
from tests.peers.email import DovecotPeer, SmtpPeer, dovecot_available

USERS = {"help": "imap-pw-help", "other": "imap-pw-other"}
SMTP_USERS = {"help": "smtp-pw-help", "other": "smtp-pw-other"}


@pytest.fixture
async def dovecot() -> AsyncIterator[DovecotPeer]:
    require(dovecot_available(), "dovecot is not installed (apt-get install dovecot-imapd)")
    async with DovecotPeer(USERS) as peer:
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


class Status:
    def __init__(self) -> None:
        self.reports: list[tuple[str, str]] = []

    def up(self) -> None:
        self.reports.append(("up", ""))

    def degraded(self, reason: str) -> None:
        self.reports.append(("degraded", reason))


@dataclass
class Inbox:
    messages: list[NormalizedMessage] = field(default_factory=list)
    fail_on: set[str] = field(default_factory=set)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def __call__(self, message: NormalizedMessage) -> None:
        if message.text in self.fail_on:
            self.fail_on.discard(message.text)
            raise RuntimeError("store unavailable")
        self.messages.append(message)
        event, self._changed = self._changed, asyncio.Event()
        event.set()

    async def wait_count(self, count: int, timeout: float = 15.0) -> list[NormalizedMessage]:
        async def wait() -> None:
            while len(self.messages) < count:
                await self._changed.wait()

        await asyncio.wait_for(wait(), timeout)
        return self.messages


@dataclass
class Running:
    connector: EmailConnector
    status: Status
    inbox: Inbox
    task: asyncio.Task[None]

    async def stop(self) -> BaseException | None:
        if not self.task.done():
            self.task.cancel()
        error: BaseException | None = None
        with contextlib.suppress(asyncio.CancelledError):
            try:
                await self.task
            except Exception as exc:
                error = exc
        await self.connector.close()
        return error


async def until(
    condition: Callable[[], bool], changed: Callable[[], Any], timeout: float = 15
) -> None:
    """Wait for `condition`, re-checking whenever `changed()` (an awaitable factory) fires."""

    async def wait() -> None:
        while not condition():
            await changed()

    await asyncio.wait_for(wait(), timeout)


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
) -> AsyncIterator[Callable[..., Any]]:
    """`await start(**config)` runs a connector and waits until it reported up."""
    running: list[Running] = []

    async def start_one(inbox: Inbox | None = None, **overrides: Any) -> Running:
        connector = make_connector(**overrides)
        status = Status()
        inbox = inbox if inbox is not None else Inbox()
        connector.subscribe(inbox)
        task = asyncio.create_task(connector.run(status))
        handle = Running(connector, status, inbox, task)
        running.append(handle)
        return handle

    yield start_one
    for handle in running:
        await handle.stop()
