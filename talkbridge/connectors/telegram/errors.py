"""aiogram's exceptions -> talkbridge's, at the boundary, with the bot token scrubbed.

aiogram builds request URLs with the token in them (`/bot{token}/...`), and network errors may
quote the URL; every message is scrubbed, and the original is not chained, so the token cannot
reach a log through a traceback either.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

import aiohttp
from aiogram import exceptions as tg

from talkbridge.connectors import boundary
from talkbridge.errors import (
    ConnectorError,
    NotFoundError,
    PermanentError,
    RateLimitedError,
    TransientError,
    UnauthorizedError,
)

UNAUTHORIZED = (
    "Telegram rejected the bot token (401 Unauthorized): it is wrong or was revoked; "
    "create a new one with @BotFather"
)


class PollConflictError(TransientError):
    """A 409 to getUpdates: another process polls with this token (each new poll ends the
    other's), or a webhook is set. Transient, as the other may stop; see `_run_polling`."""


class WebhookConflictError(PollConflictError):
    """getUpdates refused while a webhook is set for the bot (by another deployment, or by
    hand): Telegram sends every update there. Transient: whoever set it may delete it."""


def webhook_conflict(url: str = "") -> WebhookConflictError:
    """What to say when polling meets a webhook set elsewhere (`url`: the scrubbed URL, when
    known): what is wrong, and the three ways out."""
    where = f" ({url})" if url else ""
    return WebhookConflictError(
        "Telegram refuses getUpdates (409 Conflict) while a webhook is set for this "
        f"bot{where}: its updates go there, not to this bridge. Delete that webhook (the Bot "
        "API's deleteWebhook) if nothing uses it, set `mode: webhook` on this connection to "
        "take the updates by webhook instead, or set `delete_webhook: true` to have polling "
        "delete it"
    )


def scrub(text: str, token: str) -> str:
    """`text` without the token, nor its secret part (what follows the bot id and `:`)."""
    return boundary.scrub(text, token, token.partition(":")[2])


def translate(exc: BaseException, token: str, *, chat_scoped: bool = False) -> ConnectorError:
    """The talkbridge error for an aiogram/aiohttp failure (not raised: returned)."""
    message = scrub(str(exc), token)
    if isinstance(exc, tg.TelegramRetryAfter):
        # aiogram wraps Telegram's words in lines of its own and a link to its FAQ; one line
        # reads better in `check`, `/healthz` and a log.
        said = exc.message.partition("Original description: ")[2] or "Too Many Requests"
        return RateLimitedError(
            f"Telegram rate limit: retry after {exc.retry_after} s ({scrub(said, token)})",
            retry_after=float(exc.retry_after),
            scope="thread" if chat_scoped else "connection",
        )
    if isinstance(exc, tg.TelegramUnauthorizedError):
        return UnauthorizedError(UNAUTHORIZED)
    if isinstance(exc, tg.TelegramNotFound):
        return NotFoundError(message)
    if isinstance(exc, tg.TelegramEntityTooLarge):
        return PermanentError(f"file too large for Telegram: {message}")
    if isinstance(exc, tg.TelegramNetworkError):
        # aiogram's "HTTP Client says - ClientConnectorDNSError: Cannot connect to host ..."
        reason = message.removeprefix("HTTP Client says - ")
        return TransientError(f"cannot reach the Telegram Bot API: {reason}")
    if isinstance(exc, tg.TelegramServerError):
        return TransientError(message)
    if isinstance(exc, tg.TelegramConflictError):
        if "webhook" in exc.message.lower():
            return webhook_conflict()
        return PollConflictError(
            f"{message} (another process is polling with this token: run one bridge per bot)"
        )
    if isinstance(exc, tg.TelegramMigrateToChat):
        return PermanentError(message)
    if isinstance(exc, tg.TelegramBadRequest):
        if "not found" in exc.message.lower():
            return NotFoundError(message)
        return PermanentError(message)
    if isinstance(exc, tg.TelegramAPIError):  # 403 Forbidden (blocked, kicked) and the rest
        return PermanentError(message)
    if isinstance(exc, tg.ClientDecodeError):
        if isinstance(exc.data, str):  # the body was not JSON at all
            page = scrub(" ".join(exc.data.split())[:80], token)
            said = f"something that is not JSON (a proxy's error page?): {page}"
            if not page:  # a proxy's bare 404 (a wrong api_base)
                said = "with an empty body, not JSON (a proxy's error page, a wrong api_base?)"
            return TransientError(f"the Bot API answered {said}")
        return TransientError(f"the Bot API's answer did not fit aiogram's models: {exc.message}")
    if isinstance(exc, UnicodeDecodeError):
        return boundary.not_the_api("the Bot API", exc)
    if isinstance(exc, aiohttp.ClientResponseError):
        if exc.status == 404:
            return NotFoundError(f"Telegram answered 404 for {exc.request_info.method} request")
        if exc.status == 401:
            return UnauthorizedError(UNAUTHORIZED)
        return TransientError(f"HTTP {exc.status} from the Bot API")
    if isinstance(exc, aiohttp.ClientError | asyncio.TimeoutError | OSError):
        return TransientError(f"{type(exc).__name__}: {message}" if message else type(exc).__name__)
    return PermanentError(f"{type(exc).__name__}: {message}")


_HANDLED = (tg.AiogramError, aiohttp.ClientError, asyncio.TimeoutError, OSError, UnicodeDecodeError)


@contextmanager
def translated(token: str, *, chat_scoped: bool = False) -> Iterator[None]:
    """Run a Bot API call; anything aiogram or aiohttp raises leaves as a talkbridge error."""
    try:
        yield
    except _HANDLED as exc:
        _raise(translate(exc, token, chat_scoped=chat_scoped))


def _raise(error: ConnectorError) -> NoReturn:
    raise error from None
