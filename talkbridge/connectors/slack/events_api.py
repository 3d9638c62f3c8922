"""The Events API over HTTP: Slack POSTs signed requests to a URL this server answers.

Every request is checked before anything else: `X-Slack-Signature` must be the HMAC-SHA256 of
`v0:{X-Slack-Request-Timestamp}:{body}` under the signing secret (slack-sdk's
`SignatureVerifier`), the timestamp within five minutes, and the signature not seen before (a
captured request replayed inside the window is refused too). `url_verification` is answered
with its challenge. An event is answered 200 only once the router accepted it; otherwise 500,
its signature is forgotten, and Slack retries (`X-Slack-Retry-Num`), which the dedupe in the
connector absorbs.
"""

from __future__ import annotations

import hmac
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs

from aiohttp import web
from slack_sdk.signature import SignatureVerifier

from talkbridge.connectors.inbound_http import READ_TIMEOUT, app_runner, read_body, too_slow

WINDOW = 5 * 60
"""Seconds a signed request stays valid (Slack's rule)."""

Handle = Callable[[dict[str, Any], int], Awaitable[None]]


class RequestCheck:
    """Signature, freshness and replay checks; returns why a request is refused, or None."""

    def __init__(self, signing_secret: str, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._verifier = SignatureVerifier(signing_secret)
        self._seen: OrderedDict[str, float] = OrderedDict()
        """Signatures accepted, each with the time its timestamp leaves the window."""

    def refuse(self, body: bytes, timestamp: str | None, signature: str | None) -> str | None:
        if not timestamp or not signature:
            return "missing X-Slack-Request-Timestamp or X-Slack-Signature"
        try:
            sent = int(timestamp)
        except ValueError:
            return "X-Slack-Request-Timestamp is not a number"
        now = self._clock()
        if abs(now - sent) > WINDOW:
            return "stale request: timestamp outside the five-minute window"
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            return "body is not UTF-8, so it cannot be a signed Slack request"
        expected = self._verifier.generate_signature(timestamp=timestamp, body=text)
        # As bytes: `compare_digest` raises on a str with a non-ASCII character, and a header
        # byte that is not UTF-8 arrives as a lone surrogate (a 500 and a traceback for anyone).
        given = signature.encode("utf-8", "surrogateescape")
        if expected is None or not hmac.compare_digest(expected.encode(), given):
            return "bad signature"
        while self._seen and next(iter(self._seen.values())) < now:
            self._seen.popitem(last=False)
        if signature in self._seen:
            return "replayed request: this signature was already used"
        # Kept until its own timestamp leaves the window, not five minutes after it came: one
        # signed by a clock ahead of ours stays valid that much longer, and was replayable then.
        self._seen[signature] = sent + WINDOW
        return None

    def forget(self, signature: str | None) -> None:
        """A request that was not accepted may come again: Slack's retry is the same body, and
        one signed within the same second carries the same signature, which is no replay."""
        if signature is not None:
            self._seen.pop(signature, None)


class EventsServer:
    """An aiohttp server for one connection's Request URL (events and interactivity)."""

    def __init__(
        self,
        check: RequestCheck,
        handle: Handle,
        *,
        host: str,
        port: int,
        path: str,
        logger: logging.Logger,
        read_timeout: float = READ_TIMEOUT,
    ) -> None:
        self._check = check
        self._read_timeout = read_timeout
        self._handle = handle
        self._host = host
        self._port = port
        self._path = path
        self._log = logger
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    async def start(self) -> None:
        app = web.Application(client_max_size=1024 * 1024)
        app.router.add_post(self._path, self._on_request)
        self._runner = app_runner(app, self._read_timeout)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port)
        await site.start()
        for address in self._runner.addresses:
            if isinstance(address, tuple) and len(address) >= 2:
                self.port = int(address[1])
                break

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _on_request(self, request: web.Request) -> web.Response:
        body = await read_body(request, self._read_timeout)
        if body is None:
            self._log.warning("refused a request from %s: its body came too slowly", request.remote)
            return too_slow()
        signature = request.headers.get("X-Slack-Signature")
        refused = self._check.refuse(
            body, request.headers.get("X-Slack-Request-Timestamp"), signature
        )
        if refused is not None:
            self._log.warning("refused a request from %s: %s", request.remote, refused)
            return web.Response(status=401, text=refused)
        payload = _parse(body, request.content_type)
        if payload is None:
            return web.Response(status=400, text="body is neither JSON nor a form with payload")
        if payload.get("type") == "url_verification":
            return web.json_response({"challenge": payload.get("challenge", "")})
        try:
            retry = int(request.headers.get("X-Slack-Retry-Num", "0"))
        except ValueError:
            retry = 0
        try:
            await self._handle(payload, retry)
        except Exception as exc:
            self._log.warning("event not accepted yet (Slack will retry): %s", exc)
            self._check.forget(signature)
            return web.Response(status=500, text="not accepted, retry later")
        return web.Response(status=200)


def _parse(body: bytes, content_type: str) -> dict[str, Any] | None:
    try:
        if content_type == "application/x-www-form-urlencoded":
            form = parse_qs(body.decode(), keep_blank_values=True)
            if "payload" in form:  # interactivity: the JSON rides in a form field
                value = json.loads(form["payload"][0])
            else:  # slash commands: acknowledged, not handled
                value = {"type": "slash_command", **{k: v[0] for k, v in form.items()}}
        else:
            value = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    return value if isinstance(value, dict) else None
