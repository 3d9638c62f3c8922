"""aiogram's HTTP session, reading the error answers it cannot read by itself.

The Bot API documents an answer's `description` as optional, and proxies and self-hosted Bot API
servers do leave it out. aiogram then fails on its own code (`"restart" in None`, a TypeError,
for any 5xx, which no error translation expects) or says "Telegram server says - None". Such an
answer is given words here, before aiogram reads it, so it classifies as any other answer.
"""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import TYPE_CHECKING

from aiogram.client.session.aiohttp import AiohttpSession
from aiogram.methods import Response, TelegramMethod
from aiogram.methods.base import TelegramType

from talkbridge.connectors.telegram.errors import scrub
from talkbridge.errors import TransientError

if TYPE_CHECKING:
    from aiogram import Bot


def described(status: int, content: str) -> tuple[str, str | None]:
    """`content` to hand aiogram: as it came, or (an error answer without words of its own)
    with a `description` naming the HTTP status and `error_code`. And the description of an
    `ok: false` that came with a success status, else None."""
    succeeded = HTTPStatus.OK <= status <= HTTPStatus.IM_USED
    if succeeded and content.startswith('{"ok":true'):
        return content, None  # Telegram's own success: not read twice
    try:
        data = json.loads(content)
    except ValueError:
        return content, None  # aiogram says it is not JSON
    if not isinstance(data, dict) or (succeeded and data.get("ok") is not False):
        return content, None
    said = data.get("description")
    if not (isinstance(said, str) and said.strip()):
        code = data.get("error_code")
        extra = f", error_code {code}" if code not in (None, status) else ""
        said = data["description"] = f"HTTP {status} with no description{extra}"
        content = json.dumps(data)
    return content, said if succeeded else None


class Session(AiohttpSession):
    """`AiohttpSession` that reads every error answer (see the module)."""

    def check_response(
        self,
        bot: Bot,
        method: TelegramMethod[TelegramType],
        status_code: int,
        content: str,
    ) -> Response[TelegramType]:
        content, refused = described(status_code, content)
        if refused is not None:
            # aiogram raises its base error, read as a refusal for good (polling would stop);
            # nothing says the request is wrong, and Telegram never answers so: a proxy does.
            raise TransientError(
                f"the Bot API answered ok: false with HTTP {status_code} "
                f"({scrub(refused, bot.token)}); Telegram answers errors with an error status: "
                "is a proxy in between, or api_base not a Bot API server?"
            )
        return super().check_response(bot, method, status_code, content)
