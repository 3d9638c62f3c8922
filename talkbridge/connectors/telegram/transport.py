"""The Telegram transport: aiogram's `Bot` for the Bot API, long polling or a webhook server.

Inbound is at-least-once without replays: the offset past a batch of updates is stored (and
confirmed to Telegram by the next poll) only after `deliver` returned for each of them (the router
has durably accepted or deduped them by then), so a crash in between re-delivers at most that
batch, which the router's inbox drops as duplicates. The items of an album are kept in the store
instead, until the album goes out as one message (`talkbridge.connectors.telegram.albums`).

`send` never sleeps on a 429 or retries: it raises the translated error and the router's
per-connection queue waits (`RateLimitedError.retry_after`) or retries (`TransientError`). It
does pace itself ahead of Telegram's limits, so 429s stay rare.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from aiogram import Bot
from aiogram import methods as api
from aiogram.client.telegram import TelegramAPIServer
from aiogram.exceptions import ClientDecodeError, TelegramBadRequest, TelegramMigrateToChat
from aiogram.types import (
    BufferedInputFile,
    InlineKeyboardButton,
    InlineKeyboardMarkup,
    InputMediaAudio,
    InputMediaDocument,
    InputMediaPhoto,
    InputMediaVideo,
    LinkPreviewOptions,
    Message,
    ReactionTypeEmoji,
    ReplyParameters,
    Update,
)
from aiohttp import web

from talkbridge.backoff import Backoff
from talkbridge.connectors.base import BaseConnector, ConnectionStatus, ConnectorContext
from talkbridge.connectors.boundary import permanent, readable
from talkbridge.connectors.buttons import KeptButtons
from talkbridge.connectors.inbound_http import READ_TIMEOUT, app_runner, read_body, too_slow
from talkbridge.connectors.sending import PartialSends
from talkbridge.connectors.telegram.albums import Albums
from talkbridge.connectors.telegram.codec import (
    ALBUM_MAX,
    ALLOWED_UPDATES,
    TELEGRAM_CAPTION_LIMIT,
    TELEGRAM_TEXT_LIMIT,
    album_item,
    decode_update,
    edited_item,
    inline_keyboard,
    merge_album,
    migration,
    native_id,
    parse_native_id,
    parse_thread_id,
    render,
    render_chunks,
    skipped_kind,
    update_chat,
    update_to_dict,
    visible_length,
)
from talkbridge.connectors.telegram.config import TelegramConfig
from talkbridge.connectors.telegram.errors import (
    PollConflictError,
    scrub,
    translated,
    webhook_conflict,
)
from talkbridge.connectors.telegram.migrations import Migrations
from talkbridge.connectors.telegram.pacing import Pacer
from talkbridge.connectors.telegram.session import Session
from talkbridge.errors import (
    ConnectorError,
    NotFoundError,
    PermanentError,
    RateLimitedError,
    TransientError,
)
from talkbridge.message import Attachment, NormalizedMessage, OutboundMessage, SendResult
from talkbridge.talk import KEEP, EditButtons

SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
_NO_PREVIEW = LinkPreviewOptions(is_disabled=True)
"""Replies show no link preview: Telegram would add one for their first link."""
_RECENT_UPDATES = 2048


def create(config: TelegramConfig, context: ConnectorContext) -> TelegramConnector:
    return TelegramConnector(config, context)


class TelegramConnector(BaseConnector):
    """One bot token = one connection. Features: activity, inbound_media, edit, delete,
    reactions, interactions. The Bot API keeps no history and has no directory."""

    channel = "telegram"

    def __init__(self, config: TelegramConfig, context: ConnectorContext) -> None:
        super().__init__(config.id, context)
        self.config = config
        self._token = config.token.get_secret_value()
        self._log = context.logger.getChild(f"telegram.{config.id}")
        server = TelegramAPIServer.from_base(config.api_base) if config.api_base else None
        session = (
            Session(api=server, timeout=config.request_timeout)
            if server
            else Session(timeout=config.request_timeout)
        )
        self.bot = Bot(self._token, session=session)
        self.bot_id: int | None = int(self._token.split(":", 1)[0])
        self.username: str | None = None
        self._hook_url = ""
        """The webhook Telegram posted to when `check` last asked (token scrubbed), or ""."""
        self._hook_to_delete = False
        """Polling: the webhook `check` found is to be deleted (this connection's own, or
        `delete_webhook`)."""
        self._own_hook_key = f"telegram:{config.id}:webhook"
        """The webhook URL this connection set in webhook mode, kept in the store's state."""
        self.webhook_port: int | None = None
        """The port the webhook server listens on once `run` started it (useful with port 0)."""
        self._pacer = Pacer(config.global_rate, config.group_rate_per_minute)
        self._recent: OrderedDict[int, None] = OrderedDict()
        self._skipped_kinds: set[str] = set()
        """Kinds of message `_note_skipped` has logged at info already."""
        self._migrations = Migrations(context.store, config.id)
        self._partial = PartialSends(context.store, config.id, keep_for=context.dedupe_for)
        self._offset_key = f"telegram:{config.id}:offset"
        self._buttons = KeptButtons(
            context, f"telegram:{config.id}:buttons:", self._log, position=_position
        )
        """The buttons each message carries, which an edit must send again."""
        self.retry_base = 0.5
        """First delay (seconds) before re-polling after a network error or 5xx; then doubles."""
        self.short_poll_every = 1.0
        """With `poll_timeout: 0`: seconds between polls that found nothing."""
        self.read_timeout = READ_TIMEOUT
        """Webhook: seconds a request's head, then its body, may take to arrive."""
        self._albums = Albums(
            context.store,
            config.id,
            decode=self._decode_album,
            deliver=self._deliver_album,
            wait=config.album_wait,
            keep_for=context.dedupe_for,
            log=self._log,
        )
        for name in ("activity", "inbound_media", "edit", "delete", "reactions", "interactions"):
            self.provide(name, self)

    # ---- Transport -------------------------------------------------------------------------

    async def run(self, status: ConnectionStatus) -> None:
        await self.check()
        try:
            await self._albums.resume()  # what an earlier run kept, before anything newer
            if self.config.mode == "webhook":
                await self._run_webhook(status)
            else:
                await self._run_polling(status)
        finally:
            await self._albums.pause()

    async def check(self) -> str:
        """`getMe`: the bot's @username, or the translated failure; and a webhook that `run`
        would replace, said since whatever it points at then gets no more updates."""
        with translated(self._token):
            me = await self.bot.get_me()
        self.bot_id = me.id
        self.username = me.username
        who = f"@{me.username}" if me.username else str(me.id)
        try:  # only a note: the token works whatever this says
            with translated(self._token):
                hook_url = (await self.bot.get_webhook_info()).url
        except ConnectorError:
            hook_url = ""
        self._hook_url = scrub(hook_url, self._token)
        self._hook_to_delete = False
        if self.config.mode == "polling" and hook_url:
            # Telegram refuses getUpdates while a webhook is set. One set by something else is
            # not deleted unasked: whatever it points at would get no updates from then on.
            self._hook_to_delete = True
            if self.config.delete_webhook:
                return (
                    f"{who} (a webhook is set, {self._hook_url}: polling deletes it, as "
                    "delete_webhook says)"
                )
            if await self._own_webhook(hook_url):
                return (
                    f"{who} (this connection's webhook is set, {self._hook_url}: polling "
                    "deletes it)"
                )
            self._hook_to_delete = False
            raise webhook_conflict(self._hook_url)
        if self.config.mode == "webhook" and hook_url not in ("", self.config.webhook_url):
            return f"{who} (updates go to another webhook now, {self._hook_url}: run replaces it)"
        return who

    async def _own_webhook(self, url: str) -> bool:
        """Whether `url` is the webhook this connection set when it ran in webhook mode."""
        try:
            return await self.context.store.get_state(self._own_hook_key) == url
        except Exception as exc:  # unknown: taken as someone else's, which is not deleted
            self._log.debug("could not read the webhook this connection set: %s", exc)
            return False

    async def close(self) -> None:
        await self.bot.session.close()

    async def _load_offset(self) -> int | None:
        stored = await self.context.store.get_state(self._offset_key)
        return int(stored) if stored else None

    async def _run_polling(self, status: ConnectionStatus) -> None:
        # getUpdates is refused while a webhook is set; `check` (run just before) refused to go
        # on for one set by something else, unless `delete_webhook` says to delete it.
        if self._hook_to_delete:
            self._log.warning(
                "a webhook was set (%s): deleting it to poll; it gets no updates from now on",
                self._hook_url,
            )
            with translated(self._token):
                await self.bot.delete_webhook(drop_pending_updates=False)
            with contextlib.suppress(Exception):  # a stale note only means one more check
                await self.context.store.set_state(self._own_hook_key, "")
        status.up()
        offset = await self._load_offset()
        backoff = Backoff(base=self.retry_base, cap=30.0)
        healthy = True
        conflict = False
        while True:
            # After a failure, a short poll: recovery shows in the health at once, not after
            # a long poll's whole wait.
            timeout = self.config.poll_timeout if healthy else 0
            try:
                with translated(self._token):
                    updates = await self._get_updates(offset, timeout)
            except (TransientError, RateLimitedError) as exc:
                delay = exc.retry_after if isinstance(exc, RateLimitedError) else backoff.next()
                healthy = False
                conflict = isinstance(exc, PollConflictError)
                status.degraded(f"getUpdates failed: {exc}; retrying in {delay:.1f} s")
                await asyncio.sleep(delay)
                continue
            # A short poll gets through between another instance's polls: only a long poll
            # nobody cut short says it is gone, or the two cut each other off twice a second.
            if timeout or not conflict:
                backoff.reset()
                conflict = False
            if not healthy:
                healthy = True
                status.up()
            elif not timeout and not updates:
                # Short polling (`poll_timeout: 0`): an empty answer comes back at once, so
                # polling again at once would ask a thousand times a second. Genuinely a
                # wait on time: nothing announces the next update but the next poll.
                await asyncio.sleep(self.short_poll_every)
            self._restarted_ids(updates, offset)
            reached = offset
            try:
                for update in updates:
                    uid = await self._accept(update)
                    if uid is not None:  # Telegram's order; not the highest id ever seen
                        reached = uid + 1
            finally:  # once per batch, and for the part of it accepted before a failure
                if reached != offset:
                    offset = reached
                    await self.context.store.set_state(self._offset_key, str(offset))

    def _restarted_ids(
        self, updates: Sequence[Update | dict[str, Any]], offset: int | None
    ) -> None:
        """Update ids below the offset asked for mean a new sequence: after a week without
        updates Telegram picks the next id at random, and another Bot API server (a self-hosted
        one in `api_base`) numbers its own. The server then ignores the offset, far ahead of its
        ids, and answers from its queue's head; the batch is confirmed by its own ids, or it is
        offered again and again, at once, and nothing after it ever comes."""
        first = next((u for u in map(_update_id, updates) if u is not None), None)
        if offset is None or first is None or first >= offset:
            return
        self._log.info(
            "update ids start again at %s, below the offset %s: following them", first, offset
        )
        self._recent.clear()  # ids of the old sequence say nothing about the new one

    async def _get_updates(
        self, offset: int | None, timeout: int
    ) -> Sequence[Update | dict[str, Any]]:
        """A batch of updates. aiogram refuses a whole batch when one update does not fit its
        models; then the batch is taken as the JSON it was, so that update alone is skipped
        instead of stopping the connection at its offset forever."""
        try:
            return await self.bot.get_updates(
                offset=offset,
                timeout=timeout,
                allowed_updates=list(ALLOWED_UPDATES),
                request_timeout=timeout + 15,
            )
        except ClientDecodeError as exc:
            data = exc.data
            if not isinstance(data, dict) or data.get("ok") is not True:
                raise
            batch = data.get("result")
            if not isinstance(batch, list):
                raise
            return [u if isinstance(u, dict) else {"update_id": None, "raw": u} for u in batch]

    async def _accept(self, update: Update | dict[str, Any]) -> int | None:
        """Take one update; returns once it may be confirmed (subscribers accepted it, or it is
        an album item kept in the store), with its id."""
        data = update_to_dict(update)
        uid = data.get("update_id")
        if not isinstance(uid, int) or isinstance(uid, bool):
            self._log.error("skipping an update without an update_id: %.200s", data)
            return None
        if uid in self._recent:
            return uid
        try:
            item = readable(album_item, data, bot_id=self.bot_id)
        except ValueError:
            item = None  # decoding it says why it cannot be read
        # What comes after an album goes after it. A batch is in Telegram's order, so in polling
        # any other update ends the albums before it; webhook POSTs of different chats come
        # concurrently, so there only one of the album's chat does.
        chat = None if self.config.mode == "polling" else update_chat(data)
        if item is not None:
            await self._albums.close_before(chat, keep=item[0])
            await self._albums.add(uid, *item, data)
        else:
            await self._albums.close_before(chat)
            await self._take(uid, data)
        self._recent[uid] = None
        while len(self._recent) > _RECENT_UPDATES:
            self._recent.popitem(last=False)
        return uid

    async def _take(self, uid: int, data: dict[str, Any]) -> None:
        """Decode and deliver an update that is no album item."""
        message = self._decode(data)
        if message is None:
            with contextlib.suppress(ValueError):  # decoding it said why it cannot be read
                moved = readable(migration, data)
                if moved is not None:
                    self._log.info("chat %s is now %s: replies go there", *moved)
                    await self._migrations.moved(*moved)
            self._note_skipped(uid, data)
            return
        edited = edited_item(data)
        if edited is not None and message.edit_of is not None:
            message = await self._albums.edit(message, edited)
        query = data.get("callback_query")
        if isinstance(query, dict) and query.get("id"):
            await self._answer_callback(str(query["id"]))
        await self._deliver_checked(message, f"update {uid}")

    def _decode(self, data: dict[str, Any]) -> NormalizedMessage | None:
        try:
            return readable(
                decode_update, data, connection_id=self.connection_id, bot_id=self.bot_id
            )
        except ValueError as exc:  # one poison update must not stall the connection
            self._log.error(
                "skipping update %s that cannot be read: %s", data.get("update_id"), exc
            )
            return None

    def _note_skipped(self, uid: int, data: dict[str, Any]) -> None:
        """Say what was not delivered and why, at info the first time of each kind (the bot
        seems to ignore whoever sent it), then at debug (a busy group need not fill the log)."""
        try:
            found = readable(skipped_kind, data, bot_id=self.bot_id)
        except ValueError:
            return  # decoding it said why
        if found is None:
            return
        kind, why = found
        first = kind not in self._skipped_kinds
        self._skipped_kinds.add(kind)
        self._log.log(
            logging.INFO if first else logging.DEBUG,
            "update %s in chat %s not delivered: %s%s",
            uid,
            update_chat(data),
            why,
            " (more of this kind are logged at debug level)" if first else "",
        )

    def _decode_album(self, updates: Sequence[dict[str, Any]]) -> NormalizedMessage | None:
        items = [m for m in map(self._decode, updates) if m is not None]
        return merge_album(items) if items else None

    async def _deliver_album(self, album: NormalizedMessage) -> None:
        await self._deliver_checked(album, f"album {album.id}")

    async def _deliver_checked(self, message: NormalizedMessage, what: str) -> None:
        await self.deliver_confirmed(message, what, self._token, self._token.partition(":")[2])

    async def _answer_callback(self, query_id: str) -> None:
        # Stops the button's spinner; failing to do so must not lose the click.
        try:
            with translated(self._token):
                await self.bot.answer_callback_query(query_id)
        except ConnectorError as exc:
            self._log.warning("answerCallbackQuery failed: %s", exc)

    # ---- webhook ---------------------------------------------------------------------------

    async def _run_webhook(self, status: ConnectionStatus) -> None:
        app = web.Application()
        app.router.add_post(self.config.webhook_path, self._on_webhook)
        app.router.add_route("*", "/{anything:.*}", self._elsewhere)
        runner = app_runner(app, self.read_timeout)
        await runner.setup()
        try:
            site = web.TCPSite(runner, self.config.webhook_host, self.config.webhook_port)
            try:
                await site.start()
            except OSError as exc:
                raise PermanentError(
                    f"cannot listen for the webhook on {self.config.webhook_host}:"
                    f"{self.config.webhook_port}: {exc.strerror}"
                ) from None
            self.webhook_port = _bound_port(runner)
            secret = self.config.webhook_secret
            assert self.config.webhook_url and secret  # enforced by TelegramConfig
            with translated(self._token):
                await self.bot.set_webhook(
                    self.config.webhook_url,
                    secret_token=secret.get_secret_value(),
                    allowed_updates=list(ALLOWED_UPDATES),
                    drop_pending_updates=False,
                )
            # Polling deletes it unasked once this connection switches back (see `check`).
            await self.context.store.set_state(self._own_hook_key, self.config.webhook_url)
            status.up()
            await asyncio.Event().wait()  # serve until cancelled
        finally:
            await runner.cleanup()

    async def _elsewhere(self, request: web.Request) -> web.Response:
        """Not the webhook: said in the log, since a proxy forwarding to the wrong path
        otherwise fails with nothing to show for it. Only in the log: the answer goes to
        whoever asked, and the path may be a secret (Telegram's docs suggest putting the bot
        token in it), so it names nothing; the log line has the token scrubbed."""
        self._log.warning(
            "webhook server: %s %s is not the webhook, which is POST %s (webhook_path)",
            request.method,
            scrub(request.path[:200], self._token),
            scrub(self.config.webhook_path, self._token),
        )
        return web.Response(status=404, text="not the webhook")

    async def _on_webhook(self, request: web.Request) -> web.Response:
        secret = self.config.webhook_secret
        # aiohttp hands a header byte that is not UTF-8 over as a lone surrogate: encoded back
        # as it came, or `encode` raises (a 500 and a traceback for anyone who sends one).
        given = request.headers.get(SECRET_HEADER, "").encode("utf-8", "surrogateescape")
        if secret is None or not hmac.compare_digest(given, secret.get_secret_value().encode()):
            self._log.warning(
                "webhook request without the right secret token from %s", request.remote
            )
            return web.Response(status=401, text="wrong or missing secret token")
        body = await read_body(request, self.read_timeout)
        if body is None:
            self._log.warning("webhook request from %s: its body came too slowly", request.remote)
            return too_slow()
        try:
            data = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError):
            return web.Response(status=400, text="body is not JSON")
        if not isinstance(data, dict) or not isinstance(data.get("update_id"), int):
            return web.Response(status=400, text="not a Telegram update (no update_id)")
        try:
            await self._accept(data)
        except (ValueError, PermanentError) as exc:
            # A malformed update would be re-sent forever; log it and acknowledge.
            self._log.error("dropping undecodable update %s: %s", data.get("update_id"), exc)
        except Exception as exc:
            # Not accepted: answer 500 so Telegram delivers the update again.
            self._log.warning("update %s not accepted yet: %s", data.get("update_id"), exc)
            return web.Response(status=500, text="not accepted, retry later")
        return web.Response(text="ok")

    # ---- send ------------------------------------------------------------------------------

    async def send(self, message: OutboundMessage) -> SendResult:
        thread_chat, topic = _thread(message.thread_id)
        chat_id = await self._migrations.resolve(thread_chat)
        # A reply's message is in the old group, which Telegram closed: none in the new one.
        reply = _reply_parameters(message.reply_to, chat_id) if chat_id == thread_chat else None
        markup = permanent(_keyboard, message.buttons) if message.buttons else None
        steps = self._plan(message, chat_id, topic, reply, markup)

        async def step(index: int) -> list[str]:
            nonlocal chat_id
            await self._pacer.acquire(chat_id)
            with translated(self._token, chat_scoped=True):
                try:
                    result = await self.bot(steps[index])
                except TelegramMigrateToChat as exc:
                    # A group that became a supergroup has a new id: this part and the ones
                    # after it go there, and so does every later message to the thread.
                    self._log.info(
                        "chat %s is now %s: sending there", chat_id, exc.migrate_to_chat_id
                    )
                    await self._migrations.moved(chat_id, exc.migrate_to_chat_id)
                    chat_id = exc.migrate_to_chat_id
                    moved = {"chat_id": chat_id, "reply_parameters": None}
                    steps[index:] = [s.model_copy(update=moved) for s in steps[index:]]
                    result = await self.bot(steps[index])
            if isinstance(result, Message):
                sent_id = native_id(result.chat.id, result.message_id)
                if getattr(steps[index], "reply_markup", None) is not None:
                    await self._buttons.keep(sent_id, message.buttons)
                return [sent_id]
            if isinstance(result, list):  # an album: one message per item
                return [native_id(m.chat.id, m.message_id) for m in result]
            return []

        sent = await self._partial.send(message, len(steps), step)
        if not sent:
            raise PermanentError("nothing to send: the message rendered to no visible text")
        return SendResult(message_ids=tuple(sent))

    def _plan(
        self,
        message: OutboundMessage,
        chat_id: int | str,
        topic: int | None,
        reply: ReplyParameters | None,
        markup: InlineKeyboardMarkup | None,
    ) -> list[api.TelegramMethod[Any]]:
        """The Bot API calls that deliver `message`, in order (pure apart from object building)."""
        common: dict[str, Any] = {"chat_id": chat_id, "message_thread_id": topic}
        chunks = render_chunks(message.text, message.markup) if message.text else []
        caption: str | None = None
        if (
            message.attachments
            and len(chunks) == 1
            and visible_length(chunks[0]) <= TELEGRAM_CAPTION_LIMIT
            and _captionable(message.attachments[0])
        ):
            caption, chunks = chunks[0], []
        steps: list[api.TelegramMethod[Any]] = []
        for chunk in chunks:
            steps.append(
                api.SendMessage(
                    **common,
                    text=chunk,
                    parse_mode="HTML",
                    link_preview_options=_NO_PREVIEW,
                )
            )
        # Without buttons, runs of photos and videos (or of documents, or of audio) go as albums;
        # Telegram cannot put buttons on an album.
        runs = (
            _albums(message.attachments) if markup is None else [[a] for a in message.attachments]
        )
        for run in runs:
            if len(run) == 1:
                steps.append(_attachment_method(run[0], common, caption))
            else:
                steps.append(_album(run, common, caption))
            caption = None
        if steps and reply is not None:
            steps[0] = steps[0].model_copy(update={"reply_parameters": reply})
        if steps and markup is not None:
            text_steps = [i for i, s in enumerate(steps) if isinstance(s, api.SendMessage)]
            last = text_steps[-1] if text_steps else 0
            steps[last] = steps[last].model_copy(update={"reply_markup": markup})
        return steps

    # ---- features --------------------------------------------------------------------------

    async def typing(self, thread_id: str) -> None:
        chat_id, topic = _thread(thread_id)
        chat_id = await self._migrations.resolve(chat_id)
        with translated(self._token, chat_scoped=True):
            await self.bot.send_chat_action(chat_id, "typing", message_thread_id=topic)

    async def download(self, attachment: Attachment, *, max_bytes: int | None = None) -> bytes:
        if not attachment.ref:
            raise PermanentError(f"this {attachment.kind} attachment has no file to download")
        limit = min(max_bytes or self.config.max_download_bytes, self.config.max_download_bytes)
        if attachment.size is not None and attachment.size > limit:
            raise PermanentError(f"file is {attachment.size} bytes, over the {limit}-byte limit")
        with translated(self._token):
            file = await self.bot.get_file(attachment.ref)
        if file.file_size is not None and file.file_size > limit:
            raise PermanentError(f"file is {file.file_size} bytes, over the {limit}-byte limit")
        if not file.file_path:
            raise NotFoundError("Telegram gave no download path for this file")
        url = self.bot.session.api.file_url(self._token, file.file_path)
        received = bytearray()
        with translated(self._token):
            async for chunk in self.bot.session.stream_content(url, timeout=60):
                received.extend(chunk)
                if len(received) > limit:
                    raise PermanentError(f"file is over the {limit}-byte limit")
        return bytes(received)

    async def edit(
        self, thread_id: str, message_id: str, text: str, *, buttons: EditButtons = KEEP
    ) -> None:
        chat_id, mid = _message(message_id)
        rendered = render(text, "markdown")
        if visible_length(rendered) > TELEGRAM_TEXT_LIMIT:
            raise PermanentError("edited text is longer than Telegram's 4,096-character limit")
        shown = await self._buttons.for_edit(message_id, buttons)
        markup = permanent(_keyboard, shown) if shown else None
        with translated(self._token, chat_scoped=True):
            try:
                await self.bot.edit_message_text(
                    text=rendered,
                    chat_id=chat_id,
                    message_id=mid,
                    parse_mode="HTML",
                    link_preview_options=_NO_PREVIEW,  # as it was sent: else a preview appears
                    reply_markup=markup,
                )
            except TelegramBadRequest as exc:
                if "message is not modified" not in exc.message:
                    raise  # the same answer again is an edit done
        if buttons is not KEEP or shown:  # kept again: for dedupe_days after this edit
            await self._buttons.keep(message_id, shown)

    async def delete(self, thread_id: str, message_id: str) -> None:
        chat_id, mid = _message(message_id)
        with translated(self._token, chat_scoped=True):
            await self.bot.delete_message(chat_id, mid)

    async def react(self, thread_id: str, message_id: str, emoji: str) -> None:
        chat_id, mid = _message(message_id)
        with translated(self._token, chat_scoped=True):
            await self.bot.set_message_reaction(
                chat_id, mid, reaction=[ReactionTypeEmoji(emoji=emoji)]
            )

    async def send_buttons(
        self, thread_id: str, text: str, buttons: Sequence[tuple[str, str]]
    ) -> SendResult:
        return await self.send(
            OutboundMessage(thread_id=thread_id, text=text, buttons=tuple(buttons))
        )


