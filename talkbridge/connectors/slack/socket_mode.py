"""Socket Mode on slack-sdk's aiohttp `SocketModeClient`, with the reconnect policy kept here.

The SDK client moves frames, pings, and parses envelopes. When it notices a socket is gone (a
close frame, a failed ping) or Slack sends a `disconnect` message, it asks for a new endpoint;
`_Client` turns that request into a signal instead, and `SocketSession.run` reconnects: the old
socket is closed before a new URL is opened (never two sockets for one connection), a planned
`disconnect` (`warning`, `refresh_requested`) reconnects at once, and lost sockets back off
exponentially. Any other `disconnect` reason would be given again to a socket opened at once:
`link_disabled` (Socket Mode switched off for the app), `too_many_websockets` (another
deployment on the same app token). It ends the run with a `TransientError` saying what it means,
and the registry retries with its own (growing) backoff. A rejected app token raises
`UnauthorizedError`, so the registry marks the connection down instead of retrying.

A socket's hello proves little: a Slack host that greets and closes at once (or asks for a new
socket at once, again and again) would otherwise be reconnected to in a tight loop. The backoff
starts from the beginning again only after a socket has proved itself: it brought an envelope,
or stayed open for `STABLE_AFTER` seconds. Until then each reconnect waits longer, the planned
ones too (except the first).

Envelopes are taken in arrival order, and each is acknowledged once the bridge has it (stored
by the router), before its turn runs: an envelope acknowledged earlier would be lost if the
bridge stopped before storing it, since Slack does not deliver an acknowledged envelope again.
One the bridge could not take (the store is down, the bridge is stopping) is not acknowledged,
so Slack delivers it again, on this socket or the next; dedupe drops what was taken twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from slack_sdk.socket_mode.aiohttp import SocketModeClient
from slack_sdk.socket_mode.async_client import AsyncBaseSocketModeClient
from slack_sdk.web.async_client import AsyncWebClient

from talkbridge.backoff import STABLE_AFTER, Backoff
from talkbridge.connectors.base import ConnectionStatus
from talkbridge.errors import ConnectorError, RateLimitedError, TransientError

PLANNED = {"warning", "refresh_requested"}
"""`disconnect` reasons of Slack's own upkeep (a host going away, a socket's age): the next
socket is welcome at once. Any other reason would be given again to a socket opened at once."""

MEANING = {
    "link_disabled": (
        "Slack switched Socket Mode off for this app (disconnect: link_disabled): switch it on "
        "under Socket Mode in the app's settings, or receive events over HTTP (signing_secret)"
    ),
    "too_many_websockets": (
        "Slack closed the socket (disconnect: too_many_websockets): more Socket Mode sockets "
        "are open on this app token than Slack allows (10), so another process or deployment "
        "uses this app token; stop it, or give it an app of its own"
    ),
}
"""What the other `disconnect` reasons mean, and what to do, in the words the run ends with."""


@dataclass(frozen=True, slots=True)
class Envelope:
    type: str
    envelope_id: str
    payload: dict[str, Any]
    retry_attempt: int = 0
    retry_reason: str = ""


def _count(value: object) -> int:
    """A retry count from the wire; anything unreadable counts as none (it is only logged)."""
    try:
        return max(0, int(str(value)))
    except ValueError:
        return 0


Lost = Callable[[object, str | None], None]
"""Told which socket is gone, and the reason of Slack's `disconnect` (None: it was lost)."""


