"""discord.py's exceptions -> talkbridge's, at the boundary, with the bot token scrubbed.

Given the client's `Answers` (see `answers.py`), an error names the request it is about: the
server error discord.py gave up retrying, or the answer whose JSON it could not read.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal, NoReturn

import aiohttp

from talkbridge.connectors.boundary import not_the_api, scrub
from talkbridge.connectors.discord.answers import Answers
from talkbridge.connectors.discord.ratelimit import GlobalLimit
from talkbridge.connectors.discord.sdk import discord
from talkbridge.errors import (
    ConnectorError,
    NotFoundError,
    PermanentError,
    RateLimitedError,
    TransientError,
    UnauthorizedError,
)

UNAUTHORIZED = (
    "Discord rejected the bot token (401 Unauthorized): it is wrong or was reset; "
    "copy the current one from the Developer Portal (Bot > Reset Token)"
)
PRIVILEGED_INTENTS = (
    "Discord refused the gateway intents (close code 4014): enable the Message Content intent "
    "(and Server Members, if configured) in the Developer Portal under Bot > Privileged Gateway "
    "Intents, or turn them off in this connection's intents"
)

_FATAL_CLOSES = {
    4010: "Invalid shard: Discord refused the shard this connection asked for",
    4011: (
        "Sharding required: the bot is in too many servers for one gateway connection, and "
        "talkbridge opens one per bot"
    ),
    4012: (
        "Invalid API version: the gateway does not speak the version discord.py asks for; is "
        "gateway_url Discord's gateway, and discord.py up to date?"
    ),
    4013: (
        "Invalid intents: Discord could not read the intents discord.py sent; is discord.py "
        "up to date?"
    ),
}
"""Close codes Discord documents as "do not reconnect", in plain words (4004 and 4014 apart)."""


def translate(
    exc: BaseException,
    token: str,
    *,
    scope: Literal["connection", "thread"] = "connection",
    answers: Answers | None = None,
    limit: GlobalLimit | None = None,
) -> ConnectorError:
    """The talkbridge error for a discord.py / aiohttp failure (returned, not raised).

    A `RateLimited` has `scope`, unless `limit` saw a global 429 still in force: then the whole
    connection waits (see `ratelimit.py`).
    """
    message = scrub(str(exc), token)
    if isinstance(exc, discord.RateLimited):
        wait = float(exc.retry_after)
        if limit is not None and limit.left() > 0:
            limit.hit(wait)  # the body's wait, to the millisecond
            wait = limit.left()
            return RateLimitedError(
                f"Discord global rate limit: retry after {wait:.2f} s",
                retry_after=wait,
                scope="connection",
            )
        return RateLimitedError(
            f"Discord rate limit: retry after {wait:.2f} s", retry_after=wait, scope=scope
        )
    if isinstance(exc, discord.LoginFailure):
        return UnauthorizedError(UNAUTHORIZED)
    if isinstance(exc, discord.PrivilegedIntentsRequired):
        return PermanentError(PRIVILEGED_INTENTS)
    if isinstance(exc, discord.ConnectionClosed):
        if exc.code == 4004:
            return UnauthorizedError(
                "Discord's gateway rejected the bot token (close code 4004 Authentication "
                "failed): it is wrong or was reset; copy the current one from the Developer "
                "Portal (Bot > Reset Token)"
            )
        if exc.code in _FATAL_CLOSES:
            return PermanentError(
                f"the Discord gateway closed the connection for good (close code {exc.code} "
                f"{_FATAL_CLOSES[exc.code]})"
            )
        return TransientError(f"the Discord gateway closed the connection: {message}")
    if isinstance(exc, discord.NotFound):
        return NotFoundError(f"Discord: {message}")
    if isinstance(exc, discord.DiscordServerError):
        named = answers.describe_server_error() if answers is not None else None
        if named is not None:
            return TransientError(named)
        return TransientError(f"Discord server error: {message}")
    if isinstance(exc, discord.HTTPException):
        if exc.status == 401:
            return UnauthorizedError(UNAUTHORIZED)
        if exc.status == 429:  # refused outside the bucket logic (e.g. by Cloudflare)
            wait = _retry_after(exc)
            return RateLimitedError(f"Discord: {message}", retry_after=wait, scope="connection")
        return PermanentError(f"Discord: {message}")
    if isinstance(exc, UnicodeDecodeError | KeyError):
        unreadable = answers.unreadable(exc) if answers is not None else None
        return unreadable or not_the_api("Discord", exc)
    if isinstance(exc, discord.GatewayNotFound):
        return TransientError("the Discord gateway could not be found")
    if isinstance(exc, aiohttp.ClientError | asyncio.TimeoutError | OSError):
        return TransientError(f"{type(exc).__name__}: {message}" if message else type(exc).__name__)
    return PermanentError(f"{type(exc).__name__}: {message}")


def unreadable_event(exc: Exception, token: str) -> TransientError:
    """An event from the gateway that discord.py's parser failed on (a field missing or of
    another type): discord.py's `connect` does not survive it, so the session ends, and the next
    run identifies afresh: Discord does not send a new session what it sent the old one (the
    transport fetches it over REST instead, for the channels it remembers)."""
    detail = scrub(f"{type(exc).__name__}: {exc}", token)
    return TransientError(
        f"discord.py could not read an event from the Discord gateway ({detail}), which ends "
        "the session: what Discord sends until a new one starts is fetched over REST then, "
        "for the channels the bot delivered from recently; is gateway_url "
        "Discord's gateway, and discord.py up to date?"
    )


def _retry_after(exc: discord.HTTPException) -> float:
    """The answer's `Retry-After` seconds; a minute when it has none (Cloudflare's bans)."""
    headers = getattr(exc.response, "headers", None) or {}
    try:
        return max(0.0, float(headers.get("Retry-After", "")))
    except (TypeError, ValueError):
        return 60.0


_HANDLED = (
    discord.DiscordException,
    aiohttp.ClientError,
    asyncio.TimeoutError,
    OSError,
    UnicodeDecodeError,
    KeyError,  # a payload without a field every answer has
)


_SHAPE = (TypeError, ValueError, AttributeError)
"""What discord.py raises reading JSON of the wrong shape into its models, besides KeyError."""


@contextmanager
def translated(
    token: str,
    *,
    scope: Literal["connection", "thread"] = "connection",
    answers: Answers | None = None,
    limit: GlobalLimit | None = None,
) -> Iterator[None]:
    """Run a Discord call; what discord.py or aiohttp raises leaves as a talkbridge error.

    With `answers` (the client's, for calls made one at a time), an error names its request,
    and a TypeError, ValueError or AttributeError raised while an answer is being read (none
    started since) is that answer's wrong shape, not a crash. With `limit`, a REST call made
    while the bot is globally rate limited is not made: it fails at once, for the connection.
    """
    left = limit.left() if limit is not None else 0.0
    if left > 0:
        raise RateLimitedError(
            f"Discord global rate limit: retry after {left:.2f} s",
            retry_after=left,
            scope="connection",
        )
    if answers is not None:
        answers.forget()
    try:
        yield
    except _HANDLED as exc:
        _raise(translate(exc, token, scope=scope, answers=answers, limit=limit))
    except _SHAPE as exc:
        unreadable = answers.unreadable(exc) if answers is not None else None
        if unreadable is None:
            raise
        _raise(unreadable)


def _raise(error: ConnectorError) -> NoReturn:
    raise error from None
