"""The Discord transport: a discord.py 2 client, the gateway in and REST out.

Inbound: the gateway's dispatches are read as Discord's own JSON (`on_socket_raw_receive`, a
documented debug event) and decoded by the pure codec. They are queued in arrival order and
handed to subscribers one at a time, so a thread's messages keep their order. discord.py resumes
a dropped session (the gateway replays what was missed, nothing twice) and re-identifies when the
resume is refused; the router's inbox drops anything delivered twice anyway. An event discord.py's
own parser fails on (a field missing or of another type) ends its `connect` instead: the run
fails with a TransientError saying so, the next run identifies afresh, and what Discord sent
between the two would be lost, as Discord replays nothing to a new session. discord.py offers
no way to skip one event or to resume from outside `connect`.

Catching up: what a new session (a restart, a refused resume, the run after such an event) was
not sent is fetched over REST instead. Per channel it delivered messages from, the connector
remembers the newest message id it took there (`cursors.py`; kept in memory, stored in the
store's state every few seconds and when the run ends: a lost update only means a message is
fetched again, which the router drops as a duplicate by its id). After each READY, a background
task asks `GET /channels/{id}/messages?after=` for the recently active channels; the consumer
takes what it found, oldest first, exactly as it takes a MESSAGE_CREATE, and holds the live
events of a channel until that channel's catch-up is in, so they follow it. The fetches keep to
Discord's global rate limit like every other REST call (none is made while it is in force: a
reconnect with many channels would earn a 429 per channel, toward Cloudflare's IP ban), and a
429 discord.py hands back on one is waited out and the fetch made again, up to
`_CATCH_UP_WAIT` in all. A channel whose fetch still fails is logged once and skipped; the
connection never fails over it.

A "zombie" connection, whose heartbeats the gateway stopped acknowledging while dispatches may
still arrive, is left as Discord's docs ask: with no HEARTBEAT_ACK for two heartbeat intervals
the socket is closed with code 4000, and discord.py resumes the session on a new one (the
gateway replays what the zombie never delivered). discord.py's own `heartbeat_timeout` cannot
notice it: it times out on the last frame received, whatever it was (`heartbeat.py`).

Logging in and `check` watch discord.py's REST answers (`answers.py`), so a server error it
quietly retries, or an answer of the wrong shape, is named with its request.

Outbound: `send` renders and splits at 2,000 characters and posts through discord.py with
`allowed_mentions` set to none, so an agent can never ping `@everyone`, a role or a user.
discord.py keeps one rate-limit bucket per route (per channel for messages): a 429 delays only
that route, waited out inside its bucket; a wait longer than `max_ratelimit_wait` is raised as
`RateLimitedError` for the router to schedule, for that thread. A global 429 (the bot's limit
across all routes) longer than that pauses the whole connection instead, and every REST call
fails at once until it is over rather than meet a 429 of its own (`ratelimit.py`).

Process-wide settings: see `endpoints.py` (`api_base` and `gateway_url` are shared by every
Discord connection of a process).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import json
import time
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import aiohttp

from talkbridge.backoff import Backoff
from talkbridge.cancellation import finish_despite_cancels
from talkbridge.connectors.base import BaseConnector, ConnectionStatus, ConnectorContext
from talkbridge.connectors.boundary import permanent, scrub
from talkbridge.connectors.buttons import replacement
from talkbridge.connectors.discord import endpoints, logs
from talkbridge.connectors.discord.answers import Answers
from talkbridge.connectors.discord.codec import (
    ChannelInfo,
    Names,
    addressed_to_bot,
    check_buttons,
    decode_bulk_delete,
    decode_delete,
    decode_event,
    native_id,
    parse_native_id,
    parse_thread_id,
    render_chunks,
)
from talkbridge.connectors.discord.config import DiscordConfig
from talkbridge.connectors.discord.cursors import Cursor, Cursors, after_cursor
from talkbridge.connectors.discord.errors import translate, translated, unreadable_event
from talkbridge.connectors.discord.heartbeat import (
    HEARTBEAT_ACK,
    HELLO,
    HeartbeatWatch,
    hello_interval,
    opcode,
)
from talkbridge.connectors.discord.ratelimit import GlobalLimit
from talkbridge.connectors.discord.render import DISCORD_TEXT_LIMIT, length
from talkbridge.connectors.discord.sdk import discord
from talkbridge.connectors.sending import PartialSends
from talkbridge.errors import (
    ConnectorError,
    NotFoundError,
    PermanentError,
    RateLimitedError,
    TransientError,
)
from talkbridge.message import NormalizedMessage, OutboundMessage, SendResult
from talkbridge.talk import KEEP, DirectoryEntry, EditButtons

HANDLED_EVENTS = frozenset(
    {
        "MESSAGE_CREATE",
        "MESSAGE_UPDATE",
        "MESSAGE_DELETE",
        "MESSAGE_DELETE_BULK",
        "INTERACTION_CREATE",
    }
)
_DELIVERY_SECONDS = 300.0
"""How long an event the subscribers cannot accept (the store out) is retried before it is
dropped, as the router's `send_retry_seconds` default: the store down for a few minutes loses
no message (live events wait behind it, in order)."""
_FINISH_SECONDS = 5.0
# Application flags: an intent switched on in the Developer Portal (the _LIMITED bit for bots in
# under 100 servers, the other once verified).
_PRESENCE_FLAGS = (1 << 12, 1 << 13)
_MEMBERS_FLAGS = (1 << 14, 1 << 15)
_CONTENT_FLAGS = (1 << 18, 1 << 19)
_T = TypeVar("_T")
_Item = tuple[str, dict[str, Any]]
_READY = "_READY"
"""A queue item: a new gateway session started (READY, not RESUMED): catch up."""
_CAUGHT_UP = "_CAUGHT_UP"
"""A queue item: what one channel's catch-up fetched (`channel_id`, `messages`, `session`)."""
_CURSOR_SAVE_SECONDS = 5.0
_CATCH_UP_DAYS = 7.0
_CATCH_UP_CHANNELS = 50
_CATCH_UP_PAGES = 5
"""At most this many pages of 100 messages per channel (Discord's largest page)."""
_CATCH_UP_SECONDS = 15.0
"""A catch-up request gives up after this long (discord.py retries a 500 for ~25 s): its
channel's live messages are held until it is in."""
_CATCH_UP_WAIT = 120.0
"""A channel's catch-up waits out rate limits (the global one, a 429 on its own fetches) up to
this long in all, its live messages held meanwhile; a longer one (a Cloudflare ban lasts an
hour) skips the channel, logged."""
_CATCH_UP_PARALLEL = 4
_HELLO_SECONDS = 10.0
"""How long `check` waits for the gateway to open and say HELLO."""
_CUT = "\n…"
"""Ends an edit whose text was longer than one message."""


