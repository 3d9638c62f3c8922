"""A local Telegram Bot API server the real aiogram client talks to, over real HTTP.

Point a bot at it the way users point one at a self-hosted Bot API server:
`AiohttpSession(api=TelegramAPIServer.from_base(peer.base_url))`, or `api_base: peer.base_url`
in a connection's config.

What it does like Telegram:
- `/bot{token}/{method}` (method names case-insensitive), GET query or POST form / multipart /
  JSON bodies, nested objects as JSON strings (as aiogram sends them);
- `getUpdates` with real offset semantics (confirming by offset forgets older updates; an offset
  more than 10 past the last update id is ignored, as the Bot API server's queue does) and long
  polling up to `timeout`, released at once by `stop()`; 409 while a webhook is set, and to a
  long poll another getUpdates of the same token cut short (two bot instances);
  `restart_update_ids` numbers the next updates anew, as Telegram does after a quiet week;
- send methods answer real `Message` objects with per-chat message ids; uploads are kept, so
  `getFile` + `/file/bot{token}/{path}` hands them back;
- `setWebhook` records url and secret; `post_to_webhook(update)` delivers like Telegram does;
- 401 for unknown or revoked tokens (`revoke`, `unrevoke`); 403 for a chat whose user blocked
  the bot (`block`); 400
  with `migrate_to_chat_id` for a group that became a supergroup (`migrate_chat`); scripted
  failures for the next N calls of a method (`fail_next`): an error status with `retry_after`,
  or a dropped connection; or calls kept waiting until the test lets them go (`hold`).

Every call is recorded (`calls`, `calls_of`, `sent_messages`); `wait_for` awaits a condition
on them without sleeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import itertools
import json
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp
from aiohttp import web

from tests.peers.http import serve
from tests.support.waiting import Waitable

JSON_FIELDS = {
    "reply_markup",
    "reply_parameters",
    "allowed_updates",
    "entities",
    "caption_entities",
    "reaction",
    "link_preview_options",
    "media",
    "results",
    "commands",
}
INT_FIELDS = {
    "chat_id",
    "message_id",
    "message_thread_id",
    "offset",
    "limit",
    "timeout",
    "user_id",
    "from_chat_id",
}


@dataclass
class Upload:
    filename: str | None
    content_type: str | None
    data: bytes


@dataclass
class Call:
    """One request as the peer saw it; `status` is what it answered (0: connection dropped)."""

    token: str
    method: str
    params: dict[str, Any]
    files: dict[str, Upload] = field(default_factory=dict)
    status: int = 200


@dataclass
class _Failure:
    status: int
    description: str
    retry_after: int | None
    drop: bool
    migrate_to: int | None = None
    html: bool = False
    body: dict[str, Any] | None = None


def _strip_html(text: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", text))


class TelegramBotAPIPeer(Waitable):
    def __init__(
        self,
        tokens: Iterable[str] = ("123456:TEST-token_abc",),
        *,
        username: str = "talkbridge_test_bot",
    ) -> None:
        self.bots: dict[str, dict[str, Any]] = {}
        for token in tokens:
            self.add_bot(token, username=username)
        self.calls: list[Call] = []
        self.updates: dict[str, list[dict[str, Any]]] = {}
        self.webhooks: dict[str, dict[str, Any]] = {}
        self.files: dict[str, tuple[str, bytes]] = {}  # file_id -> (file_path, bytes)
        self.messages: dict[tuple[int | str, int], dict[str, Any]] = {}
        self.reactions: dict[tuple[int | str, int], list[Any]] = {}
        # per method: (only for this token, or None for any; the failure, or None to let one pass)
        self._failures: dict[str, list[tuple[str | None, _Failure | None]]] = {}
        self._gates: dict[str, asyncio.Event] = {}
        self._revoked: set[str] = set()
        self.migrated: dict[int, int] = {}
        """Groups upgraded to supergroups: old chat id -> new one (`migrate_chat`)."""
        self.blocked: set[int | str] = set()
        """Chats whose user blocked the bot (`block`): calls naming them answer 403."""
        self._message_ids: dict[int | str, itertools.count[int]] = {}
        self._update_ids = itertools.count(1000)
        self._last_update_id: dict[str, int] = {}
        self._polls: dict[str, int] = {}  # per token: getUpdates calls so far
        self._file_ids = itertools.count(1)
        self._changed = asyncio.Event()
        self._stopping = False
        self._runner: web.AppRunner | None = None
        self.port = 0

    # ---- lifecycle -------------------------------------------------------------------------

    async def start(self) -> TelegramBotAPIPeer:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/bot{token}/{method}", self._handle)
        app.router.add_get("/file/bot{token}/{path:.+}", self._download)
        self._runner, self.port = await serve(app)
        return self

    async def stop(self) -> None:
        self._stopping = True
        self._notify()  # release pending long polls
        for gate in self._gates.values():  # and held calls
            gate.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> TelegramBotAPIPeer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # ---- scripting -------------------------------------------------------------------------

    def add_bot(self, token: str, *, username: str = "talkbridge_test_bot") -> dict[str, Any]:
        bot_id = int(token.split(":", 1)[0])
        user = {"id": bot_id, "is_bot": True, "first_name": "Test Bot", "username": username}
        self.bots[token] = user
        return user

    def bot_user(self, token: str | None = None) -> dict[str, Any]:
        return self.bots[token or next(iter(self.bots))]

    def revoke(self, token: str) -> None:
        """From now on every call with this token answers 401 Unauthorized."""
        self._revoked.add(token)

    def unrevoke(self, token: str) -> None:
        """The token works again (as after the bot's owner undid a mistaken revocation)."""
        self._revoked.discard(token)

    def migrate_chat(self, old: int, new: int) -> None:
        """The group `old` became the supergroup `new`: from now on every call naming `old`
        answers 400 with `migrate_to_chat_id`, as Telegram does."""
        self.migrated[old] = new

    def block(self, chat_id: int | str) -> None:
        """The user of the private chat `chat_id` blocked the bot: from now on every call
        naming that chat answers 403, as Telegram does."""
        self.blocked.add(chat_id)

    def push_update(self, update: dict[str, Any], token: str | None = None) -> int:
        """Queue an update for `getUpdates` (an `update_id` is assigned if missing)."""
        token = token or next(iter(self.bots))
        update = dict(update)
        update.setdefault("update_id", next(self._update_ids))
        self.updates.setdefault(token, []).append(update)
        self._last_update_id[token] = int(update["update_id"])
        self._notify()
        return int(update["update_id"])

    def restart_update_ids(self, start: int) -> None:
        """Number the next updates from `start`, which may be below the ids given so far: after
        a week without updates Telegram picks the next id at random, and another Bot API server
        (a self-hosted one) has its own sequence."""
        self._update_ids = itertools.count(start)

    def fail_next(
        self,
        method: str,
        times: int = 1,
        *,
        status: int = 429,
        retry_after: int | None = None,
        description: str | None = None,
        drop: bool = False,
        migrate_to: int | None = None,
        html: bool = False,
        body: dict[str, Any] | None = None,
        after: int = 0,
        token: str | None = None,
    ) -> None:
        """The next `times` calls of `method` fail: an error answer, or a dropped connection.
        `migrate_to`: the group became the supergroup with that id (a 400 saying so); `html`:
        a proxy in front answers with its own error page; `body`: that JSON, as it is (a body
        without `description`, which the Bot API documents as optional, or `ok: false` with 200).

        `after` lets that many calls succeed first (e.g. fail the second chunk of a split);
        `token` limits the script to one bot (other bots' calls pass untouched).
        """
        if status == 429 and retry_after is None:
            retry_after = 1
        text = description or {
            429: f"Too Many Requests: retry after {retry_after}",
            502: "Bad Gateway",
            500: "Internal Server Error",
            400: "Bad Request",
            403: "Forbidden: bot was blocked by the user",
        }.get(status, "Error")
        queue = self._failures.setdefault(method.lower(), [])
        queue.extend((token, None) for _ in range(after))
        failure = _Failure(status, text, retry_after, drop, migrate_to, html, body)
        queue.extend((token, failure) for _ in range(times))

    def hold(self, method: str) -> asyncio.Event:
        """Keep every call of `method` waiting (recorded, not answered) until the returned
        event is set."""
        gate = self._gates[method.lower()] = asyncio.Event()
        return gate

    def add_file(self, content: bytes, *, file_path: str | None = None) -> str:
        """Make a file downloadable; returns its file_id."""
        number = next(self._file_ids)
        file_id = f"FILE{number:06d}"
        self.files[file_id] = (file_path or f"documents/file_{number}.bin", content)
        return file_id

    async def post_to_webhook(
        self,
        update: dict[str, Any],
        *,
        token: str | None = None,
        secret: str | bool | None = True,
        path: str | None = None,
    ) -> int:
        """Deliver an update like Telegram: POST JSON to the webhook URL; returns the status.

        `secret=True` sends the secret set with setWebhook, None/False sends no header, a
        string sends that string; `path` replaces the URL's path (a proxy forwarding elsewhere).
        """
        token = token or next(iter(self.bots))
        hook = self.webhooks[token]
        update = dict(update)
        update.setdefault("update_id", next(self._update_ids))
        headers = {}
        value = hook.get("secret_token") if secret is True else secret
        if isinstance(value, str):
            headers["X-Telegram-Bot-Api-Secret-Token"] = value
        url = str(hook["url"])
        if path is not None:
            url = urlunsplit(urlsplit(url)._replace(path=path))
        async with (
            aiohttp.ClientSession() as session,
            session.post(url, json=update, headers=headers) as response,
        ):
            await response.read()
            return response.status

    # ---- observing -------------------------------------------------------------------------

    def calls_of(self, method: str, *, answered: int | None = 200) -> list[Call]:
        """Calls of `method`; by default only those answered 200 (None: all of them)."""
        name = method.lower()
        return [
            c for c in self.calls if c.method == name and (answered is None or c.status == answered)
        ]

    @property
    def sent_messages(self) -> list[dict[str, Any]]:
        """Params of every successful sendMessage, in order."""
        return [c.params for c in self.calls_of("sendMessage")]

    # ---- HTTP ------------------------------------------------------------------------------

    async def _params(self, request: web.Request) -> tuple[dict[str, Any], dict[str, Upload]]:
        params: dict[str, Any] = dict(request.query)
        files: dict[str, Upload] = {}
        if request.method == "POST" and request.can_read_body:
            if request.content_type == "application/json":
                body = await request.json()
                params.update(body if isinstance(body, dict) else {})
            else:
                form = await request.post()
                for key, value in form.items():
                    if isinstance(value, web.FileField):
                        files[key] = Upload(value.filename, value.content_type, value.file.read())
                    else:
                        params[key] = value
        for key, value in list(params.items()):
            if not isinstance(value, str):
                continue
            if value.startswith("attach://") and value[9:] in files:
                files[key] = files[value[9:]]  # aiogram names the part; expose it by field
                continue
            if key in JSON_FIELDS:
                with contextlib.suppress(json.JSONDecodeError):
                    params[key] = json.loads(value)
            elif key in INT_FIELDS and re.fullmatch(r"-?[0-9]+", value):
                params[key] = int(value)
        return params, files

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        token = request.match_info["token"]
        method = request.match_info["method"].lower()
        params, files = await self._params(request)
        call = Call(token, method, params, files)
        self.calls.append(call)
        self._notify()  # waiters see a long poll begin, not only end
        try:
            gate = self._gates.get(method)
            if gate is not None:
                await gate.wait()
            if token not in self.bots or token in self._revoked:
                return self._error(call, 401, "Unauthorized")
            failure = self._scripted(method, token)
            if failure is not None:
                if failure.drop:
                    call.status = 0
                    assert request.transport is not None
                    request.transport.close()
                    return web.Response(status=500)
                if failure.html:
                    call.status = failure.status
                    page = (
                        f"<html><body><h1>{failure.status} {failure.description}</h1></body></html>"
                    )
                    return web.Response(status=failure.status, text=page, content_type="text/html")
                if failure.body is not None:
                    call.status = failure.status
                    return web.json_response(failure.body, status=failure.status)
                extra: dict[str, Any] | None = None
                if failure.retry_after:
                    extra = {"retry_after": failure.retry_after}
                if failure.migrate_to is not None:
                    extra = {"migrate_to_chat_id": failure.migrate_to}
                return self._error(call, failure.status, failure.description, extra)
            if call.params.get("chat_id") in self.blocked:
                return self._error(call, 403, "Forbidden: bot was blocked by the user")
            moved = self.migrated.get(call.params.get("chat_id"))
            if moved is not None:
                return self._error(
                    call,
                    400,
                    "Bad Request: group chat was upgraded to a supergroup chat",
                    {"migrate_to_chat_id": moved},
                )
            handler = getattr(self, f"_m_{method}", None)
            if handler is None:
                return self._error(call, 404, "Not Found: method not found")
            result = await handler(token, call)
            if isinstance(result, web.Response):
                return result
            return web.json_response({"ok": True, "result": result})
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
        self,
        call: Call,
        status: int,
        description: str,
        parameters: dict[str, Any] | None = None,
    ) -> web.Response:
        call.status = status
        body: dict[str, Any] = {"ok": False, "error_code": status, "description": description}
        if parameters:
            body["parameters"] = parameters
        return web.json_response(body, status=status)

    async def _download(self, request: web.Request) -> web.StreamResponse:
        token = request.match_info["token"]
        path = request.match_info["path"]
        self.calls.append(Call(token, "file", {"path": path}))
        self._notify()
        if token not in self.bots or token in self._revoked:
            return web.Response(status=401, text="Unauthorized")
        for file_path, data in self.files.values():
            if file_path == path:
                return web.Response(body=data, content_type="application/octet-stream")
        return web.Response(status=404, text="Not Found")

    # ---- methods ---------------------------------------------------------------------------

    async def _m_getme(self, token: str, call: Call) -> Any:
        return self.bots[token]

    async def _m_getupdates(self, token: str, call: Call) -> Any:
        if token in self.webhooks:
            return self._error(
                call, 409, "Conflict: can't use getUpdates method while webhook is active"
            )
        # A new getUpdates ends the one waiting with a 409, as Telegram does (two bot
        # instances polling one token): `Call.status` of the ended one says 409.
        self._polls[token] = poll = self._polls.get(token, 0) + 1
        offset = int(call.params.get("offset") or 0)
        timeout = float(call.params.get("timeout") or 0)
        limit = int(call.params.get("limit") or 100)
        queue = self.updates.setdefault(token, [])
        # Confirming: everything below the offset is forgotten for good. The server's queue
        # takes an offset more than 10 past its last id as one "in the future" and answers
        # from its head instead (tdlib's TQueue::get and Client::do_get_updates).
        last = self._last_update_id.get(token) or max((u["update_id"] for u in queue), default=0)
        if 0 < offset <= last + 1 + 10:
            queue[:] = [u for u in queue if u["update_id"] >= offset]
            self._notify()
        deadline = time.monotonic() + timeout
        while not queue and not self._stopping:
            if self._polls[token] != poll:
                return self._error(
                    call,
                    409,
                    "Conflict: terminated by other getUpdates request; make sure that only one "
                    "bot instance is running",
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                await asyncio.wait_for(self._next_change(), remaining)
            except TimeoutError:
                break
        return queue[:limit]

    async def _m_setwebhook(self, token: str, call: Call) -> Any:
        url = call.params.get("url") or ""
        if not url:
            self.webhooks.pop(token, None)
            return True
        self.webhooks[token] = {
            "url": url,
            "secret_token": call.params.get("secret_token"),
            "allowed_updates": call.params.get("allowed_updates"),
        }
        return True

    async def _m_deletewebhook(self, token: str, call: Call) -> Any:
        self.webhooks.pop(token, None)
        if str(call.params.get("drop_pending_updates", "")).lower() == "true":
            self.updates[token] = []
        return True

    async def _m_getwebhookinfo(self, token: str, call: Call) -> Any:
        hook = self.webhooks.get(token, {})
        return {
            "url": hook.get("url", ""),
            "has_custom_certificate": False,
            "pending_update_count": len(self.updates.get(token, [])),
        }

    def _chat(self, chat_id: int | str) -> dict[str, Any]:
        if isinstance(chat_id, int) and chat_id > 0:
            return {"id": chat_id, "type": "private", "first_name": "User"}
        return {"id": chat_id, "type": "supergroup", "title": "Group"}

    def _new_message(self, token: str, call: Call, **content: Any) -> dict[str, Any]:
        chat_id = call.params.get("chat_id")
        if chat_id is None:
            raise web.HTTPBadRequest(
                text=json.dumps({"ok": False, "error_code": 400, "description": "chat_id empty"}),
                content_type="application/json",
            )
        counter = self._message_ids.setdefault(chat_id, itertools.count(1))
        message: dict[str, Any] = {
            "message_id": next(counter),
            "from": self.bots[token],
            "chat": self._chat(chat_id),
            "date": int(time.time()),
            **content,
        }
        thread = call.params.get("message_thread_id")
        if thread is not None:
            message["message_thread_id"] = thread
            message["is_topic_message"] = True
        reply = call.params.get("reply_parameters")
        if isinstance(reply, dict) and (chat_id, reply.get("message_id")) in self.messages:
            message["reply_to_message"] = self.messages[(chat_id, reply["message_id"])]
        if call.params.get("reply_markup"):
            message["reply_markup"] = call.params["reply_markup"]
        self.messages[(chat_id, message["message_id"])] = message
        return message

    def _caption(self, call: Call) -> dict[str, Any]:
        caption = call.params.get("caption")
        return {"caption": _strip_html(caption)} if caption else {}

    def _file(self, call: Call, name: str) -> dict[str, Any]:
        upload = call.files.get(name)
        ref = call.params.get(name)
        if upload is not None:
            file_id = self.add_file(upload.data, file_path=f"{name}s/{upload.filename}")
            return {
                "file_id": file_id,
                "file_unique_id": f"U{file_id}",
                "file_size": len(upload.data),
            }
        if isinstance(ref, str) and ref.startswith("attach://"):
            raise web.HTTPBadRequest(
                text=json.dumps(
                    {"ok": False, "error_code": 400, "description": "Bad Request: no file part"}
                ),
                content_type="application/json",
            )
        return {"file_id": str(ref), "file_unique_id": f"U{ref}"}

    async def _m_sendmessage(self, token: str, call: Call) -> Any:
        text = call.params.get("text") or ""
        if not text.strip():
            return self._error(call, 400, "Bad Request: message text is empty")
        visible = _strip_html(text) if call.params.get("parse_mode") == "HTML" else text
        if len(visible.encode("utf-16-le")) // 2 > 4096:
            return self._error(call, 400, "Bad Request: message is too long")
        return self._new_message(token, call, text=visible)

    async def _m_sendmediagroup(self, token: str, call: Call) -> Any:
        """An album: 2-10 photos/videos, or documents only, or audio only; one message each,
        sharing a media_group_id, the caption on the item that carries it."""
        media = call.params.get("media")
        if not isinstance(media, list) or not 2 <= len(media) <= 10:
            return self._error(call, 400, "Bad Request: media must have 2-10 items")
        kinds = {item.get("type") for item in media if isinstance(item, dict)}
        if not (kinds <= {"photo", "video"} or kinds in ({"document"}, {"audio"})):
            return self._error(call, 400, f"Bad Request: can't mix {sorted(kinds)} in an album")
        group = f"album-{len(self.calls)}"
        messages = []
        for item in media:
            ref = item.get("media")
            if isinstance(ref, str) and ref.startswith("attach://"):
                upload = call.files.get(ref[9:])
                if upload is None:
                    return self._error(call, 400, "Bad Request: no file part for " + ref)
                file = self._file(Call(token, call.method, {}, {"f": upload}), "f")
            else:
                file = {"file_id": str(ref), "file_unique_id": f"U{ref}"}
            kind = item["type"]
            content: dict[str, Any] = {"media_group_id": group}
            content[kind] = {
                "photo": [{**file, "width": 1, "height": 1}],
                "video": {**file, "width": 1, "height": 1, "duration": 1},
                "audio": {**file, "duration": 1},
            }.get(kind, file)
            if item.get("caption"):
                content["caption"] = _strip_html(item["caption"])
            messages.append(self._new_message(token, call, **content))
        return messages

    async def _m_sendphoto(self, token: str, call: Call) -> Any:
        photo = {**self._file(call, "photo"), "width": 1, "height": 1}
        return self._new_message(token, call, photo=[photo], **self._caption(call))

    async def _m_senddocument(self, token: str, call: Call) -> Any:
        document = self._file(call, "document")
        upload = call.files.get("document")
        if upload is not None:
            document["file_name"] = upload.filename
        return self._new_message(token, call, document=document, **self._caption(call))

    async def _m_sendvideo(self, token: str, call: Call) -> Any:
        video = {**self._file(call, "video"), "width": 1, "height": 1, "duration": 1}
        return self._new_message(token, call, video=video, **self._caption(call))

    async def _m_sendaudio(self, token: str, call: Call) -> Any:
        audio = {**self._file(call, "audio"), "duration": 1}
        return self._new_message(token, call, audio=audio, **self._caption(call))

    async def _m_sendvoice(self, token: str, call: Call) -> Any:
        voice = {**self._file(call, "voice"), "duration": 1}
        return self._new_message(token, call, voice=voice, **self._caption(call))

    async def _m_sendsticker(self, token: str, call: Call) -> Any:
        sticker = {
            **self._file(call, "sticker"),
            "type": "regular",
            "width": 512,
            "height": 512,
            "is_animated": False,
            "is_video": False,
        }
        return self._new_message(token, call, sticker=sticker)

    async def _m_sendlocation(self, token: str, call: Call) -> Any:
        location = {
            "latitude": float(call.params["latitude"]),
            "longitude": float(call.params["longitude"]),
        }
        return self._new_message(token, call, location=location)

    async def _m_sendcontact(self, token: str, call: Call) -> Any:
        contact = {
            "phone_number": call.params["phone_number"],
            "first_name": call.params["first_name"],
        }
        return self._new_message(token, call, contact=contact)

    async def _m_sendchataction(self, token: str, call: Call) -> Any:
        return True

    async def _m_answercallbackquery(self, token: str, call: Call) -> Any:
        return True

    async def _m_editmessagetext(self, token: str, call: Call) -> Any:
        key = (call.params.get("chat_id"), call.params.get("message_id"))
        message = self.messages.get(key)  # type: ignore[arg-type]
        if message is None:
            return self._error(call, 400, "Bad Request: message to edit not found")
        text = call.params.get("text") or ""
        text = _strip_html(text) if call.params.get("parse_mode") == "HTML" else text
        markup = call.params.get("reply_markup") or None
        if message.get("text") == text and message.get("reply_markup") == markup:
            return self._error(  # as Telegram answers an edit that changes nothing
                call,
                400,
                "Bad Request: message is not modified: specified new message content and reply "
                "markup are exactly the same as a current content and reply markup of the message",
            )
        message["text"] = text
        if markup:  # an edit without one takes the inline keyboard off, as Telegram's does
            message["reply_markup"] = markup
        else:
            message.pop("reply_markup", None)
        message["edit_date"] = int(time.time())
        return message

    async def _m_deletemessage(self, token: str, call: Call) -> Any:
        key = (call.params.get("chat_id"), call.params.get("message_id"))
        if self.messages.pop(key, None) is None:  # type: ignore[arg-type]
            return self._error(call, 400, "Bad Request: message to delete not found")
        return True

    async def _m_setmessagereaction(self, token: str, call: Call) -> Any:
        key = (call.params.get("chat_id"), call.params.get("message_id"))
        if key not in self.messages:
            return self._error(call, 400, "Bad Request: message to react not found")
        self.reactions[key] = call.params.get("reaction") or []
        return True

    async def _m_getfile(self, token: str, call: Call) -> Any:
        file_id = call.params.get("file_id")
        if file_id not in self.files:
            return self._error(call, 400, "Bad Request: invalid file_id")
        path, data = self.files[file_id]
        return {
            "file_id": file_id,
            "file_unique_id": f"U{file_id}",
            "file_size": len(data),
            "file_path": path,
        }


# ---- update builders (Bot API shapes) ---------------------------------------------------------

_message_numbers = itertools.count(1)


def user(user_id: int, first_name: str = "Ada", **extra: Any) -> dict[str, Any]:
    return {"id": user_id, "is_bot": False, "first_name": first_name, **extra}


def private_text(
    user_id: int, text: str, *, first_name: str = "Ada", message_id: int | None = None
) -> dict[str, Any]:
    """An Update carrying a private text message from `user_id`."""
    return {
        "message": {
            "message_id": message_id or next(_message_numbers),
            "from": user(user_id, first_name),
            "chat": {"id": user_id, "type": "private", "first_name": first_name},
            "date": int(time.time()),
            "text": text,
        }
    }


def group_text(
    chat_id: int,
    user_id: int,
    text: str,
    *,
    topic_id: int | None = None,
    title: str = "Team",
    first_name: str = "Grace",
    message_id: int | None = None,
) -> dict[str, Any]:
    """An Update carrying a (super)group message; with `topic_id`, a forum topic message."""
    message: dict[str, Any] = {
        "message_id": message_id or next(_message_numbers),
        "from": user(user_id, first_name),
        "chat": {
            "id": chat_id,
            "type": "supergroup",
            "title": title,
            **({"is_forum": True} if topic_id else {}),
        },
        "date": int(time.time()),
        "text": text,
    }
    if topic_id is not None:
        message["message_thread_id"] = topic_id
        message["is_topic_message"] = True
    return {"message": message}


def album(
    user_id: int,
    file_ids: Sequence[str],
    *,
    first_message_id: int,
    media_group_id: str = "13579",
    caption: str | None = None,
    caption_on: int = 0,
    chat_id: int | None = None,
    kind: str = "photo",
    first_name: str = "Ada",
) -> list[dict[str, Any]]:
    """The updates of an album as Telegram sends it: one message per item (`kind` "photo" or
    "document", one file each), sharing `media_group_id`, the caption on item `caption_on`.
    A private chat with `user_id`, or the supergroup `chat_id`."""
    chat: dict[str, Any] = (
        {"id": user_id, "type": "private", "first_name": first_name}
        if chat_id is None
        else {"id": chat_id, "type": "supergroup", "title": "Team"}
    )
    updates = []
    for index, file_id in enumerate(file_ids):
        file: dict[str, Any] = {"file_id": file_id, "file_unique_id": f"U{file_id}"}
        message: dict[str, Any] = {
            "message_id": first_message_id + index,
            "from": user(user_id, first_name),
            "chat": chat,
            "date": int(time.time()),
            "media_group_id": media_group_id,
            kind: [{**file, "width": 800, "height": 600}] if kind == "photo" else file,
        }
        if caption is not None and index == caption_on:
            message["caption"] = caption
        updates.append({"message": message})
    return updates
