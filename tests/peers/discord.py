"""A local Discord: REST over real HTTP and the gateway over a real websocket (zlib-stream).

Point discord.py at it as users point it at a REST proxy: `api_base: peer.base_url` and
`gateway_url: peer.gateway_url` in a connection's config (the connector sets discord.py's
process-wide `Route.BASE` and `DiscordWebSocket.DEFAULT_GATEWAY` from them).

What it does like Discord:
- gateway: HELLO (`heartbeat_interval`, settable), heartbeat -> HEARTBEAT_ACK (`stop_acking`
  makes one socket a "zombie": no more ACKs, while its dispatches still flow), IDENTIFY ->
  READY (with `resume_gateway_url` back to this peer) + GUILD_CREATE per guild; dispatches
  with sequence numbers kept per session, so a RESUME replays exactly what the client missed,
  then RESUMED; a refused resume gets INVALID_SESSION (d=false) and the client identifies
  afresh; an unknown token closes with 4004.
  Binary frames from one `zlib.compressobj` per connection, flushed with Z_SYNC_FLUSH.
- REST: `Authorization: Bot <token>` (401 otherwise), JSON bodies with `Content-Type` exactly
  `application/json`, rate-limit headers on every answer with one bucket per route and major
  parameter (channel), scripted 429s with Discord's body and headers (`Retry-After`,
  `X-RateLimit-*`, `X-RateLimit-Scope`, `Via`), a global limit in force for a while
  (`limit_globally`: every call meanwhile gets a global 429), scripted 5xx, dropped sockets,
  and 200s with JSON of any shape (`answer_next`).

Every REST call is recorded (`calls`, `calls_of`, `sent`); `wait_for` awaits a condition on the
peer's state without sleeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import re
import time
import zlib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import aiohttp
from aiohttp import web

from tests.peers.http import serve
from tests.support.waiting import Waitable

API = "/api/v10"
DISCORD_EPOCH_MS = 1420070400000
GUILD_ID = "1100000000000000001"
GENERAL = "1100000000000000010"
FORUM = "1100000000000000011"
THREAD = "1100000000000000012"
MODERATORS_ROLE = "1100000000000000020"
_ids = itertools.count(1)


def snowflake() -> str:
    ms = int(time.time() * 1000) - DISCORD_EPOCH_MS
    return str((ms << 22) | (next(_ids) & 0x3FFFFF))


def iso_now() -> str:
    return datetime.now(UTC).isoformat()


def user(user_id: str, name: str, *, bot: bool = False) -> dict[str, Any]:
    data: dict[str, Any] = {
        "id": user_id,
        "username": name.lower().replace(" ", "_"),
        "global_name": name,
        "discriminator": "0",
        "avatar": None,
        "public_flags": 0,
    }
    if bot:
        data["bot"] = True
    return data


@dataclass
class Bot:
    token: str
    user: dict[str, Any]
    application_id: str
    role_id: str
    revoked: bool = False
    app_flags: int = 1 << 19
    """The application's flags: the Message Content intent switched on (a bot in < 100 servers)."""

    @property
    def id(self) -> str:
        return str(self.user["id"])


@dataclass
class Call:
    """One REST request as the peer saw it; `status` is the answer (0: connection dropped)."""

    token: str | None
    method: str
    path: str
    route: str
    json: Any
    status: int = 200


@dataclass
class Session:
    session_id: str
    token: str
    events: list[dict[str, Any]] = field(default_factory=list)
    seq: int = 0
    socket: Gateway | None = None


class Gateway:
    """One websocket connection: zlib-stream framing and the send lock."""

    def __init__(self, ws: web.WebSocketResponse, compress: bool) -> None:
        self.ws = ws
        self.acking = True
        """False: a zombie connection, whose heartbeats Discord no longer acknowledges."""
        self._zlib = zlib.compressobj() if compress else None
        self._lock = asyncio.Lock()

    async def send(self, frame: dict[str, Any]) -> None:
        data = json.dumps(frame)
        async with self._lock:
            if self.ws.closed:
                return
            if self._zlib is not None:
                chunk = self._zlib.compress(data.encode()) + self._zlib.flush(zlib.Z_SYNC_FLUSH)
                await self.ws.send_bytes(chunk)
            else:
                await self.ws.send_str(data)