def _take_all(queue: asyncio.Queue[_T]) -> list[_T]:
    items = []
    while not queue.empty():
        items.append(queue.get_nowait())
    return items


def create(config: DiscordConfig, context: ConnectorContext) -> DiscordConnector:
    return DiscordConnector(config, context)


def intents_for(config: DiscordConfig) -> discord.Intents:
    intents = discord.Intents.default()
    intents.message_content = config.intents.message_content
    intents.members = config.intents.members
    intents.presences = config.intents.presences
    return intents


class _Client(discord.Client):
    """A discord.py client that hands the gateway's raw dispatches to its connector."""

    def __init__(self, connector: DiscordConnector, **options: Any) -> None:
        super().__init__(**options)
        self.talkbridge = connector

    async def on_socket_raw_receive(self, raw: str) -> None:
        self.talkbridge._received(raw)  # synchronous: keeps arrival order

    async def on_ready(self) -> None:
        self.talkbridge._gateway_up()

    async def on_resumed(self) -> None:
        self.talkbridge._gateway_up()

    async def on_disconnect(self) -> None:
        self.talkbridge._gateway_lost()

    async def on_interaction(self, interaction: discord.Interaction) -> None:
        # Acknowledge a button click at once (Discord wants it within 3 s); the click itself
        # travels as a message through the raw dispatch.
        if interaction.type is discord.InteractionType.component:
            with contextlib.suppress(discord.HTTPException):
                if not interaction.response.is_done():
                    await interaction.response.defer()


