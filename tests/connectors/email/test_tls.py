"""Email over TLS, as every real mail server speaks it: Dovecot and aiosmtpd with a certificate
from a private CA, trusted the way an operator trusts one (`SSL_CERT_FILE`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from talkbridge.connectors.base import ConnectorContext
from talkbridge.connectors.email.config import EmailConfig
from talkbridge.connectors.email.transport import EmailConnector, create
from talkbridge.errors import PermanentError
from talkbridge.message import OutboundMessage
from talkbridge.store import SqliteStore
from tests.conftest import require
from tests.connectors.email.conftest import SMTP_USERS, USERS, Inbox, connection, mail
from tests.peers.email import DovecotPeer, SmtpPeer, TlsFiles, dovecot_available
from tests.support import running


@pytest.fixture
def tls(tmp_path: Path) -> TlsFiles:
    return TlsFiles.issue(tmp_path)


@pytest.fixture
async def tls_dovecot(tls: TlsFiles) -> AsyncIterator[DovecotPeer]:
    require(dovecot_available(), "dovecot is not installed (apt-get install dovecot-imapd)")
    async with DovecotPeer(USERS, tls=tls) as peer:
        yield peer


@pytest.fixture
async def tls_smtp(tls: TlsFiles) -> AsyncIterator[SmtpPeer]:
    async with SmtpPeer(users=dict(SMTP_USERS), tls=tls.server_context()) as peer:
        yield peer


def _connector(
    dovecot: DovecotPeer, smtp: SmtpPeer, store: SqliteStore, security: str
) -> EmailConnector:
    implicit = security == "ssl"
    raw: dict[str, Any] = connection(dovecot, smtp)
    raw["imap"].update(security=security, port=dovecot.tls_port if implicit else dovecot.port)
    raw["smtp"].update(security=security, port=smtp.tls_port if implicit else smtp.port)
    return create(EmailConfig.model_validate(raw), ConnectorContext(store, logging.getLogger("t")))


@pytest.mark.parametrize("security", ["ssl", "starttls"])
async def test_mail_comes_in_and_goes_out_over_tls(
    security: str,
    tls: TlsFiles,
    tls_dovecot: DovecotPeer,
    tls_smtp: SmtpPeer,
    sqlite_store: SqliteStore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", str(tls.ca))
    connector = _connector(tls_dovecot, tls_smtp, sqlite_store, security)
    starter = running.Starter(lambda: connector, inbox=Inbox, wait=False)
    try:
        inbox = Inbox()
        await starter(inbox=inbox)
        tls_dovecot.deliver("help", mail(body="over tls", message_id="<t1@example.org>"))
        [message] = await inbox.wait_count(1)
        assert message.text == "over tls"
        result = await connector.send(
            OutboundMessage(thread_id=message.thread_id, text="answered", reply_to=message.id)
        )
        [sent] = tls_smtp.received
        assert sent.login == "help" and sent.message["Message-ID"] == result.message_id
    finally:
        await starter.stop_all()


async def test_an_untrusted_certificate_stops_the_connection_with_a_clear_error(
    tls_dovecot: DovecotPeer,
    tls_smtp: SmtpPeer,
    sqlite_store: SqliteStore,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    # Trust some other CA only: the servers' certificate must be refused, not retried forever.
    monkeypatch.setenv("SSL_CERT_FILE", str(TlsFiles.issue(tmp_path / "other").ca))
    connector = _connector(tls_dovecot, tls_smtp, sqlite_store, "ssl")
    starter = running.Starter(lambda: connector, inbox=Inbox, wait=False)
    try:
        handle = await starter()
        with pytest.raises(
            PermanentError, match=r"TLS with the IMAP server 127\.0\.0\.1:"
        ) as caught:
            await asyncio.wait_for(handle.task, 15)
        assert "certificate verify failed" in str(caught.value)
        assert USERS["help"] not in str(caught.value)
        with pytest.raises(PermanentError, match=r"TLS with the SMTP server 127\.0\.0\.1:"):
            await connector.send(OutboundMessage(thread_id="bob@example.net", text="hi"))
        assert tls_smtp.received == []
    finally:
        await starter.stop_all()