class _Client(SocketModeClient):
    """The SDK client, except that reconnecting is `SocketSession`'s decision."""

    def __init__(self, *args: Any, on_lost: Lost, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._on_lost = on_lost

    async def connect_to_new_endpoint(self, force: bool = False) -> None:
        # Called by the SDK's monitor (dead socket) and receiver (close frame): report which
        # socket it was about.
        self._on_lost(self.current_session, "disconnect" if force else None)

    async def run_message_listeners(self, message: dict[str, Any], raw_message: str) -> None:
        # The SDK answers every `disconnect` alike (force a new endpoint); its reason matters.
        if message.get("type") == "disconnect":
            self._on_lost(self.current_session, str(message.get("reason") or "unknown"))
            return
        await super().run_message_listeners(message, raw_message)


OpenUrl = Callable[[], Awaitable[str]]
Handler = Callable[[Envelope], Awaitable[None]]


class SocketSession:
    """One Socket Mode connection: at most one socket at a time, reconnected with backoff."""

    def __init__(
        self,
        app_token: str,
        web: AsyncWebClient,
        open_url: OpenUrl,
        handle: Handler,
        *,
        ping_interval: float,
        retry_base: float,
        logger: logging.Logger,
        connect_timeout: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._app_token = app_token
        self._web = web
        self._open_url = open_url
        self._handle = handle
        self._ping_interval = ping_interval
        self._retry_base = retry_base
        self._log = logger
        self._connect_timeout = connect_timeout
        self._clock = clock
        self._envelopes = 0
        """Envelopes received so far: a socket that brought one has proved itself."""
        self._lost: asyncio.Queue[tuple[object, str | None]] = asyncio.Queue()
        self._queue: asyncio.Queue[Envelope] = asyncio.Queue()
        self._hello = asyncio.Event()
        self.client: _Client | None = None
        self.sockets_opened = 0

    def _signal_lost(self, session: object, reason: str | None) -> None:
        self._lost.put_nowait((session, reason))

    async def _on_message(
        self, client: AsyncBaseSocketModeClient, message: dict[str, Any], raw: str | None
    ) -> None:
        kind = message.get("type")
        if kind == "hello":
            self._hello.set()
            return
        envelope_id = message.get("envelope_id")
        if not isinstance(envelope_id, str) or not isinstance(kind, str):
            return
        payload = message.get("payload")
        self._envelopes += 1
        self._queue.put_nowait(
            Envelope(
                type=kind,
                envelope_id=envelope_id,
                payload=payload if isinstance(payload, dict) else {},
                retry_attempt=_count(message.get("retry_attempt")),
                retry_reason=str(message.get("retry_reason") or ""),
            )
        )

    async def _process(self) -> None:
        while True:
            envelope = await self._queue.get()
            try:
                await self._handle(envelope)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._log.warning(
                    "envelope %s was not taken, so it is not acknowledged (Slack delivers it "
                    "again): %s",
                    envelope.envelope_id,
                    exc,
                    exc_info=not isinstance(exc, ConnectorError),
                )
                continue
            await self._ack(envelope.envelope_id)

    async def _ack(self, envelope_id: str) -> None:
        client = self.client
        if client is None or client.current_session is None or client.current_session.closed:
            return  # the socket it came on is gone: Slack delivers it again, dedupe drops it
        try:
            await client.send_socket_mode_response({"envelope_id": envelope_id})
        except Exception as exc:
            self._log.warning("could not acknowledge envelope %s: %s", envelope_id, exc)

    async def run(self, status: ConnectionStatus) -> None:
        client = _Client(
            self._app_token,
            logger=self._log.getChild("sdk"),
            web_client=self._web,
            auto_reconnect_enabled=True,
            ping_interval=self._ping_interval,
            on_lost=self._signal_lost,
        )
        client.message_listeners.append(self._on_message)
        self.client = client
        processor = asyncio.create_task(self._process(), name="slack-socket-envelopes")
        backoff = Backoff(base=self._retry_base, cap=30.0)
        delay = 0.0
        try:
            while True:
                if delay:
                    await asyncio.sleep(delay)
                session = await self._connect(client, status)
                if session is None:
                    delay = backoff.next()
                    continue
                opened_at, envelopes = self._clock(), self._envelopes
                reason = await self._wait_lost(session)
                if self._envelopes > envelopes or self._clock() - opened_at >= STABLE_AFTER:
                    backoff.reset()  # it worked: what follows is a first retry again
                if reason is not None and reason not in PLANNED:
                    # Ended, so the registry retries with its growing backoff: never a socket
                    # a second, nor a ping-pong with another deployment each knocking the
                    # other's socket off.
                    raise TransientError(
                        MEANING.get(reason)
                        or f"Slack closed the socket (disconnect: {reason}), a reason it does "
                        "not give for its own upkeep"
                    )
                delay = self._retry_delay(reason, backoff, status)
        finally:
            processor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await processor
            await client.close()  # type: ignore[no-untyped-call]

    def _retry_delay(self, reason: str | None, backoff: Backoff, status: ConnectionStatus) -> float:
        """How long to wait before the next socket, after a planned `disconnect` (`reason`) or
        a lost socket (None); reported as degraded unless Slack's upkeep explains it."""
        if reason is not None and backoff.attempts == 0:
            self._log.info("Slack asked for a new socket (%s); reconnecting", reason)
            backoff.attempts = 1  # a second one right after the next socket opened waits
            return 0.0
        delay = backoff.next()
        what = (
            "the Socket Mode socket was lost"
            if reason is None
            else f"Slack asked for a new socket again right after opening one ({reason})"
        )
        status.degraded(f"{what}; reconnecting in {delay:.1f} s (attempt {backoff.attempts})")
        return delay

    async def _connect(self, client: _Client, status: ConnectionStatus) -> object | None:
        """Close the old socket, open one new one; returns it, or None after a transient failure."""
        if client.current_session is not None and not client.current_session.closed:
            await client.current_session.close()
        try:
            url = await self._open_url()
        except RateLimitedError as exc:
            status.degraded(f"apps.connections.open is rate limited: {exc}")
            await asyncio.sleep(exc.retry_after)
            return None
        except TransientError as exc:
            status.degraded(f"cannot open a Socket Mode URL: {exc}")
            return None
        client.wss_uri = url
        self._hello.clear()
        try:
            async with asyncio.timeout(self._connect_timeout):
                await client.connect()  # type: ignore[no-untyped-call]
                self.sockets_opened += 1
                await self._hello.wait()
        except TimeoutError:
            client.auto_reconnect_enabled = True
            status.degraded("the Socket Mode socket did not say hello in time")
            return None
        status.up()
        return client.current_session

    async def _wait_lost(self, session: object) -> str | None:
        """Wait until this socket is reported gone; the reason Slack gave, None if it was lost."""
        while True:
            lost, reason = await self._lost.get()
            if lost is session:
                return reason
            # a report about an older socket, raised while we were replacing it: not news
