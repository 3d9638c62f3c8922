"""The Slack transport: `AsyncWebClient` for the Web API, Socket Mode or the Events API inbound.

One connection is one workspace installation (a bot token); any number run side by side, each
with its own HTTP session, socket and rate-limit tiers.

Inbound: Socket Mode envelopes are acknowledged first, then decoded and delivered in order;
Events API requests are answered once the router accepted the event. Redeliveries (Socket
Mode `retry_attempt`, Events API `X-Slack-Retry-Num`) are dropped by event id here and, for
messages, by native id in the router's store.

`send` never sleeps on a 429: it raises `RateLimitedError` and the router's per-connection queue
waits; while a tier is paused, calls in that tier fail fast with the remaining wait. A 429 on
chat.postMessage pauses that channel only (the thread's send waits, the others go on), unless a
second channel meets one meanwhile: that is the workspace's limit (`ratelimit.py`).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from slack_sdk.web.async_client import AsyncWebClient

from talkbridge.connectors.base import BaseConnector, ConnectionStatus, ConnectorContext
from talkbridge.connectors.boundary import permanent, readable
from talkbridge.connectors.buttons import KeptButtons
from talkbridge.connectors.inbound_http import READ_TIMEOUT
from talkbridge.connectors.sending import PartialSends
from talkbridge.connectors.slack.codec import (
    GROUP_DM,
    SECTION_TEXT_LIMIT,
    SLACK_TEXT_LIMIT,
    Deletion,
    Identity,
    button_blocks,
    channels_to_resolve,
    conversation_name,
    decode,
    decode_message,
    joined_channel,
    mentions_bot,
    native_id,
    parse_native_id,
    parse_thread_id,
    renamed_channel,
    render,
    render_chunks,
    started_by_bot,
    thread_id,
    users_to_resolve,
)
from talkbridge.connectors.slack.config import SlackConfig
from talkbridge.connectors.slack.conversations import Conversations, Known
from talkbridge.connectors.slack.errors import HANDLED, translate
from talkbridge.connectors.slack.events_api import EventsServer, RequestCheck
from talkbridge.connectors.slack.names import NameLookups
from talkbridge.connectors.slack.ratelimit import TierGate
from talkbridge.connectors.slack.socket_mode import Envelope, SocketSession
from talkbridge.errors import (
    NotFoundError,
    PermanentError,
    RateLimitedError,
    TransientError,
)
from talkbridge.message import Attachment, NormalizedMessage, OutboundMessage, SendResult
from talkbridge.talk import KEEP, DirectoryEntry, EditButtons

_RECENT_EVENTS = 4096
NAME_WAIT = 1.0
"""Seconds an inbound event waits for its senders' and channels' names. Slack wants its ack (or
HTTP 200) within 3 s, and an event is acknowledged only once it is stored."""
_STATUS_REFUSALS = {"not_allowed", "missing_scope", "not_allowed_token_type", "invalid_arguments"}
EMOJI_NAMES = {
    "👍": "+1",
    "👎": "-1",
    "❤️": "heart",
    "❤": "heart",
    "😂": "joy",
    "😄": "smile",
    "🎉": "tada",
    "👀": "eyes",
    "✅": "white_check_mark",
    "❌": "x",
    "🙏": "pray",
    "🔥": "fire",
    "🤔": "thinking_face",
    "👋": "wave",
    "🚀": "rocket",
    "⏳": "hourglass_flowing_sand",
    "⚠️": "warning",
    "💯": "100",
    "😢": "cry",
    "👌": "ok_hand",
}

DeleteHandler = Callable[[Deletion], Awaitable[None]]


def create(config: SlackConfig, context: ConnectorContext) -> SlackConnector:
    return SlackConnector(config, context)


_MPIM_SIZE = 9
"""A group DM holds at most 9 people (Slack's limit): one `conversations.members` page."""


class SlackConnector(BaseConnector):
    """Features: history, directory, activity (assistant threads), edit, delete, reactions,
    interactions, inbound_media."""

    channel = "slack"
    reports_deletions = True

    def __init__(self, config: SlackConfig, context: ConnectorContext) -> None:
        super().__init__(config.id, context)
        self.config = config
        self._bot_token = config.bot_token.get_secret_value()
        self._app_token = config.app_token.get_secret_value() if config.app_token else ""
        self._secrets = [
            self._bot_token,
            self._app_token,
            config.signing_secret.get_secret_value() if config.signing_secret else "",
        ]
        self._log = context.logger.getChild(f"slack.{config.id}")
        self._session: aiohttp.ClientSession | None = None
        self._web: AsyncWebClient | None = None
        self._gate = TierGate()
        self.me = Identity()
        self.team: str | None = None
        self._users: dict[str, tuple[float, DirectoryEntry | None]] = {}
        self._conversations = Conversations(config.channel_cache_seconds)
        self._user_names = NameLookups("users.info", self._cached_user_name, self._name, self._log)
        self._channel_names = NameLookups(
            "conversations.info", self._cached_channel_name, self._channel_name, self._log
        )
        self._recent: OrderedDict[str, None] = OrderedDict()
        self._threads: OrderedDict[str, None] = OrderedDict()
        """Channel threads the bot is in (`require_mention`), as far as seen lately."""
        self._partial = PartialSends(context.store, config.id, keep_for=context.dedupe_for)
        self._buttons = KeptButtons(
            context, f"slack:{config.id}:buttons:", self._log, position=_position
        )
        """The buttons each message carries: an edit must send them again (see `edit`)."""
        self._status_allowed = True
        self._delete_handlers: list[DeleteHandler] = []
        self.socket: SocketSession | None = None
        self.events: EventsServer | None = None
        self.retry_base = 0.5
        """First delay (seconds) before reconnecting a lost socket; then doubles, up to 30 s."""
        self.clock: Callable[[], float] = time.monotonic
        """Tells how long a socket stayed open (one open long enough has proved itself)."""
        self.read_timeout = READ_TIMEOUT
        """Events API: seconds a request's head, then its body, may take to arrive."""
        for name in (
            "history",
            "directory",
            "activity",
            "edit",
            "delete",
            "reactions",
            "interactions",
            "inbound_media",
        ):
            self.provide(name, self)

    # ---- Web API -----------------------------------------------------------------------------

    @property
    def web(self) -> AsyncWebClient:
        """The Web API client; made on first use, inside the running loop (aiohttp wants that)."""
        if self._web is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.config.request_timeout)
            )
            self._web = AsyncWebClient(
                token=self._bot_token,
                base_url=self.config.api_base,
                timeout=self.config.request_timeout,
                session=self._session,
                logger=self._log.getChild("web"),
            )
        return self._web

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Call a Web API method through slack-sdk; failures leave as talkbridge errors."""
        channel = params.get("channel")
        channel = channel if isinstance(channel, str) else None
        wait = self._gate.blocked(method)
        if wait > 0:
            raise RateLimitedError(
                f"{method}: still rate limited for {wait:.1f} s", retry_after=wait
            )
        wait = self._gate.channel_blocked(method, channel)
        if wait > 0:
            raise RateLimitedError(
                f"{method}: still rate limited in {channel} for {wait:.1f} s",
                retry_after=wait,
                scope="thread",
            )
        function = getattr(self.web, method.replace(".", "_"))
        try:
            response = await function(**params)
        except HANDLED as exc:
            error = translate(exc, self._secrets, method=method)
            if isinstance(error, RateLimitedError):
                error.scope = self._gate.hit(method, error.retry_after, channel)
            raise error from None
        except AttributeError:  # slack-sdk reading a body that is not JSON (a proxy's page)
            raise TransientError(f"{method}: the answer was not Slack's JSON") from None
        data = response.data
        return dict(data) if isinstance(data, Mapping) else {}

    # ---- Transport ---------------------------------------------------------------------------

    async def check(self) -> str:
        """Both tokens `run` needs: the bot token (`auth.test`) and, in Socket Mode, the app
        token (a socket URL is asked for and not used)."""
        who = await self._identify()
        if self.config.inbound == "socket":
            await self._open_socket_url()
        return who

    async def _identify(self) -> str:
        """`auth.test`: the bot user and the workspace, or the translated failure."""
        info = await self.call("auth.test")
        self.me = Identity(bot_user_id=info.get("user_id"), bot_id=info.get("bot_id"))
        self.team = info.get("team")
        user = info.get("user") or info.get("user_id") or "?"
        return f"@{user} ({info.get('user_id')}) in {info.get('team')} ({info.get('team_id')})"

    async def run(self, status: ConnectionStatus) -> None:
        await self._identify()
        if self.config.inbound == "socket":
            self.socket = SocketSession(
                self._app_token,
                self.web,
                self._open_socket_url,
                self._on_envelope,
                ping_interval=self.config.ping_interval,
                retry_base=self.retry_base,
                logger=self._log,
                clock=self.clock,
            )
            await self.socket.run(status)
        else:
            await self._run_events(status)

    async def close(self) -> None:
        self._user_names.cancel()
        self._channel_names.cancel()
        if self._session is not None:
            await self._session.close()
        self._session = None
        self._web = None

    async def _open_socket_url(self) -> str:
        info = await self.call("apps.connections.open", app_token=self._app_token)
        url = info.get("url")
        if not isinstance(url, str) or not url.startswith(("ws://", "wss://")):
            raise TransientError("apps.connections.open gave no websocket URL")
        return url

    async def _run_events(self, status: ConnectionStatus) -> None:
        assert self.config.signing_secret is not None  # enforced by SlackConfig
        self.events = EventsServer(
            RequestCheck(self.config.signing_secret.get_secret_value()),
            self._on_http_event,
            host=self.config.events_host,
            port=self.config.events_port,
            path=self.config.events_path,
            logger=self._log,
            read_timeout=self.read_timeout,
        )
        try:
            try:
                await self.events.start()
            except OSError as exc:
                raise PermanentError(
                    f"cannot listen for Slack events on {self.config.events_host}:"
                    f"{self.config.events_port}: {exc.strerror}"
                ) from None
            status.up()
            await asyncio.Event().wait()  # serve until cancelled
        finally:
            await self.events.stop()

    # ---- inbound -----------------------------------------------------------------------------

    def on_delete(self, handler: DeleteHandler) -> None:
        """Be told when a message is deleted in Slack (deletes are not turns)."""
        self._delete_handlers.append(handler)

    def _seen(self, key: str | None) -> bool:
        return key is not None and key in self._recent

    async def _on_envelope(self, envelope: Envelope) -> None:
        if envelope.type not in ("events_api", "interactive"):
            return  # slash commands and others are acknowledged and left alone
        key = _dedupe_key(envelope.payload) or f"envelope:{envelope.envelope_id}"
        if self._seen(key):
            self._log.debug("redelivered envelope %s dropped", envelope.envelope_id)
            return
        try:
            await self._accept(envelope.payload)
        except (ValueError, PermanentError) as exc:
            self._log.error("dropping envelope %s: %s", envelope.envelope_id, exc)
        _remember(self._recent, key)

    async def _on_http_event(self, payload: dict[str, Any], retry: int) -> None:
        key = _dedupe_key(payload)
        if self._seen(key):
            self._log.debug("Slack retry %d of %s dropped", retry, key)
            return
        try:
            await self._accept(payload)
        except (ValueError, PermanentError) as exc:  # would be retried forever: acknowledge
            self._log.error("dropping undecodable event %s: %s", key, exc)
        _remember(self._recent, key)

    async def _accept(self, payload: dict[str, Any]) -> None:
        """Decode and deliver one payload; returns once subscribers accepted it."""
        if payload.get("type") == "event_callback" and payload.get("team_id") and not self.team:
            self.team = str(payload["team_id"])
        for changed in (renamed_channel(payload), joined_channel(payload, self.me)):
            if changed is not None:  # asked for afresh, not from a lookup already under way
                self._conversations.changed(changed)
                self._channel_names.forget(changed)
        names, channels = await asyncio.gather(
            self._user_names.names(users_to_resolve(payload), wait=NAME_WAIT),
            self._channel_names.names(channels_to_resolve(payload), wait=NAME_WAIT),
        )
        result = readable(
            decode,
            payload,
            connection_id=self.connection_id,
            me=self.me,
            users=names,
            channels=channels,
        )
        if result is None:
            return
        if isinstance(result, NormalizedMessage) and self._mention_rule(payload, result):
            if not await self._for_us(payload, result):
                self._log.debug(
                    "message %s does not mention the bot, outside its threads: not answered "
                    "(require_mention)",
                    result.id,
                )
                return
            if result.edit_of is not None:
                result = await self.edit_or_question(result)
                if result is None:
                    return
        if isinstance(result, Deletion):
            for handler in list(self._delete_handlers):
                await handler(result)
            self._log.info("message %s was deleted in Slack", result.message_id)
            await self.withdraw_reply(result.thread_id, result.message_id)
            return
        await self.deliver_confirmed(result, f"message {result.id}", *self._secrets)
        if self._mention_rule(payload, result):
            await self._join_thread(result)

    # ---- require_mention ---------------------------------------------------------------------

    def history_threads(self, thread_id: str, message_id: str) -> list[str]:
        """A deleted message that started a thread (its `thread_ts` its own ts) is reported in
        that thread; it was written, and is in the history of, its channel."""
        try:
            channel, thread_ts = parse_thread_id(thread_id)
        except ValueError:
            return [thread_id]
        if thread_ts is not None and native_id(channel, thread_ts) == message_id:
            return [channel, thread_id]
        return [thread_id]

    def _mention_rule(self, payload: Mapping[str, Any], message: NormalizedMessage) -> bool:
        """Whether `require_mention` applies: to messages of channels and group DMs (`mpim`,
        several people: a group, as `thread_type` says), not one-to-one DMs; a click on the
        bot's own buttons is always for it."""
        return (
            self.config.require_mention
            and message.thread_type != "private"
            and payload.get("type") != "block_actions"
        )

    async def _for_us(self, payload: Mapping[str, Any], message: NormalizedMessage) -> bool:
        """A channel message is for the bot when it mentions the bot, or replies in a thread
        the bot is in (one it started, or one it was mentioned in)."""
        if mentions_bot(payload, self.me) or started_by_bot(payload, self.me):
            return True
        _, thread_ts = _thread(message.thread_id)
        if thread_ts is None:
            return False
        if message.thread_id in self._threads:
            return True
        if await self.context.store.get_state(self._thread_key(message.thread_id)) is None:
            return False
        _remember(self._threads, message.thread_id)
        return True

    async def _join_thread(self, message: NormalizedMessage) -> None:
        """The bot is in the thread of a channel message it took (for a top-level one, the
        thread under it, where `reply_in_thread` answers): later replies there are for it.
        Kept in the store (as long as the router's dedupe keys), so a restart forgets none."""
        channel, thread_ts = _thread(message.thread_id)
        thread = thread_id(channel, thread_ts or _message(message.edit_of or message.id)[1])
        if thread in self._threads:
            return
        await self.context.store.set_state(
            self._thread_key(thread), "1", keep_for=self.context.dedupe_for
        )
        _remember(self._threads, thread)

    def _thread_key(self, thread: str) -> str:
        return f"slack:{self.connection_id}:thread:{thread}"

    async def _name(self, user_id: str) -> str | None:
        entry = await self.user(user_id)
        return entry.name if entry is not None else None

    async def _channel_name(self, channel: str) -> str | None:
        known = await self._conversation(channel)
        return conversation_name(known.info, known.members) if known is not None else None

    # ---- send --------------------------------------------------------------------------------

    def _target(self, message: OutboundMessage) -> tuple[str, str | None]:
        channel, thread_ts = _thread(message.thread_id)
        threadable = not channel.startswith("D") and message.reply_to
        if thread_ts is None and self.config.reply_in_thread and threadable:
            assert message.reply_to is not None
            try:
                reply_channel, reply_ts = parse_native_id(message.reply_to)
            except ValueError:
                reply_channel, reply_ts = "", None
            if reply_channel == channel:
                thread_ts = reply_ts
        return channel, thread_ts

    async def send(self, message: OutboundMessage) -> SendResult:
        channel, thread_ts = self._target(message)
        # With buttons the last chunk is shown as a section block, which holds less.
        limit = SECTION_TEXT_LIMIT if message.buttons else SLACK_TEXT_LIMIT
        chunks = render_chunks(message.text, message.markup, limit) if message.text else []
        links = [a.ref for a in message.attachments if a.data is None and a.ref]
        if links:
            chunks.append("\n".join(f"<{link}>" for link in links))
        uploads = [a for a in message.attachments if a.data is not None]
        if any(a.data is None and not a.ref for a in message.attachments):
            raise PermanentError("an attachment has neither data nor ref")
        blocks = None
        if message.buttons:
            blocks = permanent(button_blocks, chunks[-1] if chunks else "", message.buttons)
        steps: list[Callable[[], Awaitable[list[str]]]] = []
        for index, chunk in enumerate(chunks):
            last = index == len(chunks) - 1
            steps.append(
                self._post_step(
                    channel, thread_ts, chunk, blocks if last else None, message.buttons
                )
            )
        if uploads:
            steps.append(self._upload_step(channel, thread_ts, uploads))
        if blocks and not chunks:  # files alone: the buttons follow them in a message of their own
            fallback = " / ".join(label for label, _ in message.buttons)  # for notifications
            steps.append(self._post_step(channel, thread_ts, fallback, blocks, message.buttons))
        if not steps:
            raise PermanentError("nothing to send: the message rendered to no visible text")
        sent = await self._partial.send(message, len(steps), lambda index: steps[index]())
        return SendResult(message_ids=tuple(sent))

    def _post_step(
        self,
        channel: str,
        thread_ts: str | None,
        text: str,
        blocks: list[dict[str, Any]] | None,
        buttons: Sequence[tuple[str, str]],
    ) -> Callable[[], Awaitable[list[str]]]:
        async def post() -> list[str]:
            params: dict[str, Any] = {"channel": channel, "text": text, "unfurl_links": False}
            if thread_ts:
                params["thread_ts"] = thread_ts
            if blocks:
                params["blocks"] = blocks
            result = await self.call("chat.postMessage", **params)
            sent = native_id(str(result.get("channel") or channel), str(result.get("ts")))
            if blocks:
                await self._buttons.keep(sent, buttons)
            return [sent]

        return post

    def _upload_step(
        self, channel: str, thread_ts: str | None, uploads: Sequence[Attachment]
    ) -> Callable[[], Awaitable[list[str]]]:
        async def upload() -> list[str]:
            files = [
                {"content": a.data, "filename": a.name or "file", "title": a.name or "file"}
                for a in uploads
            ]
            params: dict[str, Any] = {"file_uploads": files, "channel": channel}
            if thread_ts:
                params["thread_ts"] = thread_ts
            result = await self.call("files.upload_v2", **params)
            return [f"file:{f.get('id')}" for f in result.get("files") or [] if f.get("id")]

        return upload

    # ---- features ----------------------------------------------------------------------------

    async def fetch(
        self, thread_id: str, *, limit: int = 50, before: str | None = None
    ) -> Sequence[NormalizedMessage]:
        channel, thread_ts = _thread(thread_id)
        params: dict[str, Any] = {"channel": channel, "limit": max(1, min(limit, 200))}
        if before:
            _, params["latest"] = _message(before)
            params["inclusive"] = False
        if thread_ts:
            result = await self.call("conversations.replies", ts=thread_ts, **params)
            items = list(result.get("messages") or [])
        else:
            result = await self.call("conversations.history", **params)
            items = list(reversed(result.get("messages") or []))
        users = {m.get("user") for m in items if isinstance(m.get("user"), str)}
        names, channels = await asyncio.gather(
            self._user_names.names({u for u in users if isinstance(u, str)}),
            self._channel_names.names(() if channel.startswith("D") else (channel,)),
        )
        found = []
        for item in items:
            decoded = decode_message(
                item,
                channel=channel,
                connection_id=self.connection_id,
                me=self.me,
                users=names,
                channels=channels,
                include_own=True,
            )
            if decoded is not None:
                found.append(decoded)
        return found[-limit:]

    def _cached_user(self, user_id: str) -> tuple[DirectoryEntry | None] | None:
        """`(entry,)` while `users.info`'s answer is fresh (the entry None: no such user)."""
        cached = self._users.get(user_id)
        if cached is not None and time.monotonic() - cached[0] < self.config.user_cache_seconds:
            return (cached[1],)
        return None

    def _cached_user_name(self, user_id: str) -> tuple[str | None] | None:
        cached = self._cached_user(user_id)
        return None if cached is None else (cached[0].name if cached[0] else None,)

    def _cached_channel_name(self, channel: str) -> tuple[str | None] | None:
        cached = self._conversations.cached(channel)
        if cached is None:
            return None
        known = cached[0]
        return (None if known is None else conversation_name(known.info, known.members),)

    async def user(self, user_id: str) -> DirectoryEntry | None:
        cached = self._cached_user(user_id)
        if cached is not None:
            return cached[0]
        now = time.monotonic()
        try:
            info = await self.call("users.info", user=user_id)
        except NotFoundError:
            self._users[user_id] = (now, None)
            return None
        person = info.get("user") or {}
        profile = person.get("profile") or {}
        name = (
            profile.get("display_name")
            or profile.get("real_name")
            or person.get("real_name")
            or person.get("name")
            or user_id
        )
        entry = DirectoryEntry(
            id=user_id,
            name=str(name),
            kind="user",
            extra={
                "real_name": profile.get("real_name") or person.get("real_name"),
                "is_bot": bool(person.get("is_bot")),
                "tz": person.get("tz"),
            },
        )
        self._users[user_id] = (now, entry)
        return entry

    async def _conversation(self, channel: str) -> Known | None:
        """What `conversations.info` says of `channel` (None: not found, or not visible to the
        bot), kept as `conversations.py` says. A group DM's members' names are kept with it,
        its only name people know."""
        cached = self._conversations.cached(channel)
        if cached is not None:
            return cached[0]
        asking = self._conversations.asking()
        try:
            info = await self.call("conversations.info", channel=channel)
        except NotFoundError:
            self._conversations.not_found(channel, asking)
            return None
        conversation = info.get("channel")
        conversation = dict(conversation) if isinstance(conversation, Mapping) else {}
        members = await self._group_members(channel) if conversation.get("is_mpim") else ()
        return self._conversations.found(channel, asking, conversation, members)

    async def _group_members(self, channel: str) -> tuple[str, ...]:
        """The names of a group DM's members but the bot (none when Slack will not say: the
        group is then named "group DM")."""
        try:
            answer = await self.call("conversations.members", channel=channel, limit=_MPIM_SIZE)
        except Exception as exc:  # a nicety: "group DM" names it meanwhile
            self._log.debug("conversations.members %s failed: %s", channel, exc)
            return ()
        ids = [m for m in answer.get("members") or () if isinstance(m, str)]
        ids = [m for m in ids if m != self.me.bot_user_id]
        names = await self._user_names.names(ids)
        return tuple(names.get(m, m) for m in ids)

    async def thread(self, thread_id: str) -> DirectoryEntry | None:
        channel, thread_ts = _thread(thread_id)
        known = await self._conversation(channel)
        if known is None:
            return None
        conversation = known.info
        if conversation.get("is_im"):
            other = await self.user(str(conversation.get("user") or ""))
            name = f"DM with {other.name}" if other else "DM"
        elif conversation.get("is_mpim"):
            name = conversation_name(conversation, known.members) or GROUP_DM
        else:
            name = f"#{conversation.get('name') or channel}"
        if thread_ts:
            name += " (thread)"
        return DirectoryEntry(
            id=thread_id,
            name=name,
            kind="thread",
            extra={"is_private": bool(conversation.get("is_private"))},
        )

    async def typing(self, thread_id: str) -> None:
        """Slack bots have no typing indicator; in an assistant thread the status says it."""
        channel, thread_ts = _thread(thread_id)
        if not thread_ts or not self._status_allowed:
            return
        try:
            await self.call(
                "assistant.threads.setStatus",
                channel_id=channel,
                thread_ts=thread_ts,
                status="is typing…",
            )
        except PermanentError as exc:
            if any(code in str(exc) for code in _STATUS_REFUSALS):
                self._status_allowed = False  # not an assistant app: stop asking
            raise

    async def edit(
        self, thread_id: str, message_id: str, text: str, *, buttons: EditButtons = KEEP
    ) -> None:
        """A message with buttons shows its blocks, and `chat.update` with `text` alone takes
        them off: the new text goes in new blocks, with the buttons the message keeps."""
        channel, ts = _message(message_id)
        rendered = render(text, "markdown")
        shown = await self._buttons.for_edit(message_id, buttons)
        limit = SECTION_TEXT_LIMIT if shown else SLACK_TEXT_LIMIT
        if len(rendered) > limit:
            raise PermanentError(
                f"edited text is longer than {limit} characters after rendering"
                + (" (the most a text above buttons holds)" if shown else "")
            )
        params: dict[str, Any] = {"channel": channel, "ts": ts, "text": rendered}
        if shown:
            params["blocks"] = permanent(button_blocks, rendered, shown)
        elif buttons is not KEEP:
            params["blocks"] = []  # off with the old ones, whatever Slack's default
        await self.call("chat.update", **params)
        if buttons is not KEEP or shown:  # kept again: for dedupe_days after this edit
            await self._buttons.keep(message_id, shown)

    async def delete(self, thread_id: str, message_id: str) -> None:
        channel, ts = _message(message_id)
        await self.call("chat.delete", channel=channel, ts=ts)

    async def react(self, thread_id: str, message_id: str, emoji: str) -> None:
        channel, ts = _message(message_id)
        await self.call("reactions.add", channel=channel, timestamp=ts, name=emoji_name(emoji))

    async def send_buttons(
        self, thread_id: str, text: str, buttons: Sequence[tuple[str, str]]
    ) -> SendResult:
        return await self.send(
            OutboundMessage(thread_id=thread_id, text=text, buttons=tuple(buttons))
        )

    async def download(self, attachment: Attachment, *, max_bytes: int | None = None) -> bytes:
        if not attachment.ref:
            raise PermanentError(f"this {attachment.kind} attachment has no file to download")
        limit = min(max_bytes or self.config.max_download_bytes, self.config.max_download_bytes)
        info = (await self.call("files.info", file=attachment.ref)).get("file") or {}
        size = info.get("size")
        if isinstance(size, int) and size > limit:
            raise PermanentError(f"file is {size} bytes, over the {limit}-byte limit")
        url = info.get("url_private_download") or info.get("url_private")
        if not isinstance(url, str) or not self._may_send_token_to(url):
            raise NotFoundError("Slack gave no download URL for this file that we may use")
        assert self._session is not None  # made by self.web
        received = bytearray()
        try:
            async with self._session.get(
                url, headers={"Authorization": f"Bearer {self._bot_token}"}
            ) as response:
                if response.status in (401, 403):
                    raise PermanentError(f"Slack refused the download (HTTP {response.status})")
                if response.status == 404:
                    raise NotFoundError("the file is gone")
                if response.status != 200:
                    raise TransientError(f"download answered HTTP {response.status}")
                async for chunk in response.content.iter_chunked(64 * 1024):
                    received.extend(chunk)
                    if len(received) > limit:
                        raise PermanentError(f"file is over the {limit}-byte limit")
        except HANDLED as exc:
            raise translate(exc, self._secrets, method="download") from None
        return bytes(received)

    def _may_send_token_to(self, url: str) -> bool:
        """The bot token goes only to Slack's file hosts or the configured API host."""
        host = urlsplit(url).hostname or ""
        api_host = urlsplit(self.config.api_base).hostname or ""
        return host == api_host or host == "slack.com" or host.endswith(".slack.com")


