"""A local Slack: the Web API over HTTP and Socket Mode over a real websocket, on 127.0.0.1.

The real slack-sdk clients talk to it through their documented options:
`AsyncWebClient(base_url=peer.api_base)` (trailing slash included) and a Socket Mode client whose
`apps.connections.open` answers `ws://127.0.0.1:PORT/link/?ticket=…` — or `api_base:` in a
connection's config.

What it does like Slack:
- `/api/{method}`: token from `Authorization: Bearer` (or a `token` field), GET query, form or
  JSON bodies; `{"ok": true, …}` or `{"ok": false, "error": …}` (HTTP 200, like Slack); 429 with
  `Retry-After`; `invalid_auth` for unknown tokens and `token_revoked` after `revoke()`;
- messages kept per channel with unique `ts`, threads by `thread_ts`: chat.postMessage/update/
  delete (an update with `text` and no `blocks` takes the blocks off, as Slack documents),
  reactions.add, conversations.history/replies/info/members, users.info, auth.test, the files
  upload flow (getUploadURLExternal -> POST bytes -> completeUploadExternal), files.info and an
  authenticated download, assistant.threads.setStatus; a block's text over 3,000 characters is
  `invalid_blocks`; each posted message records the `@here`/`@channel`/`@everyone` it would
  notify (`pings`), with Slack's automatic parsing of block text that is not `verbatim`;
- Socket Mode: apps.connections.open needs an `xapp-` token with `connections:write` (else
  `missing_scope` naming it in `needed`, as Slack does) and hands out one-use URLs; the
  socket says `hello`, carries `events_api`/`interactive` envelopes, records acks, sends
  `disconnect` messages (with `link_disabled` on every new socket once Socket Mode is switched
  off, `too_many_websockets` on one over `socket_limit`), redelivers envelopes, and can be
  dropped without a close frame;
- Events API: `post_event` signs a request like Slack (HMAC-SHA256 over `v0:ts:body`).

Every call is recorded; `wait_for` awaits a condition without sleeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import itertools
import json
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from tests.peers.http import serve
from tests.support.waiting import Waitable

JSON_FIELDS = {"blocks", "files", "attachments"}


@dataclass
class Workspace:
    bot_token: str
    app_token: str | None = None
    team_id: str = "T0ACME001"
    team: str = "Acme"
    bot_user_id: str = "U0BOT0001"
    bot_id: str = "B0BOT0001"
    bot_name: str = "talkbridge"
    app_scopes: tuple[str, ...] = ("connections:write",)
    """The app-level token's scopes: without `connections:write` it opens no socket."""


@dataclass
class Call:
    token: str
    method: str
    params: dict[str, Any]
    status: int = 200
    error: str | None = None


@dataclass
class _Failure:
    status: int
    error: str
    retry_after: int | None
    drop: bool
    not_json: bool = False
    needed: str | None = None


@dataclass
class Socket:
    """One Socket Mode connection as the peer sees it."""

    ws: web.WebSocketResponse
    app_token: str
    number: int
    transport: asyncio.BaseTransport | None = None
    closed: bool = False
    received: list[dict[str, Any]] = field(default_factory=list)