@dataclass
class _Scripted:
    method: str
    route: str
    status: int
    channel_id: str | None = None
    token: str | None = None
    retry_after: float = 1.0
    is_global: bool = False
    drop: bool = False
    lose_answer: bool = False
    """Do what was asked (create the message), then drop the connection before answering."""
    proxy: bool = False
    body: Any = None
    """A scripted 200's JSON, whatever its shape (an error status gets Discord's own body)."""
    after: int = 0
    """Matching calls to let pass first (e.g. fail the third part of a split reply)."""


_ROUTES: list[tuple[str, str]] = [
    ("GET", "/users/@me"),
    ("GET", "/users/@me/guilds"),
    ("GET", "/oauth2/applications/@me"),
    ("GET", "/gateway"),
    ("GET", "/gateway/bot"),
    ("POST", "/channels/{channel_id}/messages"),
    ("GET", "/channels/{channel_id}/messages"),
    ("PATCH", "/channels/{channel_id}/messages/{message_id}"),
    ("DELETE", "/channels/{channel_id}/messages/{message_id}"),
    ("PUT", "/channels/{channel_id}/messages/{message_id}/reactions/{emoji}/@me"),
    ("POST", "/channels/{channel_id}/typing"),
    ("GET", "/channels/{channel_id}"),
    ("GET", "/users/{user_id}"),
    ("POST", "/interactions/{interaction_id}/{interaction_token}/callback"),
]


def _compile(template: str) -> re.Pattern[str]:
    pattern = re.sub(
        r"\{(\w+)\}", r"(?P<\1>[^/]+)", re.escape(template).replace(r"\{", "{").replace(r"\}", "}")
    )
    return re.compile(f"^{pattern}$")


_COMPILED = [(method, template, _compile(template)) for method, template in _ROUTES]