class DiscordConnector(BaseConnector):
    """One bot token = one connection. Features: history, directory, activity, edit, delete,
    reactions, interactions."""

    channel = "discord"
    reports_deletions = True

    def __init__(self, config: DiscordConfig, context: ConnectorContext) -> None:
        super().__init__(config.id, context)
        self.config = config
        self._token = config.token.get_secret_value()
        self._log = context.logger.getChild(f"discord.{config.id}")
        self._endpoints = endpoints.Endpoints(config.api_base, config.gateway_url)
        self.client: _Client | None = None
        self._checked: Answers | None = None
        self._global = GlobalLimit(config.max_ratelimit_wait)
        """A global 429 discord.py handed back: every REST call waits it out (`ratelimit.py`)."""
        """What Discord answered the latest `check` (see `check_waiting`)."""
        self._queue: asyncio.Queue[_Item | None] = asyncio.Queue()
        """Gateway events to take in order; None: the run ended, stop after what is ahead."""
        self._cursor_key = f"discord:{config.id}:cursors"
        self._cursors: Cursors | None = None
        """Loaded from the store at the first run; see `cursors.py`."""
        self._session = 0
        """Counts the gateway sessions (READYs) the consumer saw: a catch-up's results are
        taken only while its session is the latest."""
        self._holding: dict[str, list[_Item]] = {}
        """Live events held per channel until that channel's catch-up is in."""
        self._catching_up: asyncio.Task[None] | None = None
        self._unfetchable: set[str] = set()
        """Channels whose catch-up failed and was logged (logged once per channel)."""
        self._status: ConnectionStatus | None = None
        self._beats = HeartbeatWatch()
        self._greeted = asyncio.Event()
        """Set at each gateway HELLO: the heartbeat watch has a connection to watch."""
        self._left_zombie: str | None = None
        """Why the gateway connection was closed by us (no ACKs), until it is back up."""
        self._partial = PartialSends(context.store, config.id, keep_for=context.dedupe_for)
        for name in ("history", "directory", "activity", "edit", "delete", "reactions"):
            self.provide(name, self)
        self.provide("interactions", self)

    def _new_client(self, answers: Answers) -> _Client:
        logs.install()  # before the first client: it warns about voice as it is made
        return _Client(
            self,
            http_trace=answers.trace(),
            intents=intents_for(self.config),
            enable_debug_events=True,
            guild_ready_timeout=self.config.guild_ready_timeout,
            max_ratelimit_timeout=self.config.max_ratelimit_wait,
            allowed_mentions=discord.AllowedMentions.none(),
            chunk_guilds_at_startup=False,
        )

    # ---- Transport -------------------------------------------------------------------------

    async def run(self, status: ConnectionStatus) -> None:
        endpoints.acquire(self, self._endpoints)
        self._status = status
        self._beats = HeartbeatWatch()  # an earlier run's connection is not watched
        self._left_zombie = None
        answers = Answers(self._token, self._global)
        client = self.client = self._new_client(answers)
        consumer: asyncio.Task[None] | None = None
        saver: asyncio.Task[None] | None = None
        watch: asyncio.Task[None] | None = None
        try:
            await self._load_cursors()
            # discord.py retries a 5xx to logging in for about 25 s: say so meanwhile.
            answers.on_server_error = lambda what: status.degraded(f"{what}; retrying")
            try:
                with translated(self._token, answers=answers):
                    await client.login(self._token)
            finally:
                answers.on_server_error = None
            consumer = asyncio.create_task(self._consume(), name=f"discord:{self.connection_id}")
            saver = asyncio.create_task(self._save_cursors_often())
            watch = asyncio.create_task(self._watch_heartbeats(client, status))
            with translated(self._token):
                try:
                    await client.connect(reconnect=True)
                except (AttributeError, KeyError, TypeError, ValueError) as exc:
                    if isinstance(exc, AttributeError) and isinstance(exc.__context__, Exception):
                        # discord.py, reconnecting after a gateway that never opened, reads the
                        # missing socket's sequence: the failure that matters is the one before.
                        raise exc.__context__ from None
                    # Raised by discord.py's parser of a gateway event (see `unreadable_event`).
                    raise unreadable_event(exc, self._token) from None
            if consumer.done():
                consumer.result()
            raise TransientError("the Discord gateway connection ended")
        finally:
            self._status = None
            # Nothing more comes in; closing is not cut short by the stop's repeated cancels.
            if watch is not None:
                watch.cancel()
                await finish_despite_cancels(watch, _FINISH_SECONDS)
            await finish_despite_cancels(asyncio.ensure_future(client.close()), _FINISH_SECONDS)
            await self._stop_catching_up()
            if consumer is not None:
                await self._let_finish(consumer)
            if saver is not None:
                saver.cancel()
                await finish_despite_cancels(saver, _FINISH_SECONDS)
            await finish_despite_cancels(asyncio.ensure_future(self._save_cursors()), 2.0)

    async def _let_finish(self, consumer: asyncio.Task[None]) -> None:
        """Let the consumer take the events the gateway already delivered before it ends.

        Discord never sends an event again (the next start opens a new session), so one left
        in the queue would be lost. A stopping bridge cancels this task more than once; each
        cancel waits for the events in hand, up to `_FINISH_SECONDS` in all.
        """
        self._queue.put_nowait(None)
        if not await finish_despite_cancels(consumer, _FINISH_SECONDS):
            consumer.cancel()
            remaining = [item for item in _take_all(self._queue) if item is not None]
            for item in remaining:  # for the next run's consumer, without this run's end marker
                self._queue.put_nowait(item)
            self._log.error(
                "%d Discord events were not taken within %g s: they are taken when the "
                "connection runs again, and lost if the bridge is stopping",
                len(remaining),
                _FINISH_SECONDS,
            )
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.wait([consumer])
            consumer.result()

    async def check(self) -> str:
        """Log in over REST: the bot's name and how many servers it is in."""
        owner = object()
        endpoints.acquire(owner, self._endpoints)
        answers = self._checked = Answers(self._token)
        client = self._new_client(answers)
        try:
            with translated(self._token, answers=answers):
                await client.login(self._token)
                guilds = [guild async for guild in client.fetch_guilds(limit=None)]
                app = await client.application_info()
            off = [
                name
                for name, wanted, (full, limited) in (
                    ("Message Content", self.config.intents.message_content, _CONTENT_FLAGS),
                    ("Server Members", self.config.intents.members, _MEMBERS_FLAGS),
                    ("Presence", self.config.intents.presences, _PRESENCE_FLAGS),
                )
                if wanted and not app.flags.value & (full | limited)
            ]
            if off:  # the gateway would close with 4014 at `run`
                raise PermanentError(
                    f"the {' and '.join(off)} intent{'s are' if len(off) > 1 else ' is'} off "
                    "for this app: switch it on in the Developer Portal (Bot > Privileged "
                    "Gateway Intents), or turn it off under `intents` in the config"
                )
            await self._hello(client)
            user = client.user
            name = f"{user.display_name} (@{user.name})" if user else "?"
            count = len(guilds)
            return f"{name} in {count} server{'s' * (count != 1)}"
        finally:
            await client.close()
            endpoints.release(owner)

    async def _hello(self, client: _Client) -> None:
        """Open the gateway and read its HELLO (op 10), without identifying (which would start
        a session, counted against the bot's daily limit): a gateway_url that leads nowhere
        fails `check` rather than every start of `run`."""
        url = discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY.with_query(v=10, encoding="json")
        where = f"the Discord gateway at {url.with_query(None)}"
        try:
            socket = await asyncio.wait_for(client.http.ws_connect(str(url)), _HELLO_SECONDS)
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            detail = (
                f"no answer within {_HELLO_SECONDS:g} s" if isinstance(exc, TimeoutError) else exc
            )
            raise TransientError(
                scrub(f"{where} cannot be reached: {detail}", self._token)
            ) from None
        try:
            frame = await socket.receive(timeout=_HELLO_SECONDS)
            op = None
            with contextlib.suppress(ValueError, TypeError, AttributeError):
                op = json.loads(frame.data).get("op")
            if op != 10:
                raise TransientError(
                    f"{where} did not greet with HELLO (op 10): is gateway_url Discord's gateway?"
                )
        except TimeoutError:
            raise TransientError(f"{where} sent no HELLO within {_HELLO_SECONDS:g} s") from None
        finally:
            await socket.close()

    def check_waiting(self) -> str | None:
        """Why the latest `check` had no result yet: a server error discord.py was retrying."""
        named = self._checked.describe_server_error() if self._checked is not None else None
        if named is None:
            return None
        return f"{named}; discord.py was still retrying it, and `run` retries until it passes"

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()
        endpoints.release(self)

    def _gateway_up(self) -> None:
        self._left_zombie = None
        if self._status is not None:
            self._status.up()

    def _gateway_lost(self) -> None:
        if self._status is not None and self._left_zombie is None:  # else that reason stands
            self._status.degraded("the Discord gateway connection dropped; resuming")

    async def _watch_heartbeats(self, client: _Client, status: ConnectionStatus) -> None:
        """Leave a gateway connection whose heartbeats go unacknowledged (see the module's
        docstring): close it with 4000, not 1000, so discord.py resumes the session."""
        while True:
            beats = self._beats
            due = beats.due()
            if due is None:  # nothing to watch until the next connection says HELLO
                self._greeted.clear()
                await self._greeted.wait()
                continue
            now = time.monotonic()
            if now < due:
                # About time itself: an ACK that came meanwhile moves the deadline on.
                await asyncio.sleep(due - now)
                continue
            silent = beats.zombie(now)
            if silent is None:
                continue
            reason = f"no HEARTBEAT_ACK from the Discord gateway for {silent:.1f} s; resuming"
            self._left_zombie = reason
            self._log.warning(
                "the Discord gateway acknowledged no heartbeat for %.1f s while the connection "
                "looked open (a zombie connection): closing it to resume the session",
                silent,
            )
            status.degraded(reason)
            socket = client.ws
            if socket is not None:
                try:
                    await socket.close(code=4000)  # not 1000: Discord keeps the session
                except Exception as exc:
                    self._log.warning(
                        "closing the unacknowledged Discord gateway connection failed: %s",
                        scrub(f"{type(exc).__name__}: {exc}", self._token),
                    )

    # ---- inbound ---------------------------------------------------------------------------

    def _received(self, raw: str | bytes) -> None:
        text = raw.decode() if isinstance(raw, bytes) else raw
        op = opcode(text)
        if op == HEARTBEAT_ACK:
            self._beats.ack(time.monotonic())
            return
        if op == HELLO:
            interval = hello_interval(text)
            if interval is not None:
                self._beats.hello(interval, time.monotonic())
                self._greeted.set()
            return
        if '"MESSAGE_' not in text and '"INTERACTION_CREATE"' not in text and '"READY"' not in text:
            return  # cheap filter: most gateway traffic is presence, typing, guild updates
        try:
            frame = json.loads(text)
        except ValueError:
            return
        kind = frame.get("t") if isinstance(frame, dict) else None
        data = frame.get("d") if isinstance(frame, dict) else None
        if kind in HANDLED_EVENTS and isinstance(data, dict):
            self._queue.put_nowait((kind, data))
        elif kind == "READY":  # a new session: Discord replays nothing to it
            self._queue.put_nowait((_READY, {}))

    async def _consume(self) -> None:
        while True:
            item = await self._queue.get()
            if item is None:
                held, self._holding = self._holding, {}
                for events in held.values():  # a catch-up cut short: live events still count
                    for kind, payload in events:
                        await self._take(kind, payload)
                return
            kind, payload = item
            if kind == _READY:
                await self._begin_catch_up()
            elif kind == _CAUGHT_UP:
                await self._caught_up(payload)
            elif (channel := str(payload.get("channel_id"))) in self._holding:
                self._holding[channel].append(item)
            else:
                await self._take(kind, payload)

    async def _take(self, kind: str, payload: dict[str, Any]) -> None:
        """Hand one event to the subscribers, retrying one they could not accept."""
        backoff = Backoff(base=0.2, cap=5.0)
        delivered = False
        deadline = time.monotonic() + _DELIVERY_SECONDS
        while True:
            try:
                delivered = await self._accept(kind, payload)
                break
            except ValueError as exc:  # undecodable: retrying cannot help
                self._log.error("skipping a %s that cannot be read: %s", kind, exc)
                break
            except Exception as exc:
                # The gateway never sends an event twice: retry a subscriber that could
                # not accept it (the store out, a Redis restarting) before giving up on it.
                reason = scrub(f"{type(exc).__name__}: {exc}", self._token)
                if time.monotonic() >= deadline:
                    self._log.error("dropping a %s not accepted: %s", kind, reason)
                    break
                log = self._log.warning if backoff.attempts == 0 else self._log.debug
                log(
                    "a %s was not accepted (%s); retrying for up to %g s",
                    kind,
                    reason,
                    _DELIVERY_SECONDS,
                )
                await asyncio.sleep(backoff.next())
        if kind == "MESSAGE_CREATE":  # not when cancelled mid-way: fetched again next time
            self._note_taken(payload, delivered)

    async def _accept(self, kind: str, payload: dict[str, Any]) -> bool:
        """Decode and deliver one event; True when a message was delivered."""
        if kind in ("MESSAGE_DELETE", "MESSAGE_DELETE_BULK"):
            await self._on_delete(kind, payload)
            return False
        client = self.client
        bot_id = client.user.id if client is not None and client.user is not None else None
        message = decode_event(
            kind,
            payload,
            connection_id=self.connection_id,
            bot_id=bot_id,
            names=self._names(payload),
            role_names=self._role_names(payload),
        )
        if message is None:
            return False
        mention_rule = (
            kind != "INTERACTION_CREATE"
            and self.config.require_mention
            and bool(payload.get("guild_id"))
        )
        if mention_rule and not addressed_to_bot(payload, bot_id, self._bot_role_ids(payload)):
            return False
        if mention_rule and message.edit_of is not None:
            found = await self.edit_or_question(message)
            if found is None:
                return False
            message = found
        await self.deliver(message)
        return True

    # ---- catching up after a new session -----------------------------------------------------

    def _note_taken(self, payload: Mapping[str, Any], delivered: bool) -> None:
        """A MESSAGE_CREATE was taken: a channel we delivered from moves its cursor (in memory;
        `_save_cursors_often` stores it)."""
        channel, ident = str(payload.get("channel_id")), str(payload.get("id"))
        cursors = self._cursors
        if cursors is None or not channel.isdigit() or not ident.isdigit():
            return
        if delivered or channel in cursors:
            guild = payload.get("guild_id")
            cursors.advance(channel, int(ident), str(guild) if guild else None)

    async def _load_cursors(self) -> None:
        if self._cursors is not None:
            return
        try:
            stored = await self.context.store.get_state(self._cursor_key)
        except Exception as exc:  # catching up is a bonus: never fail the connection over it
            self._log.warning("could not read where the Discord channels were read up to: %s", exc)
            stored = None
        self._cursors = Cursors.load(stored)

    async def _save_cursors(self) -> None:
        cursors = self._cursors
        if cursors is None or not cursors.dirty:
            return
        cursors.dirty = False
        try:
            await self.context.store.set_state(self._cursor_key, cursors.dump())
        except Exception as exc:
            cursors.dirty = True
            self._log.warning("could not store where the Discord channels were read up to: %s", exc)

    async def _save_cursors_often(self) -> None:
        while True:
            await asyncio.sleep(_CURSOR_SAVE_SECONDS)
            await self._save_cursors()

    async def _begin_catch_up(self) -> None:
        """A new session (the consumer took its READY): hold the live events of the channels
        to catch up on, and fetch what they missed in the background."""
        self._session += 1
        await self._stop_catching_up()  # an earlier session's: its results no longer count
        cursors = self._cursors
        now_ms = int(time.time() * 1000)
        due = (
            cursors.due(now_ms, max_age_days=_CATCH_UP_DAYS, limit=_CATCH_UP_CHANNELS)
            if cursors is not None
            else []
        )
        wanted = {channel for channel, _ in due}
        for channel in [c for c in self._holding if c not in wanted]:
            for kind, payload in self._holding.pop(channel):
                await self._take(kind, payload)
        for channel in wanted:
            self._holding.setdefault(channel, [])
        if due:
            self._catching_up = asyncio.create_task(
                self._catch_up(self._session, due), name=f"discord-catch-up:{self.connection_id}"
            )

    async def _stop_catching_up(self) -> None:
        task, self._catching_up = self._catching_up, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await finish_despite_cancels(task, _FINISH_SECONDS)

    async def _catch_up(self, session: int, due: list[tuple[str, Cursor]]) -> None:
        gate = asyncio.Semaphore(_CATCH_UP_PARALLEL)
        if (left := self._global.left()) > 0:
            self._log.warning(
                "Discord's global rate limit is in force for %.0f s more: catching up on %d "
                "channel(s) waits for it, their new messages held meanwhile",
                left,
                len(due),
            )

        async def one(channel: str, cursor: Cursor) -> None:
            found: list[dict[str, Any]] = []
            try:
                async with gate:
                    found = await self._fetch_after(channel, cursor)
            except Exception as exc:
                self._unfetchable_channel(channel, exc)
            finally:  # always: the channel's held live events wait for this
                self._queue.put_nowait(
                    (_CAUGHT_UP, {"session": session, "channel_id": channel, "messages": found})
                )

        await asyncio.gather(*(one(channel, cursor) for channel, cursor in due))

    async def _fetch_after(self, channel: str, cursor: Cursor) -> list[dict[str, Any]]:
        """What the channel has after `cursor`, oldest first, through discord.py's HTTP client
        (so at `api_base`, in the channel's rate-limit bucket). A 429 handed back (or the
        global limit in force) is waited out and the page asked again, up to `_CATCH_UP_WAIT`
        in all."""
        pages: list[list[Mapping[str, Any]]] = []
        after = cursor.message_id
        waited = 0.0
        while len(pages) < _CATCH_UP_PAGES:
            try:
                page = await self._history_page(channel, after)
            except RateLimitedError as exc:
                waited += exc.retry_after
                if waited > _CATCH_UP_WAIT:
                    raise
                if exc.scope == "connection":  # the bot's or its IP's: the other fetches wait too
                    self._global.hit(exc.retry_after)
                await asyncio.sleep(exc.retry_after)
                continue
            if not isinstance(page, list):
                raise TypeError(f"the answer is {type(page).__name__}, not a list of messages")
            items: list[Mapping[str, Any]] = [
                m for m in page if isinstance(m, dict) and str(m.get("id", "")).isdigit()
            ]
            pages.append(items)
            if len(page) < 100 or not items:
                break
            after = max(int(m["id"]) for m in items)
        return after_cursor(pages, cursor, channel)

    async def _history_page(self, channel: str, after: int) -> Any:
        """One page of the channel's messages after `after`; not asked (RateLimitedError at
        once) while the bot is globally rate limited, as no REST call is."""
        client = self._require_client()
        async with asyncio.timeout(_CATCH_UP_SECONDS):
            with translated(self._token, scope="thread", limit=self._global):
                return await client.http.logs_from(int(channel), 100, after=after)

    def _unfetchable_channel(self, channel: str, exc: Exception) -> None:
        gone = isinstance(exc, NotFoundError | PermanentError)  # deleted, or no longer readable
        if gone and self._cursors is not None:
            self._cursors.forget(channel)  # remembered again once a message comes from it
        if isinstance(exc, TimeoutError):
            reason = f"no answer within {_CATCH_UP_SECONDS:g} s"
        elif isinstance(exc, ConnectorError):
            reason = str(exc)
        elif isinstance(exc, discord.DiscordException):
            reason = str(translate(exc, self._token, scope="thread"))
        else:
            reason = scrub(f"{type(exc).__name__}: {exc}", self._token)
        log = self._log.debug if channel in self._unfetchable else self._log.warning
        self._unfetchable.add(channel)
        log(
            "could not fetch what Discord channel %s got while the bridge was away (%s): "
            "those messages are not delivered",
            channel,
            reason,
        )

    async def _caught_up(self, found: Mapping[str, Any]) -> None:
        """Take what one channel's catch-up fetched, then the live events held meanwhile."""
        if found.get("session") != self._session:
            return  # an earlier session's: the latest one's catch-up covers the channel
        channel = str(found.get("channel_id"))
        held = self._holding.pop(channel, [])
        live = {str(p.get("id")) for kind, p in held if kind == "MESSAGE_CREATE"}
        cursors = self._cursors
        for payload in found.get("messages") or ():
            ident = str(payload.get("id"))
            if ident in live or (cursors is not None and not cursors.is_new(channel, int(ident))):
                continue
            await self._take("MESSAGE_CREATE", payload)
        for kind, payload in held:
            await self._take(kind, payload)

    async def _on_delete(self, kind: str, payload: Mapping[str, Any]) -> None:
        """A deleted message takes the bot's reply to it along, whether deleted alone or in a
        moderator's purge (MESSAGE_DELETE_BULK, one event naming many)."""
        if kind == "MESSAGE_DELETE_BULK":
            deleted = decode_bulk_delete(payload)
        else:
            deleted = [one] if (one := decode_delete(payload)) is not None else []
        for thread_id, message_id in deleted:
            await self.withdraw_reply(thread_id, message_id)

    def _guild(self, payload: Mapping[str, Any]) -> discord.Guild | None:
        guild_id = payload.get("guild_id")
        if self.client is None or not guild_id:
            return None
        return self.client.get_guild(int(guild_id))

    def _names(self, payload: Mapping[str, Any]) -> Names:
        client = self.client
        if client is None:
            return Names()
        channels: dict[str, ChannelInfo] = {}
        wanted = {str(payload.get("channel_id"))}
        wanted.update(_ids_in(str(payload.get("content") or ""), "<#"))
        for ident in wanted:
            if not ident.isdigit():
                continue
            found = client.get_channel(int(ident))
            if isinstance(found, discord.Thread):
                parent = found.parent
                channels[ident] = ChannelInfo(
                    found.name, str(found.parent_id), parent.name if parent else None
                )
            elif found is not None and getattr(found, "name", None):
                channels[ident] = ChannelInfo(str(getattr(found, "name", "")))
        roles: dict[str, str] = {}
        guild = self._guild(payload)
        if guild is not None:
            for ident in payload.get("mention_roles") or ():
                role = guild.get_role(int(ident))
                if role is not None:
                    roles[str(ident)] = role.name
        return Names(channels, roles)

    def _role_names(self, payload: Mapping[str, Any]) -> tuple[str, ...]:
        guild = self._guild(payload)
        member = payload.get("member") or {}
        if guild is None or not isinstance(member, Mapping):
            return ()
        names = []
        for ident in member.get("roles") or ():
            role = guild.get_role(int(ident))
            if role is not None:
                names.append(role.name)
        return tuple(names)

    def _bot_role_ids(self, payload: Mapping[str, Any]) -> tuple[str, ...]:
        guild = self._guild(payload)
        role = guild.self_role if guild is not None else None
        return (str(role.id),) if role is not None else ()

    # ---- send ------------------------------------------------------------------------------

    def _require_client(self) -> _Client:
        if self.client is None or self.client.is_closed():
            raise TransientError("the Discord connection is not running")
        return self.client

    async def send(self, message: OutboundMessage) -> SendResult:
        channel_id = _channel(message.thread_id)
        if message.buttons:
            permanent(check_buttons, message.buttons)
        client = self._require_client()
        channel = client.get_partial_messageable(channel_id)
        steps = self._plan(message, channel_id)

        async def step(index: int) -> list[str]:
            view = _view(message.buttons) if message.buttons and index == len(steps) - 1 else None
            try:
                with translated(self._token, scope="thread", limit=self._global):
                    kwargs: dict[str, Any] = {**steps[index], **({"view": view} if view else {})}
                    if message.idempotency_key:
                        kwargs["nonce"] = _nonce(message.idempotency_key, index)
                    result = await channel.send(**kwargs)
            finally:
                if view is not None:
                    view.stop()  # clicks arrive as messages; no callback is kept around
            return [native_id(channel_id, result.id)]

        sent = await self._partial.send(message, len(steps), step)
        if not sent:
            raise PermanentError("nothing to send: the message rendered to no visible text")
        return SendResult(message_ids=tuple(sent))

    def _plan(self, message: OutboundMessage, channel_id: int) -> list[dict[str, Any]]:
        """The `channel.send` keyword sets that deliver `message`, in order."""
        chunks = render_chunks(message.text, message.markup) if message.text else []
        files: list[discord.File] = []
        links: list[str] = []
        for attachment in message.attachments:
            if attachment.data is not None:
                files.append(
                    discord.File(io.BytesIO(attachment.data), filename=attachment.name or "file")
                )
            elif attachment.ref:
                links.append(attachment.ref)  # a URL: Discord unfurls it
            else:
                raise PermanentError(f"the {attachment.kind} attachment has neither data nor ref")
        if links:
            chunks.extend(render_chunks("\n".join(links), "markdown"))
        steps: list[dict[str, Any]] = [{"content": chunk} for chunk in chunks]
        if files:
            if steps:
                steps[-1]["files"] = files
            else:
                steps.append({"files": files})
        reference = _reference(message.reply_to, channel_id)
        for step in steps:
            step["allowed_mentions"] = discord.AllowedMentions.none()
        if steps and reference is not None:
            steps[0]["reference"] = reference
            steps[0]["mention_author"] = False
        return steps

    # ---- features --------------------------------------------------------------------------

    async def fetch(
        self, thread_id: str, *, limit: int = 50, before: str | None = None
    ) -> Sequence[NormalizedMessage]:
        """Earlier messages of a channel or thread, oldest first (bots' included)."""
        client = self._require_client()
        channel_id = _channel(thread_id)
        before_id = _message(before)[1] if before else None
        with translated(self._token, scope="thread", limit=self._global):
            payloads = await client.http.logs_from(channel_id, max(1, min(limit, 100)), before_id)
        found: list[NormalizedMessage] = []
        for payload in reversed(payloads):
            decoded = decode_event(
                "MESSAGE_CREATE",
                {**payload, "author": {**payload.get("author", {}), "bot": False}},
                connection_id=self.connection_id,
                names=self._names(payload),
            )
            if decoded is not None:
                found.append(decoded)
        return found

    async def user(self, user_id: str) -> DirectoryEntry | None:
        client = self._require_client()
        if not user_id.isdigit():
            return None
        try:
            with translated(self._token, limit=self._global):
                found = await client.fetch_user(int(user_id))
        except ConnectorError as exc:
            if "404" in str(exc) or "Unknown" in str(exc):
                return None
            raise
        return DirectoryEntry(
            str(found.id), found.display_name, "user", {"username": found.name, "bot": found.bot}
        )

    async def thread(self, thread_id: str) -> DirectoryEntry | None:
        client = self._require_client()
        if not thread_id.isdigit():
            return None
        try:
            with translated(self._token, limit=self._global):
                found = await client.fetch_channel(int(thread_id))
        except ConnectorError as exc:
            if "404" in str(exc) or "Unknown" in str(exc):
                return None
            raise
        extra: dict[str, Any] = {"type": str(getattr(found, "type", ""))}
        parent = getattr(found, "parent_id", None)
        if isinstance(found, discord.Thread) and parent:
            extra["parent_id"] = str(parent)
        name = getattr(found, "name", None) or str(found.id)
        return DirectoryEntry(str(found.id), str(name), "thread", extra)

    async def typing(self, thread_id: str) -> None:
        client = self._require_client()
        with translated(self._token, scope="thread", limit=self._global):
            await client.http.send_typing(_channel(thread_id))

    async def edit(
        self, thread_id: str, message_id: str, text: str, *, buttons: EditButtons = KEEP
    ) -> None:
        """Discord keeps a message's buttons (`components`) unless the edit names others."""
        client = self._require_client()
        channel_id, mid = _message(message_id)
        given = replacement(buttons)
        if given:
            permanent(check_buttons, given)
        chunks = render_chunks(text, "markdown") or [text[:DISCORD_TEXT_LIMIT]]
        content = chunks[0]
        if len(chunks) > 1:
            # An edit cannot add messages: keep the first chunk of a split that leaves room
            # for the mark, so the cut falls on a line or word with code fences closed
            # (slicing the chunk cut its closing fence, and the rest showed as raw Markdown).
            content = render_chunks(text, "markdown", DISCORD_TEXT_LIMIT - len(_CUT))[0] + _CUT
        partial = client.get_partial_messageable(channel_id).get_partial_message(mid)
        kwargs: dict[str, Any] = {}
        if given is not None:
            kwargs["view"] = _view(given) if given else None  # None: `components: []`
        try:
            with translated(self._token, scope="thread", limit=self._global):
                await partial.edit(
                    content=content, allowed_mentions=discord.AllowedMentions.none(), **kwargs
                )
        finally:
            if kwargs.get("view") is not None:
                kwargs["view"].stop()  # clicks arrive as messages; no callback is kept around

    async def delete(self, thread_id: str, message_id: str) -> None:
        client = self._require_client()
        channel_id, mid = _message(message_id)
        partial = client.get_partial_messageable(channel_id).get_partial_message(mid)
        with translated(self._token, scope="thread", limit=self._global):
            await partial.delete()

    async def react(self, thread_id: str, message_id: str, emoji: str) -> None:
        client = self._require_client()
        channel_id, mid = _message(message_id)
        partial = client.get_partial_messageable(channel_id).get_partial_message(mid)
        with translated(self._token, scope="thread", limit=self._global):
            await partial.add_reaction(emoji)

    async def send_buttons(
        self, thread_id: str, text: str, buttons: Sequence[tuple[str, str]]
    ) -> SendResult:
        return await self.send(
            OutboundMessage(thread_id=thread_id, text=text, buttons=tuple(buttons))
        )