class SlackPeer(Waitable):
    def __init__(self, *workspaces: Workspace) -> None:
        self.workspaces: dict[str, Workspace] = {}
        for workspace in workspaces or (
            Workspace("xoxb-1-test-bot-token", app_token="xapp-1-test-app-token"),
        ):
            self.add_workspace(workspace)
        self.calls: list[Call] = []
        self.messages: dict[str, list[dict[str, Any]]] = {}
        self.reactions: list[dict[str, Any]] = []
        self.statuses: list[dict[str, Any]] = []
        self.users: dict[str, dict[str, Any]] = {}
        self.conversations: dict[str, dict[str, Any]] = {}
        self.members: dict[str, list[str]] = {}
        self.files: dict[str, dict[str, Any]] = {}
        self.sockets: list[Socket] = []
        self.max_open_sockets = 0
        self.acks: list[str] = []
        self.envelopes: dict[str, dict[str, Any]] = {}
        self._tickets: dict[str, str] = {}
        self.tickets_issued: list[str] = []
        self._refuse_handshakes = 0
        self._refused_status = 503
        self._failures: dict[str, list[tuple[str | None, _Failure | None]]] = {}
        self._revoked: set[str] = set()
        self.socket_limit = 10
        """Sockets Slack allows an app at once; one more is told `disconnect` with reason
        `too_many_websockets` right after its hello (another deployment on the same token)."""
        self.socket_mode_off = False
        self._after_hello: list[str | None] = []
        """Socket Mode switched off in the app's settings: see `switch_socket_mode_off`."""
        self._held: dict[str, asyncio.Event] = {}
        self._answered: set[str] = set()
        self._ts = itertools.count(1)
        self._ids = itertools.count(1)
        self._changed = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self.port = 0

    # ---- lifecycle -------------------------------------------------------------------------

    async def start(self) -> SlackPeer:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/api/{method}", self._handle)
        app.router.add_get("/link/", self._socket)
        app.router.add_post("/upload/{file_id}", self._upload)
        app.router.add_get("/files/{file_id}/{name}", self._download)
        self._runner, self.port = await serve(app)
        return self

    async def stop(self) -> None:
        for gate in self._held.values():
            gate.set()
        for sock in self.sockets:
            if not sock.closed:
                with contextlib.suppress(Exception):
                    await sock.ws.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> SlackPeer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def api_base(self) -> str:
        return f"{self.base_url}/api/"

    # ---- scripting -------------------------------------------------------------------------

    def add_workspace(self, workspace: Workspace) -> Workspace:
        self.workspaces[workspace.bot_token] = workspace
        return workspace

    def workspace(self, token: str | None = None) -> Workspace:
        if token is None:
            return next(iter(self.workspaces.values()))
        for ws in self.workspaces.values():
            if token in (ws.bot_token, ws.app_token):
                return ws
        raise KeyError("no workspace with that token")

    def add_user(self, user_id: str, name: str, *, display_name: str = "", **extra: Any) -> None:
        self.users[user_id] = {
            "id": user_id,
            "name": name.lower().replace(" ", "."),
            "real_name": name,
            "is_bot": False,
            "tz": "Europe/Berlin",
            "profile": {"real_name": name, "display_name": display_name},
            **extra,
        }

    def add_conversation(
        self, channel: str, name: str = "", *, members: list[str] | None = None, **extra: Any
    ) -> None:
        """`members`: what `conversations.members` answers (which `conversations.info`, as in
        Slack, does not say)."""
        info: dict[str, Any] = {"id": channel, "is_im": channel.startswith("D")}
        if name:
            info["name"] = name
        info.update(extra)
        self.conversations[channel] = info
        if members is not None:
            self.members[channel] = list(members)

    def revoke(self, token: str) -> None:
        """From now on every call with this token answers `token_revoked`."""
        self._revoked.add(token)

    def fail_next(
        self,
        method: str,
        times: int = 1,
        *,
        status: int = 429,
        error: str | None = None,
        retry_after: int | None = None,
        drop: bool = False,
        not_json: bool = False,
        needed: str | None = None,
        after: int = 0,
        token: str | None = None,
    ) -> None:
        """The next `times` calls of `method` fail (after `after` successes); `token` limits it
        to one workspace (a bot or app token); `needed`: `missing_scope` naming that scope."""
        if status == 429 and retry_after is None:
            retry_after = 1
        code = (
            error
            or ("missing_scope" if needed else None)
            or {429: "ratelimited", 500: "internal_error", 503: "service_unavailable"}.get(
                status, "fatal_error"
            )
        )
        queue = self._failures.setdefault(method, [])
        queue.extend((token, None) for _ in range(after))
        failure = _Failure(status, code, retry_after, drop, not_json, needed)
        queue.extend((token, failure) for _ in range(times))

    def hold(self, method: str, *, answered: bool = False) -> None:
        """Calls of `method` get no answer until `release(method)` (a slow Slack); `answered`:
        the answer is made at once, as things are then, and is on its way until released."""
        self._held[method] = asyncio.Event()
        if answered:
            self._answered.add(method)

    def release(self, method: str) -> None:
        self._answered.discard(method)
        self._held.pop(method).set()

    def new_ts(self) -> str:
        return f"{int(time.time())}.{next(self._ts):06d}"

    # ---- observing -------------------------------------------------------------------------

    def calls_of(
        self, method: str, *, ok: bool | None = True, token: str | None = None
    ) -> list[Call]:
        """Calls of `method`; by default only successful ones (None: all)."""
        return [
            c
            for c in self.calls
            if c.method == method
            and (ok is None or (c.status == 200 and c.error is None) == ok)
            and (token is None or c.token == token)
        ]

    def posted(self, token: str | None = None) -> list[dict[str, Any]]:
        """Params of every successful chat.postMessage, in order."""
        return [c.params for c in self.calls_of("chat.postMessage", token=token)]

    @property
    def open_sockets(self) -> list[Socket]:
        return [s for s in self.sockets if not s.closed]

    # ---- Socket Mode -----------------------------------------------------------------------

    async def wait_socket(self, count: int = 1, timeout: float = 10.0) -> Socket:
        """Wait until `count` sockets were opened in all, and return the newest open one."""
        await self.wait_for(lambda: len(self.sockets) >= count and bool(self.open_sockets), timeout)
        return self.open_sockets[-1]

    def _current(self, app_token: str | None) -> Socket:
        for sock in reversed(self.sockets):
            if not sock.closed and (app_token is None or sock.app_token == app_token):
                return sock
        raise RuntimeError("no open Socket Mode connection")

    async def send_envelope(
        self,
        kind: str,
        payload: dict[str, Any],
        *,
        app_token: str | None = None,
        envelope_id: str | None = None,
        retry_attempt: int = 0,
        retry_reason: str = "",
    ) -> str:
        envelope_id = envelope_id or str(uuid.uuid4())
        envelope = {
            "envelope_id": envelope_id,
            "payload": payload,
            "type": kind,
            "accepts_response_payload": kind != "events_api",
        }
        if kind == "events_api":
            envelope["retry_attempt"] = retry_attempt
            envelope["retry_reason"] = retry_reason
        self.envelopes[envelope_id] = envelope
        await self._current(app_token).ws.send_str(json.dumps(envelope))
        return envelope_id

    async def send_event(
        self, event: dict[str, Any], *, app_token: str | None = None, event_id: str | None = None
    ) -> str:
        """Deliver an event in an `events_api` envelope; returns the envelope id."""
        return await self.send_envelope(
            "events_api",
            self.event_callback(event, event_id=event_id, token=app_token),
            app_token=app_token,
        )

    async def redeliver(self, envelope_id: str, *, app_token: str | None = None) -> None:
        """Send an envelope again (as Slack does when it saw no ack), on the current socket."""
        envelope = self.envelopes[envelope_id]
        await self.send_envelope(
            envelope["type"],
            envelope["payload"],
            app_token=app_token,
            envelope_id=envelope_id,
            retry_attempt=int(envelope.get("retry_attempt") or 0) + 1,
            retry_reason="timeout",
        )

    async def send_disconnect(
        self, reason: str = "refresh_requested", *, app_token: str | None = None
    ) -> None:
        await self._current(app_token).ws.send_str(
            json.dumps({"type": "disconnect", "reason": reason, "debug_info": {"host": "peer"}})
        )

    def refuse_handshakes(self, times: int = 1, status: int = 503) -> None:
        """The next `times` websocket handshakes are answered `status` (a busy load balancer in
        front of Slack's socket hosts); the ticket stays unused, so the same URL works later."""
        self._refuse_handshakes = times
        self._refused_status = status

    async def switch_socket_mode_off(self) -> None:
        """An admin turns Socket Mode off: the open socket gets `disconnect` with reason
        `link_disabled`, and so does every socket opened afterwards, right after its hello."""
        self.socket_mode_off = True
        await self.send_disconnect("link_disabled")

    def end_after_hello(self, times: int, reason: str | None = None) -> None:
        """The next `times` sockets say hello and end at once: with a `disconnect` giving
        `reason`, or (None) with a close frame (a Slack host in trouble)."""
        self._after_hello = [reason] * times

    def drop_socket(self, *, app_token: str | None = None) -> None:
        """Cut the socket without a close frame (a network failure)."""
        sock = self._current(app_token)
        sock.closed = True
        if isinstance(sock.transport, asyncio.Transport):
            sock.transport.abort()
        self._notify()

    async def wait_ack(self, envelope_id: str, count: int = 1, timeout: float = 10.0) -> None:
        await self.wait_for(lambda: self.acks.count(envelope_id) >= count, timeout)

    async def _socket(self, request: web.Request) -> web.StreamResponse:
        ticket = request.query.get("ticket", "")
        if self._refuse_handshakes > 0 and ticket in self._tickets:
            self._refuse_handshakes -= 1
            self._notify()
            return web.Response(status=self._refused_status, text="try again later")
        app_token = self._tickets.pop(ticket, None)
        if app_token is None:
            return web.Response(status=401, text="invalid or used ticket")
        ws = web.WebSocketResponse(autoping=True)
        await ws.prepare(request)
        sock = Socket(ws, app_token, len(self.sockets) + 1, request.transport)
        self.sockets.append(sock)
        self.max_open_sockets = max(self.max_open_sockets, len(self.open_sockets))
        await ws.send_str(
            json.dumps(
                {
                    "type": "hello",
                    "num_connections": len(self.open_sockets),
                    "connection_info": {"app_id": "A0PEER001"},
                    "debug_info": {"host": "peer", "approximate_connection_time": 3600},
                }
            )
        )
        if self._after_hello:
            reason = self._after_hello.pop(0)
            if reason is None:
                await ws.close()
            else:
                await ws.send_str(json.dumps({"type": "disconnect", "reason": reason}))
        elif self.socket_mode_off:
            await ws.send_str(json.dumps({"type": "disconnect", "reason": "link_disabled"}))
        elif sum(1 for o in self.open_sockets if o.app_token == app_token) > self.socket_limit:
            await ws.send_str(json.dumps({"type": "disconnect", "reason": "too_many_websockets"}))
        self._notify()
        try:
            async for message in ws:
                if message.type != aiohttp.WSMsgType.TEXT:
                    continue
                with contextlib.suppress(json.JSONDecodeError):
                    data = json.loads(message.data)
                    sock.received.append(data)
                    if isinstance(data, dict) and data.get("envelope_id"):
                        self.acks.append(str(data["envelope_id"]))
                    self._notify()
        finally:
            sock.closed = True
            self._notify()
        return ws

    # ---- Events API ------------------------------------------------------------------------

    def event_callback(
        self, event: dict[str, Any], *, event_id: str | None = None, token: str | None = None
    ) -> dict[str, Any]:
        ws = self.workspace(token)
        return {
            "token": "XXYYZZ",
            "team_id": ws.team_id,
            "api_app_id": "A0PEER001",
            "event": event,
            "type": "event_callback",
            "event_id": event_id or f"Ev{next(self._ids):08d}",
            "event_time": int(time.time()),
            "authorizations": [{"team_id": ws.team_id, "user_id": ws.bot_user_id, "is_bot": True}],
        }

    @staticmethod
    def sign(secret: str, timestamp: str, body: bytes) -> str:
        base = b"v0:" + timestamp.encode() + b":" + body
        return "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()

    async def post_event(
        self,
        url: str,
        payload: dict[str, Any],
        *,
        secret: str,
        timestamp: int | None = None,
        signature: str | None = None,
        retry_num: int | None = None,
        form: bool = False,
        body: bytes | None = None,
    ) -> tuple[int, str]:
        """POST like Slack: signed JSON (or an interactivity form); returns (status, text)."""
        if body is None:
            if form:
                from urllib.parse import urlencode

                body = urlencode({"payload": json.dumps(payload)}).encode()
            else:
                body = json.dumps(payload).encode()
        stamp = str(int(time.time()) if timestamp is None else timestamp)
        headers = {
            "Content-Type": "application/x-www-form-urlencoded" if form else "application/json",
            "X-Slack-Request-Timestamp": stamp,
            "X-Slack-Signature": signature or self.sign(secret, stamp, body),
        }
        if retry_num is not None:
            headers["X-Slack-Retry-Num"] = str(retry_num)
            headers["X-Slack-Retry-Reason"] = "http_timeout"
        async with (
            aiohttp.ClientSession() as session,
            session.post(url, data=body, headers=headers) as response,
        ):
            return response.status, await response.text()

    # ---- Web API ---------------------------------------------------------------------------

    async def _params(self, request: web.Request) -> dict[str, Any]:
        params: dict[str, Any] = dict(request.query)
        if request.method == "POST" and request.can_read_body:
            if request.content_type == "application/json":
                body = await request.json()
                params.update(body if isinstance(body, dict) else {})
            else:
                form = await request.post()
                params.update({k: v for k, v in form.items() if isinstance(v, str)})
        for key in JSON_FIELDS:
            value = params.get(key)
            if isinstance(value, str):
                with contextlib.suppress(json.JSONDecodeError):
                    params[key] = json.loads(value)
        return params

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        method = request.match_info["method"]
        params = await self._params(request)
        auth = request.headers.get("Authorization", "")
        token = auth.removeprefix("Bearer ").strip() or str(params.pop("token", ""))
        params.pop("token", None)
        call = Call(token, method, params)
        self.calls.append(call)
        try:
            known = any(token in (w.bot_token, w.app_token) for w in self.workspaces.values())
            if not known:
                return self._error(call, "not_authed" if not token else "invalid_auth")
            if token in self._revoked:
                return self._error(call, "token_revoked")
            failure = self._scripted(method, token)
            if failure is not None:
                if failure.drop:
                    call.status = 0
                    assert request.transport is not None
                    request.transport.abort()
                    return web.Response(status=500)
                if failure.not_json:  # a proxy's page in front of Slack
                    call.error = "not_json"
                    return web.Response(status=200, text="<html>Bad gateway</html>")
                if failure.needed:
                    call.error = failure.error
                    body = {"ok": False, "error": failure.error, "needed": failure.needed}
                    return web.json_response({**body, "provided": "channels:history"})
                headers = {"Retry-After": str(failure.retry_after)} if failure.retry_after else {}
                return self._error(call, failure.error, status=failure.status, headers=headers)
            held, answered = self._held.get(method), method in self._answered
            if held is not None and not answered:
                self._notify()  # the call is recorded: a test may wait for it
                await held.wait()
            handler = getattr(self, "_m_" + method.replace(".", "_"), None)
            if handler is None:
                return self._error(call, "unknown_method")
            result = await handler(token, params)
            if held is not None and answered:
                self._notify()
                await held.wait()
            if isinstance(result, str):
                return self._error(call, result)
            if result.get("ok") is False:  # an error with fields of its own (`needed`)
                call.error = str(result["error"])
                return web.json_response(result)
            return web.json_response({"ok": True, **result})
        finally:
            self._notify()

    def _scripted(self, method: str, token: str) -> _Failure | None:
        queue = self._failures.get(method, [])
        for index, (only, failure) in enumerate(queue):
            if only is None or only == token:
                del queue[index]
                return failure
        return None

    def _error(
        self, call: Call, error: str, *, status: int = 200, headers: dict[str, str] | None = None
    ) -> web.Response:
        call.status = status
        call.error = error
        return web.json_response({"ok": False, "error": error}, status=status, headers=headers)

    def _app_token_workspace(self, token: str) -> Workspace | None:
        return next((w for w in self.workspaces.values() if w.app_token == token), None)

    # methods: return a dict (merged into {"ok": true}) or an error code string

    async def _m_auth_test(self, token: str, params: dict[str, Any]) -> Any:
        ws = self.workspace(token)
        if token != ws.bot_token:
            return "not_allowed_token_type"
        return {
            "url": f"https://{ws.team.lower()}.slack.com/",
            "team": ws.team,
            "user": ws.bot_name,
            "team_id": ws.team_id,
            "user_id": ws.bot_user_id,
            "bot_id": ws.bot_id,
            "is_enterprise_install": False,
        }

    async def _m_apps_connections_open(self, token: str, params: dict[str, Any]) -> Any:
        workspace = self._app_token_workspace(token)
        if workspace is None:
            return "not_allowed_token_type"  # a bot token cannot open sockets
        if "connections:write" not in workspace.app_scopes:
            return {  # as Slack answers a token without the scope a method needs
                "ok": False,
                "error": "missing_scope",
                "needed": "connections:write",
                "provided": ",".join(workspace.app_scopes),
            }
        ticket = uuid.uuid4().hex
        self._tickets[ticket] = token
        self.tickets_issued.append(ticket)
        return {"url": f"ws://127.0.0.1:{self.port}/link/?ticket={ticket}"}

    def _bot(self, token: str) -> Workspace | str:
        ws = self.workspace(token)
        return ws if token == ws.bot_token else "not_allowed_token_type"

    async def _m_chat_postMessage(self, token: str, params: dict[str, Any]) -> Any:
        ws = self._bot(token)
        if isinstance(ws, str):
            return ws
        channel = params.get("channel")
        text = params.get("text") or ""
        if not channel:
            return "channel_not_found"
        if not text and not params.get("blocks"):
            return "no_text"
        if len(text) > 40000:
            return "msg_too_long"
        blocks = params.get("blocks") or []
        if any(len(str(t.get("text") or "")) > 3000 for t in _section_texts(blocks)):
            return "invalid_blocks"  # a section's text object holds at most 3,000 characters
        message: dict[str, Any] = {
            "type": "message",
            "user": ws.bot_user_id,
            "bot_id": ws.bot_id,
            "text": text,
            "ts": self.new_ts(),
            "team": ws.team_id,
        }
        if params.get("thread_ts"):
            message["thread_ts"] = params["thread_ts"]
        if params.get("blocks"):
            message["blocks"] = params["blocks"]
        message["pings"] = pings(text, blocks)
        self.messages.setdefault(channel, []).append(message)
        return {"channel": channel, "ts": message["ts"], "message": message}

    def _find(self, channel: str, ts: str) -> dict[str, Any] | None:
        return next((m for m in self.messages.get(channel, []) if m["ts"] == ts), None)

    async def _m_chat_update(self, token: str, params: dict[str, Any]) -> Any:
        """Like Slack (docs.slack.dev, chat.update): given `blocks` replace the message's (`[]`
        removes them); without `blocks`, a given `text` removes them too and is what the message
        shows; with neither, nothing changes."""
        message = self._find(str(params.get("channel")), str(params.get("ts")))
        if message is None:
            return "message_not_found"
        if "text" not in params and "blocks" not in params:
            return "no_text"
        blocks = params.get("blocks") if "blocks" in params else None
        if any(len(str(t.get("text") or "")) > 3000 for t in _section_texts(blocks)):
            return "invalid_blocks"
        if "text" in params:
            message["text"] = params.get("text") or ""
        if blocks or "text" in params:
            message.pop("blocks", None)
        if blocks:
            message["blocks"] = blocks
        message["pings"] = pings(message["text"], message.get("blocks") or [])
        message["edited"] = {"user": self.workspace(token).bot_user_id, "ts": self.new_ts()}
        return {"channel": params["channel"], "ts": params["ts"], "text": message["text"]}

    async def _m_chat_delete(self, token: str, params: dict[str, Any]) -> Any:
        channel = str(params.get("channel"))
        message = self._find(channel, str(params.get("ts")))
        if message is None:
            return "message_not_found"
        self.messages[channel].remove(message)
        return {"channel": channel, "ts": params["ts"]}

    async def _m_reactions_add(self, token: str, params: dict[str, Any]) -> Any:
        if self._find(str(params.get("channel")), str(params.get("timestamp"))) is None:
            return "message_not_found"
        self.reactions.append(dict(params))
        return {}

    async def _m_users_info(self, token: str, params: dict[str, Any]) -> Any:
        user = self.users.get(str(params.get("user")))
        return {"user": user} if user else "user_not_found"

    async def _m_conversations_info(self, token: str, params: dict[str, Any]) -> Any:
        info = self.conversations.get(str(params.get("channel")))
        return {"channel": info} if info else "channel_not_found"

    async def _m_conversations_members(self, token: str, params: dict[str, Any]) -> Any:
        channel = str(params.get("channel"))
        if channel not in self.conversations:
            return "channel_not_found"
        members = self.members.get(channel, [])
        return {"members": members, "response_metadata": {"next_cursor": ""}}

    def _window(self, items: list[dict[str, Any]], params: dict[str, Any]) -> list[dict[str, Any]]:
        latest = params.get("latest")
        if latest:
            inclusive = str(params.get("inclusive", "false")).lower() in ("1", "true")
            items = [
                m
                for m in items
                if float(m["ts"]) < float(latest) or (inclusive and m["ts"] == latest)
            ]
        return items

    async def _m_conversations_history(self, token: str, params: dict[str, Any]) -> Any:
        channel = str(params.get("channel"))
        top = [
            m
            for m in self.messages.get(channel, [])
            if not m.get("thread_ts") or m.get("thread_ts") == m["ts"]
        ]
        items = self._window(top, params)
        limit = int(params.get("limit") or 100)
        newest_first = list(reversed(items))[:limit]
        return {"messages": newest_first, "has_more": len(items) > limit}

    async def _m_conversations_replies(self, token: str, params: dict[str, Any]) -> Any:
        channel = str(params.get("channel"))
        root = str(params.get("ts"))
        thread = [
            m
            for m in self.messages.get(channel, [])
            if m["ts"] == root or m.get("thread_ts") == root
        ]
        if not thread:
            return "thread_not_found"
        items = self._window(thread, params)
        limit = int(params.get("limit") or 100)
        return {"messages": items[-limit:], "has_more": len(items) > limit}

    async def _m_files_getUploadURLExternal(self, token: str, params: dict[str, Any]) -> Any:
        file_id = f"F{next(self._ids):08d}"
        name = str(params.get("filename") or "file")
        self.files[file_id] = {
            "id": file_id,
            "name": name,
            "title": name,
            "size": int(params.get("length") or 0),
            "mimetype": "application/octet-stream",
            "data": None,
            "shared": False,
        }
        return {"upload_url": f"{self.base_url}/upload/{file_id}", "file_id": file_id}

    async def _upload(self, request: web.Request) -> web.StreamResponse:
        file = self.files.get(request.match_info["file_id"])
        if file is None:
            return web.Response(status=404, text="no such upload")
        if request.content_type.startswith("multipart/"):
            reader = await request.multipart()
            part = await reader.next()
            data = await part.read() if isinstance(part, aiohttp.BodyPartReader) else b""
        else:
            data = await request.read()
        file["data"] = bytes(data)
        file["size"] = len(data)
        self._notify()
        return web.Response(text=f"OK - {len(data)}", content_type="text/plain")

    async def _m_files_completeUploadExternal(self, token: str, params: dict[str, Any]) -> Any:
        entries = params.get("files") or []
        done = []
        for entry in entries:
            file = self.files.get(str(entry.get("id")))
            if file is None or file["data"] is None:
                return "upload_not_found"
            file["title"] = entry.get("title") or file["name"]
            file["shared"] = True
            file["channel"] = params.get("channel_id")
            file["thread_ts"] = params.get("thread_ts")
            done.append({"id": file["id"], "title": file["title"], "name": file["name"]})
        return {"files": done}

    async def _m_files_info(self, token: str, params: dict[str, Any]) -> Any:
        file = self.files.get(str(params.get("file")))
        if file is None:
            return "file_not_found"
        public = {k: v for k, v in file.items() if k != "data"}
        # A test may set its own URL on the file (e.g. a foreign host the token must not reach).
        public.setdefault(
            "url_private_download", f"{self.base_url}/files/{file['id']}/{file['name']}"
        )
        return {"file": public}

    async def _download(self, request: web.Request) -> web.StreamResponse:
        token = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        self.calls.append(Call(token, "download", {"file": request.match_info["file_id"]}))
        self._notify()
        if token not in self.workspaces or token in self._revoked:
            return web.Response(status=403, text="forbidden")
        file = self.files.get(request.match_info["file_id"])
        if file is None or file["data"] is None:
            return web.Response(status=404, text="not found")
        return web.Response(body=file["data"], content_type="application/octet-stream")

    def add_file(self, data: bytes, name: str = "notes.txt", mimetype: str = "text/plain") -> str:
        """A file someone shared; returns its id (for `files` in a message event)."""
        file_id = f"F{next(self._ids):08d}"
        self.files[file_id] = {
            "id": file_id,
            "name": name,
            "title": name,
            "size": len(data),
            "mimetype": mimetype,
            "data": data,
            "shared": True,
        }
        return file_id

    async def _m_assistant_threads_setStatus(self, token: str, params: dict[str, Any]) -> Any:
        self.statuses.append(dict(params))
        return {}