def _update_id(update: Update | dict[str, Any]) -> int | None:
    uid = update.update_id if isinstance(update, Update) else update.get("update_id")
    return uid if isinstance(uid, int) and not isinstance(uid, bool) else None


def _bound_port(runner: web.AppRunner) -> int | None:
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            return int(address[1])
    return None


def _thread(thread_id: str) -> tuple[int | str, int | None]:
    return permanent(parse_thread_id, thread_id)


def _message(message_id: str) -> tuple[int | str, int]:
    return permanent(parse_native_id, message_id)


def _position(message_id: str) -> tuple[str, tuple[int, ...]] | None:
    """A message's chat and its id there (ids grow with time in a chat)."""
    try:
        chat, mid = parse_native_id(message_id)
    except ValueError:
        return None
    return str(chat), (mid,)


def _reply_parameters(reply_to: str | None, chat_id: int | str) -> ReplyParameters | None:
    if not reply_to:
        return None
    with contextlib.suppress(ValueError):
        reply_chat, message_id = parse_native_id(reply_to)
        return ReplyParameters(
            message_id=message_id,
            chat_id=None if reply_chat == chat_id else reply_chat,
            allow_sending_without_reply=True,
        )
    return None  # not a message id of ours (e.g. a button click): send without threading


def _keyboard(buttons: Sequence[tuple[str, str]]) -> InlineKeyboardMarkup:
    rows = inline_keyboard(buttons)
    return InlineKeyboardMarkup(
        inline_keyboard=[
            [InlineKeyboardButton(text=b["text"], callback_data=b["callback_data"]) for b in row]
            for row in rows
        ]
    )