def _ids_in(content: str, prefix: str) -> set[str]:
    found: set[str] = set()
    start = content.find(prefix)
    while start != -1:
        end = content.find(">", start)
        if end == -1:
            break
        ident = content[start + len(prefix) : end]
        if ident.isdigit():
            found.add(ident)
        start = content.find(prefix, end)
    return found


def _channel(thread_id: str) -> int:
    return permanent(parse_thread_id, thread_id)


def _message(message_id: str) -> tuple[int, int]:
    return permanent(parse_native_id, message_id)


def _nonce(key: str, index: int) -> str:
    """The nonce of step `index` of the send keyed `key`: the same on every retry, so Discord
    (discord.py sends `enforce_nonce`) answers a retry whose first answer was lost with the
    message it created then, instead of creating it twice. At most 25 characters (Discord's
    limit), as discord.py's own are: a 63-bit number."""
    digest = hashlib.sha256(f"{index}:{key}".encode()).digest()
    return str(int.from_bytes(digest[:8], "big") >> 1)


def _reference(reply_to: str | None, channel_id: int) -> discord.MessageReference | None:
    if not reply_to:
        return None
    try:
        reply_channel, message_id = parse_native_id(reply_to)
    except ValueError:
        return None  # not a message of ours (e.g. a button click): send without a reference
    return discord.MessageReference(
        message_id=message_id, channel_id=reply_channel, fail_if_not_exists=False
    )


def _view(buttons: Sequence[tuple[str, str]]) -> discord.ui.View:
    view = discord.ui.View(timeout=None)
    for label, value in buttons:
        view.add_item(
            discord.ui.Button(label=label, custom_id=value, style=discord.ButtonStyle.secondary)
        )
    return view


__all__ = ["DiscordConnector", "create", "intents_for", "length"]