# ---- what Slack shows of a message -------------------------------------------------------------


def shown(message: dict[str, Any]) -> str:
    """The text a person sees: a message with blocks shows them (its `text` is then only the
    notification's fallback), else its `text`."""
    if not message.get("blocks"):
        return str(message.get("text") or "")
    return "\n".join(str(t.get("text") or "") for t in _section_texts(message["blocks"]))


def buttons_of(message: dict[str, Any]) -> list[tuple[str, str]]:
    """The (label, value) of the buttons in the message's `actions` blocks."""
    return [
        (element["text"]["text"], element["value"])
        for block in message.get("blocks") or []
        if block.get("type") == "actions"
        for element in block.get("elements") or []
        if element.get("type") == "button"
    ]


# ---- what Slack checks in a posted message -----------------------------------------------------


def _section_texts(blocks: Any) -> list[dict[str, Any]]:
    """The text objects of the blocks: each block's `text` and its `fields`."""
    found: list[dict[str, Any]] = []
    for block in blocks if isinstance(blocks, list) else []:
        if not isinstance(block, dict):
            continue
        items = [block.get("text"), *(block.get("fields") or [])]
        found += [item for item in items if isinstance(item, dict)]
    return found


_MANUAL = re.compile(r"<!(here|channel|everyone)(?:\|[^>]*)?>")
_AUTOMATIC = re.compile(r"(?<![\w@])@(here|channel|everyone)\b")