_ALBUM_FAMILY = {"image": "visual", "video": "visual", "document": "document", "audio": "audio"}
"""Which kinds may share an album: photos with videos, documents alone, audio alone."""


def _albums(attachments: Sequence[Attachment]) -> list[list[Attachment]]:
    """Attachments in order, consecutive album-able ones of one family grouped (at most 10)."""
    runs: list[list[Attachment]] = []
    family: str | None = None
    for attachment in attachments:
        this = _ALBUM_FAMILY.get(attachment.kind)
        if this is not None and this == family and len(runs[-1]) < ALBUM_MAX:
            runs[-1].append(attachment)
        else:
            runs.append([attachment])
        family = this
    return runs


def _album(
    attachments: Sequence[Attachment], common: dict[str, Any], caption: str | None
) -> api.SendMediaGroup:
    media: list[Any] = []
    for index, attachment in enumerate(attachments):
        extra: dict[str, Any] = {}
        if index == 0 and caption is not None:
            extra = {"caption": caption, "parse_mode": "HTML"}
        file = _file(attachment)
        if attachment.kind == "image":
            media.append(InputMediaPhoto(media=file, **extra))
        elif attachment.kind == "video":
            media.append(InputMediaVideo(media=file, **extra))
        elif attachment.kind == "audio":
            media.append(InputMediaAudio(media=file, **extra))
        else:
            media.append(InputMediaDocument(media=file, **extra))
    return api.SendMediaGroup(**common, media=media)


