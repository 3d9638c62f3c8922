"""slack-sdk's exceptions -> talkbridge's, at the boundary, with every token scrubbed.

Slack answers most failures with HTTP 200 and `{"ok": false, "error": "<code>"}`; the code
decides the class. A 429 carries `Retry-After` and is a `RateLimitedError` for the whole
connection (Slack's limits are per method and workspace); the transport narrows it to the
thread for chat.postMessage, which Slack limits per channel first (`ratelimit.py`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import aiohttp
from slack_sdk.errors import SlackApiError, SlackClientError, SlackRequestError

from talkbridge.connectors.boundary import not_the_api, scrub
from talkbridge.errors import (
    ConnectorError,
    NotFoundError,
    PermanentError,
    RateLimitedError,
    TransientError,
    UnauthorizedError,
)

UNAUTHORIZED_CODES = {
    "invalid_auth",
    "not_authed",
    "account_inactive",
    "token_revoked",
    "token_expired",
    "no_permission",
    "org_login_required",
    "ekm_access_denied",
    "team_access_not_granted",
}
NOT_FOUND_CODES = {
    "channel_not_found",
    "message_not_found",
    "thread_not_found",
    "user_not_found",
    "users_not_found",
    "file_not_found",
    "file_deleted",
}
TRANSIENT_CODES = {
    "internal_error",
    "fatal_error",
    "service_unavailable",
    "request_timeout",
    "ratelimited",
}
DEFAULT_RETRY_AFTER = 1.0


def error_code(exc: SlackApiError) -> str:
    data = getattr(exc.response, "data", None)
    if isinstance(data, dict):
        return str(data.get("error") or "")
    return ""


def retry_after(exc: SlackApiError) -> float:
    headers = getattr(exc.response, "headers", None) or {}
    value = None
    for key in ("Retry-After", "retry-after"):
        if key in headers:
            value = headers[key]
            break
    try:
        return max(0.0, float(value)) if value is not None else DEFAULT_RETRY_AFTER
    except (TypeError, ValueError):
        return DEFAULT_RETRY_AFTER


def missing_scope(exc: SlackApiError, *, app_token: bool) -> str:
    """The scope Slack names in `needed` and where an admin adds it: an app-level token's
    scopes are set when it is generated, a bot token's in OAuth & Permissions (then the app is
    reinstalled for them to take effect)."""
    data = getattr(exc.response, "data", None)
    needed = data.get("needed") if isinstance(data, dict) else None
    scope = f"the scope {needed}" if isinstance(needed, str) and needed else "a scope"
    if app_token:
        return (
            f"the app token lacks {scope}: generate one with it in the app's settings under "
            "Basic Information > App-Level Tokens, and use that token"
        )
    return (
        f"the bot token lacks {scope}: add it in the app's settings under OAuth & Permissions "
        "> Bot Token Scopes, then reinstall the app to the workspace"
    )


def unauthorized(code: str, what: str = "bot token") -> UnauthorizedError:
    return UnauthorizedError(
        f"Slack rejected the {what} ({code}): it is wrong, was revoked or the app was "
        "uninstalled; reinstall the app and copy the new token"
    )


def translate(exc: BaseException, secrets: Iterable[str], *, method: str = "") -> ConnectorError:
    """The talkbridge error for a slack-sdk/aiohttp failure (returned, not raised)."""
    where = f"{method}: " if method else ""
    if isinstance(exc, SlackApiError):
        code = error_code(exc)
        status = getattr(exc.response, "status_code", 0) or 0
        if status == 429 or code == "ratelimited":
            wait = retry_after(exc)
            return RateLimitedError(
                f"{where}Slack rate limit: retry after {wait:g} s", retry_after=wait
            )
        if code in UNAUTHORIZED_CODES or status == 401:
            return unauthorized(
                code or f"HTTP {status}", "app token" if method.startswith("apps.") else "bot token"
            )
        if status == 404 and not code:  # no Slack error code: the address is not the API's
            return NotFoundError(
                f"{where}HTTP 404, no such API method there: check api_base, which ends in "
                "/api/ (https://slack.com/api/)"
            )
        if code in NOT_FOUND_CODES or status == 404:
            return NotFoundError(f"{where}{code or 'not found'}")
        if code in TRANSIENT_CODES or status >= 500:
            return TransientError(f"{where}{code or f'HTTP {status}'} from Slack")
        if code == "missing_scope":
            lacking = missing_scope(exc, app_token=method.startswith("apps."))
            return PermanentError(f"{where}Slack refused the call: {code} ({lacking})")
        if code:
            return PermanentError(f"{where}Slack refused the call: {code}")
        return TransientError(f"{where}Slack answered HTTP {status} without a usable body")
    if isinstance(exc, UnicodeDecodeError):
        return not_the_api(f"{where}Slack", exc)
    if isinstance(exc, SlackRequestError):
        return TransientError(f"{where}{scrub(str(exc), *secrets)}")
    if isinstance(exc, aiohttp.ClientError | asyncio.TimeoutError | OSError):
        message = scrub(str(exc), *secrets)
        return TransientError(
            f"{where}{type(exc).__name__}: {message}" if message else where + type(exc).__name__
        )
    if isinstance(exc, SlackClientError):
        return PermanentError(f"{where}{scrub(str(exc), *secrets)}")
    return PermanentError(f"{where}{type(exc).__name__}: {scrub(str(exc), *secrets)}")


HANDLED = (SlackClientError, aiohttp.ClientError, asyncio.TimeoutError, OSError, UnicodeDecodeError)