def pings(text: str, blocks: Any) -> list[str]:
    """The special mentions (`here`, `channel`, `everyone`) a posted message notifies people of.

    `<!here>` always does. The message's `text` is posted with `parse=none` (chat.postMessage's
    default), so a plain `@here` there stays text; a block's `mrkdwn` text object is parsed
    automatically unless it says `verbatim: true`, and there a plain `@here` notifies too.
    """
    found: list[str] = _MANUAL.findall(text)
    for item in _section_texts(blocks):
        value = str(item.get("text") or "")
        found += _MANUAL.findall(value)
        if item.get("type") == "mrkdwn" and not item.get("verbatim"):
            found += _AUTOMATIC.findall(value)
    return found


# ---- event builders (Events API shapes) -------------------------------------------------------

_numbers = itertools.count(1)


def message_event(
    user: str,
    text: str,
    *,
    channel: str = "D0DM00001",
    ts: str | None = None,
    thread_ts: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A `message` event (DM by default: channel ids starting with D are IMs; a group DM
    passes `channel_type="mpim"`)."""
    ts = ts or f"{int(time.time())}.{next(_numbers):06d}"
    event: dict[str, Any] = {
        "type": "message",
        "channel": channel,
        "user": user,
        "text": text,
        "ts": ts,
        "event_ts": ts,
        "channel_type": "im" if channel.startswith("D") else "channel",
        **extra,
    }
    if thread_ts:
        event["thread_ts"] = thread_ts
    return event


def deleted_event(channel: str, ts: str) -> dict[str, Any]:
    """A user deleted their message `ts` (one without thread replies): `message_deleted`."""
    return {
        "type": "message",
        "subtype": "message_deleted",
        "hidden": True,
        "channel": channel,
        "ts": f"{int(time.time())}.{next(_numbers):06d}",
        "deleted_ts": ts,
        "channel_type": "im" if channel.startswith("D") else "channel",
    }


def edit_event(original: dict[str, Any], text: str, edit_ts: str) -> dict[str, Any]:
    """The `message_changed` event Slack sends when `original`'s author edits it to `text`."""
    return {
        "type": "message",
        "subtype": "message_changed",
        "hidden": True,
        "channel": original["channel"],
        "ts": edit_ts,
        "channel_type": original["channel_type"],
        "message": {**original, "text": text, "edited": {"user": original["user"], "ts": edit_ts}},
        "previous_message": original,
    }


def tombstone_event(
    channel: str, ts: str, *, user: str, text: str, reply_ts: str
) -> dict[str, Any]:
    """What Slack sends when `user` deletes a message that has thread replies: no
    `message_deleted`, but a `message_changed` leaving a placeholder (subtype `tombstone`) where
    the message was, so its thread stays readable. Once its last reply goes too, a
    `message_deleted` of the placeholder (`placeholder_deleted_event`) follows."""
    return {
        "type": "message",
        "subtype": "message_changed",
        "hidden": True,
        "channel": channel,
        "channel_type": "im" if channel.startswith("D") else "channel",
        "ts": f"{int(time.time())}.{next(_numbers):06d}",
        "message": _placeholder(ts, reply_ts),
        "previous_message": {
            "type": "message",
            "user": user,
            "text": text,
            "ts": ts,
            "thread_ts": ts,
            "reply_count": 1,
            "latest_reply": reply_ts,
        },
    }


def placeholder_deleted_event(channel: str, ts: str, *, reply_ts: str) -> dict[str, Any]:
    """The `message_deleted` of a deleted message's placeholder, once its replies are gone."""
    return {
        "type": "message",
        "subtype": "message_deleted",
        "hidden": True,
        "channel": channel,
        "channel_type": "im" if channel.startswith("D") else "channel",
        "ts": f"{int(time.time())}.{next(_numbers):06d}",
        "deleted_ts": ts,
        "previous_message": _placeholder(ts, reply_ts),
    }


def _placeholder(ts: str, reply_ts: str) -> dict[str, Any]:
    return {
        "type": "message",
        "subtype": "tombstone",
        "text": "This message was deleted.",
        "user": "USLACKBOT",
        "hidden": True,
        "ts": ts,
        "thread_ts": ts,
        "parent_user_id": "USLACKBOT",
        "reply_count": 1,
        "latest_reply": reply_ts,
    }