def _file(attachment: Attachment) -> Any:
    if attachment.data is not None:
        return BufferedInputFile(attachment.data, filename=attachment.name or "file")
    if attachment.ref:
        return attachment.ref  # a file_id Telegram already has, or an HTTP URL it fetches
    raise PermanentError(f"the {attachment.kind} attachment has neither data nor ref")


def _captionable(attachment: Attachment) -> bool:
    return attachment.kind not in ("sticker", "location", "contact")


def _attachment_method(
    attachment: Attachment, common: dict[str, Any], caption: str | None
) -> api.TelegramMethod[Any]:
    meta = attachment.meta
    if attachment.kind == "location":
        try:
            return api.SendLocation(
                **common, latitude=float(meta["latitude"]), longitude=float(meta["longitude"])
            )
        except (KeyError, TypeError, ValueError):
            raise PermanentError(
                "a location attachment needs meta latitude and longitude"
            ) from None
    if attachment.kind == "contact":
        if not meta.get("phone_number"):
            raise PermanentError("a contact attachment needs meta phone_number")
        return api.SendContact(
            **common,
            phone_number=str(meta["phone_number"]),
            first_name=str(meta.get("first_name") or attachment.name or meta["phone_number"]),
            last_name=meta.get("last_name"),
        )
    file = _file(attachment)
    kind = attachment.kind
    extra: dict[str, Any] = {}
    if caption is not None and _captionable(attachment):
        extra = {"caption": caption, "parse_mode": "HTML"}
    if kind == "image":
        return api.SendPhoto(**common, photo=file, **extra)
    if kind == "video":
        return api.SendVideo(**common, video=file, **extra)
    if kind == "audio":
        return api.SendAudio(**common, audio=file, **extra)
    if kind == "voice":
        return api.SendVoice(**common, voice=file, **extra)
    if kind == "sticker":
        return api.SendSticker(**common, sticker=file)
    return api.SendDocument(**common, document=file, **extra)