def emoji_name(emoji: str) -> str:
    """`:thumbsup:`, `thumbsup` or a common emoji character -> Slack's reaction name."""
    value = emoji.strip()
    if value in EMOJI_NAMES:
        return EMOJI_NAMES[value]
    value = value.strip(":")
    if value and all(c.isalnum() or c in "_+-'" for c in value):
        return value
    raise PermanentError(f"no Slack reaction name known for {emoji!r}; use its :name:")


def _remember(recent: OrderedDict[str, None], key: str | None) -> None:
    """Add `key` to a bounded set, forgetting the oldest beyond `_RECENT_EVENTS`."""
    if key is None:
        return
    recent[key] = None
    while len(recent) > _RECENT_EVENTS:
        recent.popitem(last=False)


def _dedupe_key(payload: Mapping[str, Any]) -> str | None:
    if payload.get("event_id"):
        return f"event:{payload['event_id']}"
    if payload.get("type") == "block_actions":
        actions = payload.get("actions") or [{}]
        stamp = actions[0].get("action_ts") if isinstance(actions[0], Mapping) else None
        return f"action:{payload.get('trigger_id') or stamp}"
    return None


def _position(message_id: str) -> tuple[str, tuple[int, ...]] | None:
    """A message's channel and its `ts` as numbers (ts grow with time in a channel)."""
    try:
        channel, ts = parse_native_id(message_id)
    except ValueError:
        return None  # an uploaded file's id
    seconds, _, fraction = ts.partition(".")
    return channel, (int(seconds), int(fraction or 0))


def _thread(value: str) -> tuple[str, str | None]:
    return permanent(parse_thread_id, value)


def _message(value: str) -> tuple[str, str]:
    return permanent(parse_native_id, value)


__all__ = ["SlackConnector", "create", "emoji_name"]
