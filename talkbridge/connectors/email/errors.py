"""aioimaplib / aiosmtplib failures -> talkbridge's errors, at the boundary, never quoting a secret.

Both SDKs keep passwords out of their messages; we still scrub them, and never chain the
original exception, so a password cannot reach a log through a traceback either.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterator
from contextlib import contextmanager

import aiosmtplib
from aioimaplib import aioimaplib as imap  # type: ignore[import-untyped]

from talkbridge.connectors.boundary import scrub
from talkbridge.errors import (
    ConnectorError,
    NotFoundError,
    PermanentError,
    TransientError,
    UnauthorizedError,
)


def _describe(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _tls_failure(exc: BaseException) -> bool:
    """True when TLS failed, even wrapped (aiosmtplib raises SMTPConnectError from the
    SSLError): a certificate the bridge does not trust is not worth retrying."""
    seen: BaseException | None = exc
    for _ in range(5):
        if seen is None:
            return False
        if isinstance(seen, ssl.SSLError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def translate_imap(exc: BaseException, where: str, *secrets: str | None) -> ConnectorError:
    if isinstance(exc, ConnectorError):
        return exc
    detail = scrub(_describe(exc), *secrets)
    if _tls_failure(exc):
        return PermanentError(f"TLS with the IMAP server {where} failed: {detail}")
    if isinstance(exc, ConnectionRefusedError):
        return TransientError(f"IMAP server {where} refused the connection")
    if isinstance(exc, asyncio.TimeoutError | imap.CommandTimeout):
        return TransientError(f"IMAP server {where} did not answer in time")
    if isinstance(exc, OSError | imap.AioImapException | EOFError):
        return TransientError(f"IMAP connection to {where} failed: {detail}")
    return PermanentError(f"IMAP {where}: {detail}")


def translate_smtp(exc: BaseException, where: str, *secrets: str | None) -> ConnectorError:
    if isinstance(exc, ConnectorError):
        return exc
    detail = scrub(_describe(exc), *secrets)
    if _tls_failure(exc):
        return PermanentError(f"TLS with the SMTP server {where} failed: {detail}")
    if isinstance(exc, aiosmtplib.SMTPAuthenticationError) and 400 <= exc.code < 500:
        # RFC 4954: 454 is a temporary failure (the server's auth backend is down), not a
        # wrong password: retried, and the connection is not stopped over it.
        return TransientError(
            f"SMTP server {where} cannot log in for now ({exc.code} {scrub(exc.message, *secrets)})"
        )
    if isinstance(exc, aiosmtplib.SMTPAuthenticationError):
        return UnauthorizedError(
            f"SMTP server {where} refused the login ({exc.code} {scrub(exc.message, *secrets)})"
        )
    if isinstance(exc, aiosmtplib.SMTPRecipientsRefused):
        refused = ", ".join(f"{r.recipient} ({r.code})" for r in exc.recipients)
        if exc.recipients and all(400 <= r.code < 500 for r in exc.recipients):
            return TransientError(f"SMTP server {where} deferred the recipients: {refused}")
        return NotFoundError(f"SMTP server {where} refused the recipients: {refused}")
    if isinstance(exc, aiosmtplib.SMTPNotSupported):  # what it lacks, it lacks on a retry too
        if "SMTPUTF8" in str(exc):
            return PermanentError(
                f"SMTP server {where} does not offer SMTPUTF8, which an address with letters "
                "beyond ASCII before the @ needs: the mail cannot go out through it"
            )
        return PermanentError(f"SMTP server {where} does not support this: {detail}")
    if isinstance(exc, aiosmtplib.SMTPConnectTimeoutError | aiosmtplib.SMTPTimeoutError):
        return TransientError(f"SMTP server {where} did not answer in time")
    if isinstance(exc, aiosmtplib.SMTPConnectError | aiosmtplib.SMTPServerDisconnected):
        return TransientError(f"SMTP connection to {where} failed: {detail}")
    if isinstance(exc, aiosmtplib.SMTPResponseException):
        reply = f"{exc.code} {scrub(exc.message, *secrets)}"
        if 400 <= exc.code < 500:
            return TransientError(f"SMTP server {where} deferred the mail: {reply}")
        return PermanentError(f"SMTP server {where} refused the mail: {reply}")
    if isinstance(exc, OSError | asyncio.TimeoutError | aiosmtplib.SMTPException):
        return TransientError(f"SMTP {where}: {detail}")
    return PermanentError(f"SMTP {where}: {detail}")


_IMAP_ERRORS = (OSError, asyncio.TimeoutError, imap.AioImapException, EOFError, ssl.SSLError)
_SMTP_ERRORS = (OSError, asyncio.TimeoutError, aiosmtplib.SMTPException, ssl.SSLError)


@contextmanager
def imap_errors(where: str, *secrets: str | None) -> Iterator[None]:
    try:
        yield
    except _IMAP_ERRORS as exc:
        raise translate_imap(exc, where, *secrets) from None


@contextmanager
def smtp_errors(where: str, *secrets: str | None) -> Iterator[None]:
    try:
        yield
    except _SMTP_ERRORS as exc:
        raise translate_smtp(exc, where, *secrets) from None
