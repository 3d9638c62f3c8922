"""A real webchat server on 127.0.0.1:0, an echo harness behind it, and a protocol client."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from websockets.asyncio.client import ClientConnection, connect

from talkbridge.config import WebchatConfig
from talkbridge.connectors.base import ConnectorContext
from talkbridge.message import NormalizedMessage, OutboundMessage
from talkbridge.store import SqliteStore
from talkbridge.webchat import WebchatConnector
from tests.conftest import require

TOKEN_A = "token-alpha-0123456789"
TOKEN_B = "token-bravo-9876543210"
TIMEOUT = 10.0
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]


class Status:
    """What the registry hands `run`: records that the transport said it is up."""

    def __init__(self) -> None:
        self.is_up = asyncio.Event()
        self.reasons: list[str] = []

    def up(self) -> None:
        self.is_up.set()

    def degraded(self, reason: str) -> None:
        self.reasons.append(reason)


class EchoHarness:
    """Plays the router and the echo agent: typing, two streamed deltas, then the final send."""

    def __init__(self, connector: WebchatConnector) -> None:
        self.connector = connector
        self.turns: list[NormalizedMessage] = []
        self.turned = asyncio.Event()
        self.gate: asyncio.Event | None = None
        """When set, each reply pauses after its first delta until the gate opens."""
        self.streaming = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        connector.subscribe(self.on_message)

    async def on_message(self, msg: NormalizedMessage) -> None:
        """Accept the message and answer it in a task of its own, as the router does: delivery
        returns once the message is taken, before its turn has run."""
        if any(turn.id == msg.id for turn in self.turns):
            return  # the router drops what it has had: the webchat may deliver a resend again
        self.turns.append(msg)
        self.turned.set()
        task = asyncio.create_task(self._answer(msg, f"s{len(self.turns)}"))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, msg: NormalizedMessage, stream_id: str) -> None:
        await self.connector.typing(msg.thread_id)
        reply = f"echo: {msg.text}"
        half = len(reply) // 2
        for index, piece in enumerate((reply[:half], reply[half:])):
            await self.connector.delta(msg.thread_id, stream_id, piece)
            if index == 0 and self.gate is not None:
                self.streaming.set()
                await self.gate.wait()
        await self.connector.send(
            OutboundMessage(thread_id=msg.thread_id, text=reply, meta={"stream_id": stream_id})
        )


@dataclass
class Webchat:
    connector: WebchatConnector
    store: SqliteStore
    echo: EchoHarness
    task: asyncio.Task[None]
    health: dict[str, Any] = field(default_factory=dict)

    @property
    def port(self) -> int:
        assert self.connector.port is not None
        return self.connector.port

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ws"

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def client(self) -> Client:
        return Client(await connect(self.ws_url, max_size=None))

    async def authed(self, token: str = TOKEN_A, session_id: str | None = None) -> Client:
        client = await self.client()
        client.ready = await client.auth(token, session_id)
        return client


StartWebchat = Callable[..., Awaitable[Webchat]]


@pytest.fixture
async def start_webchat(sqlite_store: SqliteStore) -> AsyncIterator[StartWebchat]:
    """Start a webchat (optionally with config overrides); stopped when the test ends."""
    started: list[Webchat] = []

    async def start(**overrides: Any) -> Webchat:
        tokens = overrides.pop("static_tokens", [TOKEN_A, TOKEN_B])
        overrides.setdefault("max_frame_bytes", 4096)
        config = WebchatConfig(host="127.0.0.1", port=0, **overrides)
        health: dict[str, Any] = {"webchat": {"state": "up", "error": None}}
        context = ConnectorContext(sqlite_store, logging.getLogger("test.webchat"))
        connector = WebchatConnector(config, context, tokens, lambda: health)
        echo = EchoHarness(connector)
        status = Status()
        task = asyncio.create_task(connector.run(status))
        await asyncio.wait_for(connector.ready.wait(), TIMEOUT)
        assert status.is_up.is_set()
        chat = Webchat(connector, sqlite_store, echo, task, health)
        started.append(chat)
        return chat

    yield start
    for chat in started:
        chat.task.cancel()
        await asyncio.gather(chat.task, return_exceptions=True)


@pytest.fixture
async def webchat(start_webchat: StartWebchat) -> Webchat:
    return await start_webchat()


class Client:
    """A protocol client over a real websocket; frames not asked for yet wait in `inbox`."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.inbox: list[dict[str, Any]] = []
        self.ready: dict[str, Any] = {}

    async def send(self, frame: dict[str, Any] | str | bytes) -> None:
        await self.ws.send(frame if isinstance(frame, str | bytes) else json.dumps(frame))

    async def recv(self) -> dict[str, Any]:
        if self.inbox:
            return self.inbox.pop(0)
        data = await asyncio.wait_for(self.ws.recv(), TIMEOUT)
        frame: dict[str, Any] = json.loads(data)
        return frame

    async def expect(self, kind: str, **match: Any) -> dict[str, Any]:
        """The next frame of `kind` (with these field values); earlier others stay queued."""
        for index, frame in enumerate(self.inbox):
            if _matches(frame, kind, match):
                return self.inbox.pop(index)
        while True:
            data = await asyncio.wait_for(self.ws.recv(), TIMEOUT)
            frame = json.loads(data)
            if _matches(frame, kind, match):
                return frame  # type: ignore[no-any-return]
            self.inbox.append(frame)

    async def auth(self, token: str, session_id: str | None = None) -> dict[str, Any]:
        frame: dict[str, Any] = {"type": "auth", "token": token}
        if session_id:
            frame["session_id"] = session_id
        await self.send(frame)
        reply = await self.recv()
        assert reply["type"] == "ready", reply
        return reply

    @property
    def session_id(self) -> str:
        return str(self.ready["session_id"])

    @property
    def thread_id(self) -> str:
        return str(self.ready["conversations"][0]["thread_id"])

    async def turn(
        self, text: str, client_id: str, thread_id: str | None = None
    ) -> list[dict[str, Any]]:
        """Send a message and collect everything up to the final assistant message."""
        thread = thread_id or self.thread_id
        await self.send({"type": "send", "thread_id": thread, "client_id": client_id, "text": text})
        frames: list[dict[str, Any]] = []
        while True:
            frame = await self.recv()
            frames.append(frame)
            if frame["type"] == "message" and frame["role"] == "assistant":
                return frames

    async def drain_until_pong(self) -> list[dict[str, Any]]:
        """Everything the server sent before answering a ping: proves nothing else is pending."""
        await self.send({"type": "ping", "ref": "drain"})
        frames: list[dict[str, Any]] = []
        while True:
            frame = await self.recv()
            if frame["type"] == "pong" and frame.get("ref") == "drain":
                return frames
            frames.append(frame)

    async def close(self) -> None:
        await self.ws.close()