class DiscordPeer(Waitable):
    def __init__(self, tokens: dict[str, str] | None = None, *, bucket_limit: int = 10) -> None:
        self.bots: dict[str, Bot] = {}
        for token, name in (tokens or {}).items():
            self.add_bot(token, name)
        self.bucket_limit = bucket_limit
        self.calls: list[Call] = []
        self.sessions: dict[str, Session] = {}
        self.identifies: list[str] = []
        self.resumes: list[tuple[str, bool]] = []
        self.heartbeats = 0
        self.unacknowledged = 0
        """Heartbeats a zombie socket (`stop_acking`) got no ACK for."""
        self.heartbeat_interval = 41.25
        """Seconds, sent in HELLO (Discord's usual 41,250 ms)."""
        self.channels: dict[str, dict[str, Any]] = {}
        self.messages: dict[str, list[dict[str, Any]]] = {}
        self.users: dict[str, dict[str, Any]] = {}
        self._refuse_resume: set[str] = set()
        self._identify_close: dict[str, int] = {}
        self._refused_handshakes = 0
        self.handshakes_refused = 0
        self._scripted: list[_Scripted] = []
        self._global_until: dict[str, float] = {}
        """Per token: until when (monotonic) each REST call gets a global 429 (`limit_globally`)."""
        self._stale_nonces: set[str] = set()
        """Messages whose nonce no longer counts (`nonces_expire`)."""
        self._gates: list[tuple[str, str, asyncio.Event]] = []
        self._buckets: dict[str, tuple[float, int]] = {}
        self._changed = asyncio.Event()
        self._sockets: set[web.WebSocketResponse] = set()
        self._runner: web.AppRunner | None = None
        self.port = 0
        self._guild_setup()

    # ---- lifecycle ---------------------------------------------------------------------------

    async def __aenter__(self) -> DiscordPeer:
        app = web.Application()
        app.router.add_get("/gateway", self._gateway)
        app.router.add_route("*", API + "/{tail:.*}", self._rest)
        self._runner, self.port = await serve(app)
        return self

    async def __aexit__(self, *exc: object) -> None:
        for ws in list(self._sockets):
            with contextlib.suppress(Exception):
                await ws.close(code=1001)
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}{API}"

    @property
    def gateway_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/gateway"

    # ---- world -------------------------------------------------------------------------------

    def add_bot(self, token: str, name: str = "talkbridge") -> Bot:
        bot_id = snowflake()
        bot = Bot(token, user(bot_id, name, bot=True), application_id=bot_id, role_id=snowflake())
        self.bots[token] = bot
        return bot

    def revoke(self, token: str) -> None:
        self.bots[token].revoked = True

    def _guild_setup(self) -> None:
        self.channels[GENERAL] = {
            "id": GENERAL, "type": 0, "name": "general", "position": 0, "parent_id": None,
            "permission_overwrites": [], "nsfw": False, "topic": None, "last_message_id": None,
            "rate_limit_per_user": 0, "guild_id": GUILD_ID,
        }  # fmt: skip
        self.channels[FORUM] = {
            "id": FORUM, "type": 15, "name": "help-forum", "position": 1, "parent_id": None,
            "permission_overwrites": [], "nsfw": False, "topic": None, "last_message_id": None,
            "rate_limit_per_user": 0, "available_tags": [], "default_reaction_emoji": None,
            "default_sort_order": None, "default_forum_layout": 0, "flags": 0, "guild_id": GUILD_ID,
        }  # fmt: skip
        self.channels[THREAD] = {
            "id": THREAD, "type": 11, "name": "printer on fire", "parent_id": FORUM,
            "guild_id": GUILD_ID, "owner_id": "1", "message_count": 0, "member_count": 1,
            "rate_limit_per_user": 0, "flags": 0, "applied_tags": [],
            "thread_metadata": {
                "archived": False, "auto_archive_duration": 1440,
                "archive_timestamp": "2024-01-01T00:00:00+00:00", "locked": False,
            },
        }  # fmt: skip

    def _roles(self) -> list[dict[str, Any]]:
        def role(role_id: str, name: str, **extra: Any) -> dict[str, Any]:
            return {
                "id": role_id, "name": name, "color": 0, "hoist": False, "icon": None,
                "unicode_emoji": None, "position": 0, "permissions": "1024", "managed": False,
                "mentionable": True, "flags": 0, **extra,
            }  # fmt: skip

        roles = [role(GUILD_ID, "@everyone"), role(MODERATORS_ROLE, "Moderators")]
        for bot in self.bots.values():
            roles.append(
                role(bot.role_id, str(bot.user["global_name"]), managed=True,
                     tags={"bot_id": bot.id})
            )  # fmt: skip
        return roles

    def guild_create(self, bot: Bot) -> dict[str, Any]:
        member = {
            "user": bot.user, "roles": [bot.role_id], "joined_at": "2024-01-01T00:00:00+00:00",
            "deaf": False, "mute": False, "flags": 0, "nick": None, "avatar": None,
        }  # fmt: skip
        channels = [
            {k: v for k, v in c.items() if k != "guild_id"}
            for c in self.channels.values()
            if c["type"] in (0, 15)
        ]
        threads = [c for c in self.channels.values() if c["type"] == 11]
        return {
            "id": GUILD_ID, "name": "Test Server", "icon": None, "owner_id": "1",
            "afk_timeout": 300, "verification_level": 0, "default_message_notifications": 0,
            "explicit_content_filter": 0, "roles": self._roles(), "emojis": [], "stickers": [],
            "features": [], "mfa_level": 0, "system_channel_flags": 0, "premium_tier": 0,
            "preferred_locale": "en-US", "nsfw_level": 0, "premium_progress_bar_enabled": False,
            "unavailable": False, "member_count": 2, "large": False, "joined_at": iso_now(),
            "members": [member], "channels": channels, "threads": threads, "presences": [],
            "voice_states": [], "stage_instances": [], "guild_scheduled_events": [],
            "soundboard_sounds": [],
        }  # fmt: skip

    def person(self, name: str, user_id: str | None = None) -> dict[str, Any]:
        data = user(user_id or snowflake(), name)
        self.users[data["id"]] = data
        return data

    def message(
        self,
        author: dict[str, Any],
        content: str,
        *,
        channel_id: str | None = None,
        guild: bool = True,
        mentions: list[dict[str, Any]] = (),  # type: ignore[assignment]
        roles: list[str] = (),  # type: ignore[assignment]
        reply_to: dict[str, Any] | None = None,
        nick: str | None = None,
    ) -> dict[str, Any]:
        """A MESSAGE_CREATE payload as Discord sends it (recorded in the channel's history)."""
        channel = channel_id or (GENERAL if guild else f"dm-{author['id']}")
        if not guild and channel.startswith("dm-"):
            channel = str(int(author["id"]) + 7)  # a stable DM channel id per user
        data: dict[str, Any] = {
            "id": snowflake(), "type": 19 if reply_to else 0, "channel_id": channel,
            "author": author, "content": content, "timestamp": iso_now(),
            "edited_timestamp": None, "tts": False, "mention_everyone": "@everyone" in content,
            "mentions": [dict(m) for m in mentions], "mention_roles": [], "attachments": [],
            "embeds": [], "pinned": False, "flags": 0, "components": [],
        }  # fmt: skip
        if guild:
            data["guild_id"] = GUILD_ID
            data["member"] = {
                "roles": list(roles), "joined_at": "2024-01-01T00:00:00+00:00", "deaf": False,
                "mute": False, "flags": 0, "nick": nick, "avatar": None,
            }  # fmt: skip
        if reply_to is not None:
            data["message_reference"] = {
                "type": 0, "message_id": reply_to["id"], "channel_id": reply_to["channel_id"],
            }  # fmt: skip
            if guild:
                data["message_reference"]["guild_id"] = GUILD_ID
            data["referenced_message"] = reply_to
        self.messages.setdefault(channel, []).append(data)
        return data

    # ---- gateway -----------------------------------------------------------------------------

    def dispatch(self, token: str, event: str, data: dict[str, Any]) -> None:
        """Queue a dispatch on the bot's session; sent now if connected, else on resume."""
        session = self._live_session(token)
        if session is None:
            raise LookupError("that bot never identified: nothing to dispatch to")
        session.seq += 1
        frame = {"op": 0, "t": event, "s": session.seq, "d": data}
        session.events.append(frame)
        if session.socket is not None:
            asyncio.get_running_loop().create_task(session.socket.send(frame))

    def _keep_flowing(self, socket: Gateway) -> None:
        """A zombie's traffic: a dispatch on its session, sent as any other."""
        session = next((s for s in self.sessions.values() if s.socket is socket), None)
        if session is not None:
            typing = {"channel_id": GENERAL, "guild_id": GUILD_ID, "user_id": "1",
                      "timestamp": int(time.time())}  # fmt: skip
            self.dispatch(session.token, "TYPING_START", typing)

    def _live_session(self, token: str) -> Session | None:
        found = [s for s in self.sessions.values() if s.token == token]
        return found[-1] if found else None

    async def drop(self, token: str) -> None:
        """Drop the bot's gateway socket as a network failure would (the session stays)."""
        session = self._live_session(token)
        if session is None or session.socket is None:
            return
        ws = session.socket.ws
        session.socket = None
        await ws.close(code=4000, message=b"dropped by the peer")

    def stop_acking(self, token: str) -> None:
        """Make the bot's current gateway socket a zombie, as Discord's docs describe one: its
        heartbeats get no HEARTBEAT_ACK any more, while dispatches still flow on it (each
        unacknowledged heartbeat is followed by a TYPING_START, so the client keeps receiving
        traffic). The session is kept: a RESUME on a new socket is acknowledged as usual."""
        session = self._live_session(token)
        if session is None or session.socket is None:
            raise LookupError("that bot has no gateway socket open")
        session.socket.acking = False

    def refuse_next_resume(self, token: str) -> None:
        self._refuse_resume.add(token)

    def close_on_identify(self, token: str, code: int) -> None:
        """Answer the bot's IDENTIFYs by closing the socket with `code` (4011: the bot is in too
        many servers for one connection; 4013: the intents are not a valid bitfield)."""
        self._identify_close[token] = code

    def connected(self, token: str) -> bool:
        session = self._live_session(token)
        return session is not None and session.socket is not None

    def refuse_gateway(self, times: int) -> None:
        """The next `times` gateway handshakes are answered 503 (Discord's gateway having an
        outage): discord.py retries with its backoff."""
        self._refused_handshakes = times

    async def _gateway(self, request: web.Request) -> web.StreamResponse:
        if self._refused_handshakes > 0:
            self._refused_handshakes -= 1
            self.handshakes_refused += 1
            self._notify()
            return web.Response(status=503, text="upstream connect error")
        ws = web.WebSocketResponse(autoping=True, max_msg_size=0)
        await ws.prepare(request)
        self._sockets.add(ws)
        socket = Gateway(ws, request.query.get("compress") == "zlib-stream")
        try:
            interval = round(self.heartbeat_interval * 1000)
            await socket.send(
                {"op": 10, "s": None, "t": None, "d": {"heartbeat_interval": interval}}
            )
            async for msg in ws:
                if msg.type is not aiohttp.WSMsgType.TEXT:
                    continue
                frame = json.loads(msg.data)
                await self._on_frame(socket, frame)
        finally:
            self._sockets.discard(ws)
            for session in self.sessions.values():
                if session.socket is socket:
                    session.socket = None
            self._notify()
        return ws

    async def _on_frame(self, socket: Gateway, frame: dict[str, Any]) -> None:
        op = frame.get("op")
        data = frame.get("d")
        if op == 1:
            self.heartbeats += 1
            if socket.acking:
                await socket.send({"op": 11, "s": None, "t": None, "d": None})
            else:
                self.unacknowledged += 1
                self._keep_flowing(socket)
        elif op == 2:
            await self._identify(socket, data or {})
        elif op == 6:
            await self._resume(socket, data or {})
        self._notify()

    async def _identify(self, socket: Gateway, data: dict[str, Any]) -> None:
        bot = self.bots.get(str(data.get("token")))
        if bot is None or bot.revoked:
            await socket.ws.close(code=4004, message=b"Authentication failed.")
            return
        if bot.token in self._identify_close:
            await socket.ws.close(code=self._identify_close[bot.token])
            return
        self.identifies.append(bot.token)
        session = Session(session_id=snowflake(), token=bot.token, socket=socket)
        self.sessions[session.session_id] = session
        ready = {
            "v": 10, "user": bot.user, "guilds": [{"id": GUILD_ID, "unavailable": True}],
            "session_id": session.session_id, "resume_gateway_url": self.gateway_url,
            "session_type": "normal", "shard": [0, 1], "private_channels": [],
            "application": {"id": bot.application_id, "flags": 0},
        }  # fmt: skip
        for event, payload in (("READY", ready), ("GUILD_CREATE", self.guild_create(bot))):
            session.seq += 1
            frame = {"op": 0, "t": event, "s": session.seq, "d": payload}
            session.events.append(frame)
            await socket.send(frame)

    async def _resume(self, socket: Gateway, data: dict[str, Any]) -> None:
        session = self.sessions.get(str(data.get("session_id")))
        token = str(data.get("token"))
        refused = token in self._refuse_resume or session is None or session.token != token
        self.resumes.append((token, not refused))
        if refused or session is None:
            self._refuse_resume.discard(token)
            if session is not None:
                del self.sessions[session.session_id]
            await socket.send({"op": 9, "s": None, "t": None, "d": False})
            return
        session.socket = socket
        seq = int(data.get("seq") or 0)
        for frame in [f for f in session.events if f["s"] > seq]:
            await socket.send(frame)
        session.seq += 1
        resumed = {"op": 0, "t": "RESUMED", "s": session.seq, "d": {}}
        session.events.append(resumed)
        await socket.send(resumed)

    # ---- REST: scripting ---------------------------------------------------------------------

    def rate_limit(
        self,
        method: str,
        route: str,
        *,
        retry_after: float = 1.0,
        channel_id: str | None = None,
        token: str | None = None,
        is_global: bool = False,
        proxy: bool = False,
        after: int = 0,
    ) -> None:
        """Answer the next matching call with a 429 exactly as Discord does; `proxy`: as a
        proxy or Cloudflare does, with `Retry-After` and none of Discord's own headers;
        `after`: let that many matching calls pass first."""
        self._scripted.append(
            _Scripted(
                method,
                route,
                429,
                channel_id,
                token,
                retry_after,
                is_global,
                proxy=proxy,
                after=after,
            )
        )

    def limit_globally(self, token: str, seconds: float) -> None:
        """Put the bot under Discord's global rate limit for `seconds`: every REST call of it
        meanwhile is answered a global 429 whose `retry_after` is what is left of the limit
        (and, at Discord, counts toward Cloudflare's ban of the IP address)."""
        self._global_until[token] = time.monotonic() + seconds

    def nonces_expire(self) -> None:
        """The few minutes pass in which Discord holds a nonce unique: a message sent later
        with the nonce of one sent so far is created anew."""
        self._stale_nonces.update(m["id"] for ms in self.messages.values() for m in ms)

    def fail_next(
        self,
        method: str,
        route: str,
        *,
        status: int = 500,
        channel_id: str | None = None,
        token: str | None = None,
        drop: bool = False,
        times: int = 1,
    ) -> None:
        """Answer the next `times` matching calls with `status` (or drop their connection)."""
        for _ in range(times):
            self._scripted.append(_Scripted(method, route, status, channel_id, token, drop=drop))

    def lose_next_answer(self, method: str, route: str, *, channel_id: str | None = None) -> None:
        """Carry out the next matching call, then drop its connection before the answer: the
        client cannot tell it from a call that never arrived."""
        self._scripted.append(_Scripted(method, route, 200, channel_id, lose_answer=True))

    def answer_next(
        self, method: str, route: str, body: Any, *, token: str | None = None, times: int = 1
    ) -> None:
        """Answer the next `times` matching calls with 200 and `body` as JSON, whatever its
        shape: what a proxy or a service that is not Discord's API may send."""
        for _ in range(times):
            self._scripted.append(_Scripted(method, route, 200, token=token, body=body))

    def hold(self, method: str, route: str) -> asyncio.Event:
        """Keep every matching call waiting until the returned event is set."""
        gate = asyncio.Event()
        self._gates.append((method, route, gate))
        return gate

    def calls_of(
        self, method: str, route: str, *, answered: int | None = 200, token: str | None = None
    ) -> list[Call]:
        return [
            c
            for c in self.calls
            if c.method == method
            and c.route == route
            and (answered is None or c.status == answered)
            and (token is None or c.token == token)
        ]

    def sent(self, token: str | None = None, channel_id: str | None = None) -> list[dict[str, Any]]:
        """Bodies of messages the bot(s) created, in order."""
        return [
            c.json
            for c in self.calls_of("POST", "/channels/{channel_id}/messages", token=token)
            if channel_id is None or c.path.split("/")[2] == channel_id
        ]

    # ---- REST: serving -----------------------------------------------------------------------

    def _bucket_headers(self, route: str, major: str, *, exhausted: bool = False) -> dict[str, str]:
        key = f"{route}:{major}"
        now = time.time()
        started, used = self._buckets.get(key, (now, 0))
        if now - started >= 1.0:
            started, used = now, 0
        used += 1
        self._buckets[key] = (started, used)
        reset_after = max(0.001, 1.0 - (now - started))
        return {
            "X-RateLimit-Limit": str(self.bucket_limit),
            "X-RateLimit-Remaining": "0" if exhausted else str(max(0, self.bucket_limit - used)),
            "X-RateLimit-Reset": f"{now + reset_after:.3f}",
            "X-RateLimit-Reset-After": f"{reset_after:.3f}",
            "X-RateLimit-Bucket": format(abs(hash(route)) % (1 << 64), "x"),
        }

    @staticmethod
    def _json(status: int, body: Any, headers: dict[str, str] | None = None) -> web.Response:
        # Exactly `application/json`: with a charset discord.py reads the body as text.
        return web.Response(
            status=status,
            body=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", "Via": "1.1 google", **(headers or {})},
        )

    async def _rest(self, request: web.Request) -> web.StreamResponse:
        path = "/" + request.match_info["tail"]
        method = request.method
        auth = request.headers.get("Authorization", "")
        token = auth[4:] if auth.startswith("Bot ") else None
        match = next(
            ((t, m) for meth, t, rx in _COMPILED if meth == method and (m := rx.match(path))),
            None,
        )
        route, params = (match[0], match[1].groupdict()) if match else (path, {})
        body = await self._body(request)
        call = Call(token, method, path, route, body)
        self.calls.append(call)
        try:
            return await self._answer(call, params, request)
        finally:
            self._notify()

    async def _body(self, request: web.Request) -> Any:
        if not request.can_read_body:
            return None
        if request.content_type.startswith("multipart/"):
            form = await request.post()
            payload = json.loads(str(form.get("payload_json") or "{}"))
            payload["_files"] = [
                getattr(v, "filename", None) for k, v in form.items() if k.startswith("files[")
            ]
            return payload
        raw = await request.read()
        return json.loads(raw) if raw else None

    async def _answer(
        self, call: Call, params: dict[str, str], request: web.Request
    ) -> web.StreamResponse:
        bot = self.bots.get(call.token or "")
        if call.route.startswith("/interactions/"):  # authorized by the interaction token
            bot = bot or next(iter(self.bots.values()))
        elif bot is None or bot.revoked:
            call.status = 401
            return self._json(401, {"message": "401: Unauthorized", "code": 0})
        major = params.get("channel_id", "")
        left = self._global_until.get(call.token or "", 0.0) - time.monotonic()
        if left > 0:
            limited = _Scripted(call.method, call.route, 429, retry_after=left, is_global=True)
            return await self._scripted_answer(limited, call, major, request)
        for method, route, gate in self._gates:
            if method == call.method and route == call.route:
                self._notify()  # the call is recorded: a test may wait for it
                await gate.wait()
        lost: _Scripted | None = None
        for scripted in self._scripted:
            if (
                scripted.method == call.method
                and scripted.route == call.route
                and (scripted.channel_id is None or scripted.channel_id == major)
                and (scripted.token is None or scripted.token == call.token)
            ):
                if scripted.after:  # this one passes untouched
                    scripted.after -= 1
                    break
                self._scripted.remove(scripted)
                if not scripted.lose_answer:
                    return await self._scripted_answer(scripted, call, major, request)
                lost = scripted
                break
        headers = self._bucket_headers(call.route, major)
        name = re.sub(r"\W+", "_", f"{call.method} {call.route}").strip("_")
        handler = getattr(self, "_r_" + name, None)
        if handler is None:
            call.status = 404
            return self._json(404, {"message": "404: Not Found", "code": 0}, headers)
        status, body = handler(bot, params, call.json or {}, request)
        call.status = status
        if lost is not None:
            call.status = 0
            assert request.transport is not None
            request.transport.close()
            raise asyncio.CancelledError  # done, but the answer never leaves
        if status == 204:
            return web.Response(status=204, headers=headers)
        return self._json(status, body, headers)

    async def _scripted_answer(
        self, scripted: _Scripted, call: Call, major: str, request: web.Request
    ) -> web.StreamResponse:
        if scripted.drop:
            call.status = 0
            assert request.transport is not None
            request.transport.close()
            raise asyncio.CancelledError  # aiohttp drops the connection without an answer
        call.status = scripted.status
        if scripted.status == 200:
            return self._json(200, scripted.body, self._bucket_headers(call.route, major))
        if scripted.status != 429:
            reason = web.Response(status=scripted.status).reason
            body = {"message": f"{scripted.status}: {reason}", "code": 0}
            return self._json(scripted.status, body)
        if scripted.proxy:
            return web.Response(
                status=429,
                text="error code: 1015",
                headers={"Retry-After": str(math.ceil(scripted.retry_after))},
            )
        headers = self._bucket_headers(call.route, major, exhausted=True)
        headers.update(
            {
                "Retry-After": str(math.ceil(scripted.retry_after)),
                "X-RateLimit-Reset-After": f"{scripted.retry_after:.3f}",
                "X-RateLimit-Reset": f"{time.time() + scripted.retry_after:.3f}",
                "X-RateLimit-Scope": "user",
            }
        )
        if scripted.is_global:
            headers["X-RateLimit-Global"] = "true"
            headers["X-RateLimit-Scope"] = "global"
        body = {
            "message": "You are being rate limited.",
            "retry_after": scripted.retry_after,
            "global": scripted.is_global,
        }
        return self._json(429, body, headers)

    # one method per route: (bot, path params, json body, request) -> (status, body)

    def _r_GET_users_me(self, bot: Bot, p: dict[str, str], b: Any, r: web.Request) -> Any:
        return 200, {**bot.user, "verified": True, "mfa_enabled": False, "flags": 0}

    def _r_GET_users_me_guilds(self, bot: Bot, p: dict[str, str], b: Any, r: web.Request) -> Any:
        guild = {"id": GUILD_ID, "name": "Test Server", "icon": None, "owner": False,
                 "permissions": "2147483647", "features": []}  # fmt: skip
        return 200, [guild]

    def _r_GET_oauth2_applications_me(
        self, bot: Bot, p: dict[str, str], b: Any, r: web.Request
    ) -> Any:
        return 200, {
            "id": bot.application_id, "name": bot.user["global_name"], "icon": None,
            "description": "", "bot_public": True, "bot_require_code_grant": False,
            "owner": user("1", "Owner"), "verify_key": "0" * 64, "flags": bot.app_flags,
            "team": None, "summary": "", "bot": bot.user,
        }  # fmt: skip

    def _r_GET_gateway(self, bot: Bot, p: dict[str, str], b: Any, r: web.Request) -> Any:
        return 200, {"url": self.gateway_url}

    def _r_GET_gateway_bot(self, bot: Bot, p: dict[str, str], b: Any, r: web.Request) -> Any:
        limit = {"total": 1000, "remaining": 999, "reset_after": 0, "max_concurrency": 1}
        return 200, {"url": self.gateway_url, "shards": 1, "session_start_limit": limit}

    def _new_message(self, bot: Bot, channel_id: str, body: dict[str, Any]) -> dict[str, Any]:
        message: dict[str, Any] = {
            "id": snowflake(), "type": 0, "channel_id": channel_id, "author": bot.user,
            "content": body.get("content") or "", "timestamp": iso_now(),
            "edited_timestamp": None, "tts": False, "mention_everyone": False, "mentions": [],
            "mention_roles": [], "attachments": [], "embeds": [], "pinned": False, "flags": 0,
            "components": body.get("components") or [],
        }  # fmt: skip
        reference = body.get("message_reference")
        if reference:
            message["type"] = 19
            message["message_reference"] = {"type": 0, "channel_id": channel_id, **reference}
        return message

    def _r_POST_channels_channel_id_messages(
        self, bot: Bot, p: dict[str, str], b: Any, r: web.Request
    ) -> Any:
        if not b.get("content") and not b.get("_files") and not b.get("embeds"):
            return 400, {"message": "Cannot send an empty message", "code": 50006}
        nonce = b.get("nonce")
        if nonce is not None and b.get("enforce_nonce"):
            # Discord: "If another message was created by the same author with the same nonce,
            # that message will be returned and no new message will be created."
            for earlier in self.messages.get(p["channel_id"], []):
                if earlier["id"] in self._stale_nonces:
                    continue
                if earlier.get("nonce") == nonce and earlier["author"]["id"] == bot.id:
                    return 200, earlier
        if len(b.get("content") or "") > 2000:
            return 400, {
                "message": "Invalid Form Body", "code": 50035,
                "errors": {"content": {"_errors": [{"code": "BASE_TYPE_MAX_LENGTH",
                           "message": "Must be 2000 or fewer in length."}]}},
            }  # fmt: skip
        message = self._new_message(bot, p["channel_id"], b)
        if nonce is not None:
            message["nonce"] = nonce
        self.messages.setdefault(p["channel_id"], []).append(message)
        return 200, message

    def _r_GET_channels_channel_id_messages(
        self, bot: Bot, p: dict[str, str], b: Any, r: web.Request
    ) -> Any:
        """Like Discord: at most `limit` (1-100) messages, newest first; with `before`, the
        newest ones before it; with `after`, the oldest ones after it (still newest first)."""
        if p["channel_id"] not in self.channels and p["channel_id"] not in self.messages:
            return 404, {"message": "Unknown Channel", "code": 10003}
        limit = max(1, min(100, int(r.query.get("limit", "50"))))
        found = sorted(self.messages.get(p["channel_id"], []), key=lambda m: int(m["id"]))
        before, after = r.query.get("before"), r.query.get("after")
        if before:
            found = [m for m in found if int(m["id"]) < int(before)][-limit:]
        elif after:
            found = [m for m in found if int(m["id"]) > int(after)][:limit]
        else:
            found = found[-limit:]
        return 200, list(reversed(found))

    def _find(self, p: dict[str, str]) -> dict[str, Any] | None:
        return next(
            (m for m in self.messages.get(p["channel_id"], []) if m["id"] == p["message_id"]),
            None,
        )

    def _r_PATCH_channels_channel_id_messages_message_id(
        self, bot: Bot, p: dict[str, str], b: Any, r: web.Request
    ) -> Any:
        message = self._find(p)
        if message is None:
            return 404, {"message": "Unknown Message", "code": 10008}
        # Like Discord: a field the edit leaves out (`components` too) stays as it was.
        message.update(content=b.get("content", message["content"]), edited_timestamp=iso_now())
        if "components" in b:
            message["components"] = b["components"] or []
        return 200, message

    def _r_DELETE_channels_channel_id_messages_message_id(
        self, bot: Bot, p: dict[str, str], b: Any, r: web.Request
    ) -> Any:
        message = self._find(p)
        if message is None:
            return 404, {"message": "Unknown Message", "code": 10008}
        self.messages[p["channel_id"]].remove(message)
        return 204, None

    def _r_PUT_channels_channel_id_messages_message_id_reactions_emoji_me(
        self, bot: Bot, p: dict[str, str], b: Any, r: web.Request
    ) -> Any:
        return (
            (204, None) if self._find(p) else (404, {"message": "Unknown Message", "code": 10008})
        )

    def _r_POST_channels_channel_id_typing(
        self, bot: Bot, p: dict[str, str], b: Any, r: web.Request
    ) -> Any:
        return 204, None

    def _r_GET_channels_channel_id(
        self, bot: Bot, p: dict[str, str], b: Any, r: web.Request
    ) -> Any:
        channel = self.channels.get(p["channel_id"])
        return (200, channel) if channel else (404, {"message": "Unknown Channel", "code": 10003})

    def _r_GET_users_user_id(self, bot: Bot, p: dict[str, str], b: Any, r: web.Request) -> Any:
        found = self.users.get(p["user_id"])
        return (200, found) if found else (404, {"message": "Unknown User", "code": 10013})

    def _r_POST_interactions_interaction_id_interaction_token_callback(
        self, bot: Bot, p: dict[str, str], b: Any, r: web.Request
    ) -> Any:
        interaction = {"id": p["interaction_id"], "type": 3}
        return 200, {"interaction": interaction}