def _matches(frame: dict[str, Any], kind: str, match: dict[str, Any]) -> bool:
    return frame.get("type") == kind and all(frame.get(k) == v for k, v in match.items())


def require_chromium() -> None:
    require(CHROMIUM.exists(), f"{CHROMIUM} is missing (apt-get install -y chromium)")


pw: Any
try:
    from playwright import async_api as pw
except ImportError:  # pragma: no cover - the dev extra brings it
    pw = None
expect: Any = pw.expect if pw is not None else None
MS = TIMEOUT * 1000


@pytest.fixture
async def browser() -> AsyncIterator[Any]:
    require(pw is not None, "playwright is not installed (pip install -e '.[dev]')")
    require_chromium()
    async with pw.async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS
        )
        try:
            yield browser
        finally:
            await browser.close()


@pytest.fixture
async def context(browser: Any) -> AsyncIterator[Any]:
    context = await browser.new_context(viewport={"width": 1100, "height": 800})
    context.set_default_timeout(MS)
    errors: list[Any] = []
    context.on("page", lambda page: page.on("pageerror", lambda exc: errors.append(exc)))
    yield context
    await context.close()
    assert errors == [], f"the page raised: {errors}"


def page_url(webchat: Webchat, token: str = TOKEN_A) -> str:
    return f"{webchat.http}/?token={quote(token)}"


async def open_chat(context: Any, webchat: Webchat) -> Any:
    page = await context.new_page()
    await page.goto(page_url(webchat))
    await expect(page.locator("#status")).to_have_attribute("data-state", "online", timeout=MS)
    return page


async def say(page: Any, text: str) -> None:
    await page.get_by_role("textbox", name="Message").fill(text)
    await page.get_by_role("textbox", name="Message").press("Enter")


async def say_on_a_phone(page: Any, text: str) -> None:
    """Type and tap Send: on a touch screen Enter starts a new line."""
    await page.get_by_role("textbox", name="Message").fill(text)
    await page.get_by_role("button", name="Send message").tap()


FRAMES = "() => new Promise(done => requestAnimationFrame(() => requestAnimationFrame(done)))"
"""Resolves once the page has drawn twice: its scroll and resize events of the moment are
handled."""

ANNOUNCED = """() => {
    window.__announced = [];
    // The live region a change is read out from, or null: none, or one that is off or hidden.
    const region = node => {
        const el = node.nodeType === 1 ? node : node.parentElement;
        if (!el || el.closest('[aria-hidden=true], [hidden]')) return null;
        const at = el.closest('[aria-live], [role=log], [role=status], [role=alert]');
        if (!at) return null;
        const live = at.getAttribute('aria-live')
            ?? (at.getAttribute('role') === 'alert' ? 'assertive' : 'polite');
        return live === 'off' ? null : at;
    };
    new MutationObserver(records => {
        for (const r of records) {
            if (r.type === 'characterData' && region(r.target)) {
                window.__announced.push(r.target.data);
            }
            for (const node of r.addedNodes) {
                if (region(node)) window.__announced.push(node.textContent);
            }
        }
    }).observe(document, { childList: true, subtree: true, characterData: true });
}"""
"""Before the page's script: every text added to a live region (what a screen reader reads
out unasked) goes to `window.__announced`."""


async def page_swallowing_sends(context: Any, webchat: Webchat) -> tuple[Any, dict[str, bool]]:
    """An open page whose `send` frames go nowhere while `swallow["sends"]` holds (as if the
    bridge never got them); everything else passes."""
    page = await context.new_page()
    swallow = {"sends": True}

    def relay(ws: Any) -> None:
        server = ws.connect_to_server()
        ws.on_message(
            lambda m: None if swallow["sends"] and '"type":"send"' in m else server.send(m)
        )
        server.on_message(ws.send)

    await page.route_web_socket("**/ws", relay)
    await page.goto(page_url(webchat))
    await expect(page.locator("#status")).to_have_attribute("data-state", "online")
    return page, swallow
