"""The bundled webchat: one websockets server carries the page, `/healthz` and the chat socket.

The connector keeps the webchat's history itself (`keeps_history`), because the socket needs the
history sequence number of each message at once: every frame carries its `seq`, which is how a
reconnecting page resumes without losing or repeating anything. See docs/webchat-protocol.md.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import hashlib
import json
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from contextlib import suppress
from datetime import timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from websockets.asyncio.server import ServerConnection, broadcast, serve
from websockets.exceptions import ConnectionClosed
from websockets.frames import Frame, Opcode

from talkbridge.cancellation import finish_despite_cancels
from talkbridge.config import WebchatConfig
from talkbridge.connectors.base import BaseConnector, ConnectionStatus, ConnectorContext
from talkbridge.connectors.sending import keep_latest
from talkbridge.errors import NotFoundError, StoreError, TransientError
from talkbridge.ids import unique_id
from talkbridge.message import NormalizedMessage, OutboundMessage, SendResult, utcnow
from talkbridge.store.base import HistoryEntry
from talkbridge.webchat.auth import GENERATED_IDENTITY, TokenAuth
from talkbridge.webchat.protocol import (
    CLOSE_FORBIDDEN,
    CLOSE_TOO_MANY_SESSIONS,
    CLOSE_UNAUTHORIZED,
    FORWARDED,
    FORWARDED_TEXT,
    NOT_ANSWERED,
    NOT_ANSWERED_TEXT,
    NOTE_SENDER,
    PROTOCOL_VERSION,
    AuthFrame,
    ClientFrame,
    ErrorCode,
    FrameError,
    HistoryFrame,
    NewConversationFrame,
    PingFrame,
    SendFrame,
    dumps,
    error_frame,
    frame_ids,
    message_frame,
    parse_frame,
    reply_frame,
)
from talkbridge.webchat.routes import HttpRoutes, cookie_refusal, cookie_token
from talkbridge.webchat.sessions import Conversation, Sessions, split_thread, token_hash
from talkbridge.webchat.socket_writes import keeping_up, write_frames
from talkbridge.webchat.streams import DELTA_WINDOW, DeltaCoalescer
from talkbridge.webchat.unreadable import AnsweringConnection, close_after_answer

if TYPE_CHECKING:
    from talkbridge.cluster.fanout import WebchatFanout

CONNECTION_ID = "webchat"
CLOSE_SECONDS = 5.0
"""How long a stop waits for the sockets to close and their handlers to end."""
REPLIES = "webchat:replies"
"""The store's once-only records of replies sent with an idempotency key: apart from the users'
messages (`CONNECTION_ID`), whose client ids could otherwise take a reply's id."""
USER_DISPLAY_NAME = "Webchat user"
MAX_UNPUBLISHED = 4096
"""Stored messages whose hand-over failed, remembered for the resend that publishes them."""


class _Bucket:
    """Token bucket: `rate` frames a second on average, bursts of up to `burst`."""

    __slots__ = ("_burst", "_level", "_rate", "_stamp")

    def __init__(self, rate: float, burst: int) -> None:
        self._rate, self._burst = rate, float(burst)
        self._level, self._stamp = float(burst), time.monotonic()

    def take(self) -> float:
        """0.0 when a frame may pass, else the seconds until one may."""
        now = time.monotonic()
        self._level = min(self._burst, self._level + (now - self._stamp) * self._rate)
        self._stamp = now
        if self._level >= 1.0:
            self._level -= 1.0
            return 0.0
        return (1.0 - self._level) / self._rate


def _rate_limited(data: str | bytes, wait: float, max_bytes: int) -> dict[str, Any]:
    """The error for a frame dropped by the rate limit, naming that frame where it can."""
    seconds = math.ceil(wait * 100) / 100
    ids: dict[str, str] = {}
    if isinstance(data, str) and len(data) <= max_bytes:  # which frame to send again
        with suppress(ValueError, RecursionError):
            ids = frame_ids(json.loads(data))
    return error_frame(
        "rate_limited",
        f"too many frames; wait {seconds:.2f} s and send this one again",
        retry_after=seconds,
        **ids,
    )


class WebchatConnector(BaseConnector):
    """Channel `webchat`, connection id `webchat`; a Transport the registry runs.

    Features: `streaming` (`delta`), `activity` (`typing`) and `history` (`fetch`).
    """

    channel = "webchat"
    keeps_history = True
    """The router must not write history for this connector: it does so itself, with seqs."""
    runs_everywhere = True
    """Distributed mode: served by every node (no lease); frames fan out through Redis."""
    send_concurrency = 1024
    """A send is a local write and one frame per socket, not a rate-limited API call: the
    router's default of 8 in flight per connection capped every user's replies together."""
    frame_rate = 20.0
    frame_burst = 60
    auth_timeout = 10.0
    slow_socket_bytes = 32 << 20
    """Bytes waiting to be written to one socket past which it is cut rather than buffered on."""

    def __init__(
        self,
        config: WebchatConfig,
        context: ConnectorContext,
        tokens: Sequence[str],
        health: Callable[[], dict[str, Any]],
        *,
        node_info: Callable[[], dict[str, Any]] | None = None,
        generated_token: bool = False,
        dedupe_for: timedelta = timedelta(days=7),
    ) -> None:
        if not all(tokens) or not (tokens or config.issuer):
            raise ValueError("the webchat needs at least one non-empty token or an issuer")
        super().__init__(CONNECTION_ID, context)
        self.config = config
        self.log = context.logger.getChild("webchat")
        self._tokens = list(tokens)
        self._auth = TokenAuth(self._tokens, config.issuer, generated=generated_token)
        self._routes = HttpRoutes(self._auth, health, node_info=node_info)
        self._fanout: WebchatFanout | None = None
        self._sessions = Sessions(context.store, max_per_identity=config.max_sessions_per_token)
        self._sockets: dict[str, set[ServerConnection]] = {}
        self._unpublished: OrderedDict[str, Conversation | None] = OrderedDict()
        """Messages stored whose hand-over to the router failed, so no tab was sent them yet:
        the resend that hands them over publishes them (with the title they gave, if any)."""
        self._streams = DeltaCoalescer(self._publish_delta, DELTA_WINDOW)
        self.port: int | None = None
        """The bound port once `ready` is set (useful with `port: 0`)."""
        self.ready = asyncio.Event()
        self.listen_error: str | None = None
        """Why the last attempt to listen failed (None once listening)."""
        self._attempted = asyncio.Event()
        self._closing: set[asyncio.Future[None]] = set()
        """Sockets being closed as their token expired (held so the task is not collected)."""
        self._dedupe_for = dedupe_for
        """How long the router remembers a message it handled (`retention.dedupe_days`)."""
        self.provide("streaming", self)
        self.provide("activity", self)
        self.provide("history", self)
        self.provide("notices", self)

    # ---- transport ---------------------------------------------------------------------------

    def url(self, token: str | None = None) -> str:
        """The address to open in a browser; with `token`, the full link that logs straight in."""
        host = self.config.host
        if host in ("", "0.0.0.0"):
            host = "127.0.0.1"
        elif host == "::":  # an IPv6-only socket: 127.0.0.1 would find nobody
            host = "::1"
        if ":" in host:
            host = f"[{host}]"
        port = self.port if self.port is not None else self.config.port
        base = f"http://{host}:{port}/"
        return f"{base}?token={quote(token, safe='')}" if token else base

    async def run(self, status: ConnectionStatus) -> None:
        """Serve until cancelled; cancelling closes every socket with 1001 (going away)."""
        limit = self.config.max_frame_bytes
        try:
            server = await serve(
                self._handle,
                self.config.host,
                self.config.port,
                process_request=self._routes,
                # Answers the requests websockets' parser cannot read (a body, HTTP/2…),
                # which it would close without a word.
                create_connection=AnsweringConnection,
                process_response=close_after_answer,
                # Above our own limit, so an oversized frame gets an error frame from us
                # instead of the library closing the socket (1009) on the user.
                max_size=max(limit * 16, 1 << 20),
                compression=None,
                logger=self._socket_log(),
            )
        except OSError as exc:
            self.listen_error = _listen_error(self.config.host, self.config.port, exc)
            self._attempted.set()
            raise TransientError(self.listen_error) from exc
        try:
            self.port = next(iter(server.sockets)).getsockname()[1]
            status.up()
            self.listen_error = None
            self.ready.set()
            self._attempted.set()
            await asyncio.Future()
        finally:
            self.ready.clear()
            server.close()
            # The sockets' handlers finish the frames they hold (a send being saved and handed
            # over) before the bridge closes the store: the stop cancels this task again every
            # 0.25 s (`cancel_and_wait`), which cut this wait short, and they ran on after it.
            closed = asyncio.ensure_future(server.wait_closed())
            if not await finish_despite_cancels(closed, CLOSE_SECONDS):
                self.log.warning("stopping: webchat sockets still open after %g s", CLOSE_SECONDS)

    def _socket_log(self) -> logging.Logger:
        """websockets' logger: a line for every socket and request opened or closed is for
        debugging, so below debug only its warnings show (and its frames without tokens)."""
        sockets = self.log.getChild("sockets")
        if sockets.level == logging.NOTSET and not self.log.isEnabledFor(logging.DEBUG):
            sockets.setLevel(logging.WARNING)
        if not any(isinstance(f, _FrameTokenMask) for f in sockets.filters):
            sockets.addFilter(_FrameTokenMask())
        return sockets

    async def listening(self) -> None:
        """Wait for the first attempt to listen; raise `TransientError` (why) if it failed.

        For `talkbridge run`: a port in use is reported at once, not after the registry's
        retries (which go on for apps that prefer to wait).
        """
        await self._attempted.wait()
        if not self.ready.is_set():
            raise TransientError(self.listen_error or "the webchat is not listening")

    # ---- sockets -----------------------------------------------------------------------------

    async def _handle(self, ws: ServerConnection) -> None:
        try:
            authenticated = await self._authenticate(ws)
            if authenticated is None:
                return
            session_id, expires_at = authenticated
            self._sockets.setdefault(session_id, set()).add(ws)
            expiry = None
            if expires_at is not None:  # a signed token: the socket lasts as long as it does
                delay = max(0.0, expires_at - time.time())
                expiry = asyncio.get_running_loop().call_later(delay, self._token_expired, ws)
            try:
                await self._serve_socket(ws, session_id)
            finally:
                if expiry is not None:
                    expiry.cancel()
                sockets = self._sockets.get(session_id)
                if sockets is not None:
                    sockets.discard(ws)
                    if not sockets:
                        del self._sockets[session_id]
                        self._sessions.forget(session_id)
        except ConnectionClosed:
            pass

    def _token_expired(self, ws: ServerConnection) -> None:
        """The signed token a socket authenticated with has expired: an app cutting a user
        off with short-lived tokens must not be outlived by the sockets already open."""
        task = asyncio.ensure_future(_close_expired(ws))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def _authenticate(self, ws: ServerConnection) -> tuple[str, float | None] | None:
        """The session the socket's auth frame opens, and when its token expires (if it does);
        None when it is refused (the socket is closed, saying why)."""
        limit = self.config.max_frame_bytes
        try:
            data = await asyncio.wait_for(ws.recv(), self.auth_timeout)
        except TimeoutError:
            await _refuse(ws, "unauthorized", "authenticate first: send an auth frame with a token")
            return None
        try:
            frame = parse_frame(data, limit)
        except FrameError as exc:
            reason = str(exc)
            if exc.code == "too_large":  # not read, so whether it was an auth frame is unknown
                reason = f"the first frame is too large ({reason}); an auth frame fits well within"
            elif not reason.startswith("bad auth frame"):
                reason = f"the first frame must be an auth frame; {reason}"
            await _refuse(ws, "unauthorized", reason, exc.fields.get("ref"))
            return None
        if not isinstance(frame, AuthFrame):
            await _refuse(
                ws, "unauthorized", f"the first frame must be auth, not {frame.type}", frame.ref
            )
            return None
        token = frame.token
        if token is None and ws.request is not None:
            token = cookie_token(ws.request.headers)
            refusal = cookie_refusal(ws.request.headers) if token else None
            if refusal is not None:
                await _refuse(ws, "unauthorized", refusal, frame.ref)
                return None
        if not token:
            await _refuse(
                ws,
                "unauthorized",
                "no token: give one in the auth frame, or open the link first",
                frame.ref,
            )
            return None
        admitted = self._auth.admit(token)
        if admitted is None:
            await _refuse(ws, "unauthorized", self._auth.refusal(token), frame.ref)
            return None
        identity, expires_at = admitted
        try:
            # Sessions of the generated token made before it had an identity of its own were
            # bound to the token's hash: they are the same holder's, and move over.
            earlier = token_hash(token) if identity == GENERATED_IDENTITY else None
            session_id, created = await self._sessions.authenticate(
                identity, frame.session_id, earlier_identity=earlier
            )
        except FrameError as exc:
            close = CLOSE_TOO_MANY_SESSIONS if exc.code == "too_many_sessions" else CLOSE_FORBIDDEN
            await _refuse(ws, exc.code, str(exc), frame.ref, close)
            return None
        conversations = await self._sessions.conversations(session_id)
        ready: dict[str, Any] = {
            "type": "ready",
            "protocol": PROTOCOL_VERSION,
            "session_id": session_id,
            "user_id": session_id,
            "new_session": created,
            "conversations": [c.as_frame(session_id) for c in conversations],
            "limits": {
                "max_frame_bytes": limit,
                "history_limit": self.config.history_limit,
            },
        }
        await ws.send(dumps(reply_frame(ready, frame.ref)))
        return session_id, expires_at

    async def _serve_socket(self, ws: ServerConnection, session_id: str) -> None:
        bucket = _Bucket(self.frame_rate, self.frame_burst)
        async for data in ws:
            wait = bucket.take()
            if wait:
                await ws.send(dumps(_rate_limited(data, wait, self.config.max_frame_bytes)))
                continue
            frame: ClientFrame | None = None
            try:
                frame = parse_frame(data, self.config.max_frame_bytes)
                await self._dispatch(ws, session_id, frame)
            except FrameError as exc:
                await ws.send(dumps(exc.frame()))
            except ConnectionClosed:
                raise
            except Exception as exc:
                # The store unreachable, most likely: the client can tell which frame to send
                # again (and when) from the frame's own ids.
                self.log.error("webchat frame failed: %s", exc, exc_info=not _store_down(exc))
                ids = frame_ids(frame.model_dump()) if frame is not None else {}
                await ws.send(
                    dumps(
                        error_frame(
                            "internal",
                            (
                                "the bridge cannot save messages right now (its store is "
                                "failing); send it again"
                                if _store_down(exc)
                                else "the server failed on that frame; send it again"
                            ),
                            retry_after=1.0,
                            **ids,
                        )
                    )
                )

    async def _dispatch(self, ws: ServerConnection, session_id: str, frame: ClientFrame) -> None:
        if isinstance(frame, SendFrame):
            await self._on_send(ws, session_id, frame)
        elif isinstance(frame, HistoryFrame):
            await self._on_history(ws, session_id, frame)
        elif isinstance(frame, NewConversationFrame):
            try:
                conv = await self._sessions.new_conversation(session_id, frame.title or "")
            except FrameError as exc:
                if frame.ref is not None:  # which request it answers
                    exc.fields.setdefault("ref", frame.ref)
                raise
            out: dict[str, Any] = {
                "type": "conversation",
                "conversation": conv.as_frame(session_id),
            }
            if frame.ref is None:
                await self._publish(session_id, out)
            else:  # the ref is the asking socket's own: the other tabs get the frame without it
                await ws.send(dumps(reply_frame(out, frame.ref)))
                await self._publish(session_id, out, skip=ws)
        elif isinstance(frame, PingFrame):
            await ws.send(dumps(reply_frame({"type": "pong"}, frame.ref)))
        else:
            raise FrameError("bad_frame", "this socket is already authenticated", ref=frame.ref)

    async def _own_thread(self, session_id: str, thread_id: str, ref: str | None) -> str:
        """The conversation id of `thread_id` when it is this session's, else a FrameError."""
        parts = split_thread(thread_id)
        if parts is None:
            raise FrameError(
                "bad_frame",
                "thread_id must be '<session_id>.<conversation_id>' as given in ready",
                ref=ref,
            )
        if parts[0] != session_id:
            raise FrameError(
                "forbidden", "that thread belongs to another session", ref=ref, thread_id=thread_id
            )
        if await self._sessions.find(session_id, parts[1]) is None:
            raise FrameError(
                "not_found", "this session has no such conversation", ref=ref, thread_id=thread_id
            )
        return parts[1]

    async def _on_send(self, ws: ServerConnection, session_id: str, frame: SendFrame) -> None:
        thread_id = frame.thread_id
        try:
            conv_id = await self._own_thread(session_id, thread_id, frame.ref)
        except FrameError as exc:
            exc.fields["client_id"] = frame.client_id
            raise
        native_id = f"{thread_id}:{frame.client_id}"
        store = self.context.store
        ack = reply_frame(
            {"type": "ack", "thread_id": thread_id, "client_id": frame.client_id, "id": native_id},
            frame.ref,
        )
        # One lock per session: turns reach the router in seq order. The store records a
        # client id once even when a resend races its original (two tabs, two nodes).
        async with self._sessions.lock(session_id):
            seq, entry = await store.append_history_once(
                CONNECTION_ID,
                native_id,
                _thread_key(thread_id),
                "user",
                session_id,
                frame.text,
                data={"client_id": frame.client_id},
            )
            # Acknowledged only once the router has the turn: an ack means the message will
            # be answered, even if the bridge stops right after. Without one, the page keeps
            # the message and sends it again.
            if entry is None:  # sent before: hand it over again (the router drops it if it
                # has it, and takes it if the bridge stopped before handing it over)
                recorded = await self._recorded(seq, native_id, thread_id)
                if (
                    recorded is not None
                    and self._router_may_know(recorded, native_id)
                    and not await self._deliver_turn(
                        ws, self._inbound(recorded, thread_id, session_id)
                    )
                ):
                    return
                ack_text = dumps({**ack, "seq": seq, "duplicate": True})
                published = native_id not in self._unpublished
                renamed = self._unpublished.pop(native_id, None)
                if recorded is None or published:
                    broadcast((ws,), ack_text)
                    return
                entry = recorded  # its first try failed: the other tabs have not seen it yet
            else:
                renamed = await self._sessions.title_from(session_id, conv_id, frame.text)
                if not await self._deliver_turn(ws, self._inbound(entry, thread_id, session_id)):
                    keep_latest(self._unpublished, native_id, renamed, MAX_UNPUBLISHED)
                    return
                ack_text = dumps({**ack, "seq": seq, "duplicate": False})
            # Written without waiting, like every frame `_publish` writes: the turn is the
            # router's already, whether or not this socket is still open.
            await self._publish(session_id, message_frame(thread_id, entry), then=(ws, ack_text))
            if renamed is not None:
                named = {"type": "conversation", "conversation": renamed.as_frame(session_id)}
                await self._publish(session_id, named)

    def _router_may_know(self, recorded: HistoryEntry, native_id: str) -> bool:
        """Whether a resend may be handed to the router again: only while the router still
        remembers the ids it handled (`retention.dedupe_days`). Later it would take the resend
        for a new message and answer it twice; a hand-over that failed here is always retried."""
        if native_id in self._unpublished:
            return True
        return utcnow() - recorded.created_at < self._dedupe_for

    async def _recorded(self, seq: int, native_id: str, thread_id: str) -> HistoryEntry | None:
        entries = await self.context.store.history(
            _thread_key(thread_id), limit=1, before_seq=seq + 1
        )
        if not entries or entries[0].message_id != native_id:
            return None
        return entries[0]

    def _inbound(self, entry: HistoryEntry, thread_id: str, session_id: str) -> NormalizedMessage:
        return NormalizedMessage(
            id=entry.message_id,
            connection_id=CONNECTION_ID,
            channel="webchat",
            channel_user_id=session_id,
            display_name=USER_DISPLAY_NAME,
            thread_id=thread_id,
            thread_type="private",
            timestamp=entry.created_at,
            text=entry.text,
        )

    async def _deliver_turn(self, ws: ServerConnection, message: NormalizedMessage) -> bool:
        """Hand the turn to the router; if that fails, say so (the client sends it again with
        the same client id, which retries) and return False."""
        try:
            await self.deliver(message)
        except Exception:
            self.log.exception("webchat: the router did not accept a message")
            await ws.send(
                dumps(
                    error_frame(
                        "internal",
                        "your message is saved but the bridge could not take it yet; "
                        "sending it again with the same client_id retries",
                        thread_id=message.thread_id,
                        client_id=message.id.rpartition(":")[2],
                        retry_after=1.0,
                    )
                )
            )
            return False
        return True

    async def _on_history(self, ws: ServerConnection, session_id: str, frame: HistoryFrame) -> None:
        await self._own_thread(session_id, frame.thread_id, frame.ref)
        cap = self.config.history_limit
        limit = min(frame.limit or cap, cap)
        forward = frame.after_seq > 0
        entries = await self.context.store.history(
            _thread_key(frame.thread_id),
            limit=limit + 1 if forward else limit,  # one more: whether newer ones remain
            after_seq=frame.after_seq,
            before_seq=frame.before_seq or 0,
        )
        more = forward and len(entries) > limit
        if more:
            entries = entries[:limit]
        # The direction asked, and only that one: a `before_seq` page said `after_seq: 0`
        # too, which a client reads as the answer to a first load.
        direction = (
            {"after_seq": frame.after_seq}
            if frame.before_seq is None
            else {"before_seq": frame.before_seq}
        )
        out: dict[str, Any] = {
            "type": "history",
            "thread_id": frame.thread_id,
            **direction,
            "messages": [message_frame(frame.thread_id, e) for e in entries],
            # `more`: newer entries remain, ask again after the last seq; `earlier`: older
            # entries exist than the first one returned (ask with `before_seq` = its seq).
            "more": more,
            "earlier": bool(entries) and entries[0].seq > 1,
        }
        await ws.send(dumps(reply_frame(out, frame.ref)))
        # A reply under way: its text so far, for a tab that joins (or comes back) mid-stream;
        # the deltas after it continue from there.
        under_way = self._streams.so_far(frame.thread_id)
        if under_way is not None:
            stream_id, text = under_way
            await ws.send(
                dumps(
                    {
                        "type": "delta",
                        "thread_id": frame.thread_id,
                        "stream_id": stream_id,
                        "text": text,
                        "from_start": True,
                    }
                )
            )

    def use_fanout(self, fanout: WebchatFanout) -> None:
        """Distributed mode: frames also reach this session's sockets on the other nodes."""
        self._fanout = fanout
        fanout.set_receiver(self._from_other_node)

    def _from_other_node(self, session_id: str, text: str) -> None:
        """A frame another node published for a session: this node's sockets get it, and a
        reply streaming there is followed here too, so a tab that joins this node mid-stream
        is caught up like one that joins the node running the turn."""
        if text.startswith('{"type":"delta"'):
            delta = json.loads(text)
            self._streams.published(delta["thread_id"], delta["stream_id"], delta["text"])
        elif text.startswith('{"type":"message"') and '"stream_id"' in text:
            self._streams.ended(json.loads(text)["thread_id"])  # a streamed reply's end
        elif text.startswith('{"type":"stream_end"'):
            end = json.loads(text)
            self._streams.forget(end["thread_id"], end["stream_id"])
        self.broadcast_local(session_id, text)

    async def _publish(
        self,
        session_id: str,
        frame: dict[str, Any],
        *,
        then: tuple[ServerConnection, str] | None = None,
        skip: ServerConnection | None = None,
    ) -> None:
        """Send a frame to every socket of a session (every tab and device, on every node).

        The one place fan-out happens: this node's sockets get it at once, other nodes' through
        the fan-out (distributed mode). `broadcast` writes to each socket without waiting, so a
        slow tab never stalls the rest. `then` is a socket and a frame it gets right after this
        one, in the same write (a message and its ack to the tab that sent it). `skip` is a
        socket that got its own copy already.
        """
        text = dumps(frame)
        if then is not None:
            skip, after = then
            if self._keeping_up((skip,)):
                write_frames(skip, (text, after))
        if skip is None:
            self.broadcast_local(session_id, text)
        else:
            sockets = self._sockets.get(session_id)
            if sockets and len(sockets) > 1:
                broadcast(self._keeping_up(s for s in sockets if s is not skip), text)
        if self._fanout is not None:
            await self._fanout.publish(session_id, text)

    def broadcast_local(self, session_id: str, text: str) -> None:
        """Write a frame to this process's sockets of a session."""
        sockets = self._sockets.get(session_id)
        if sockets:
            broadcast(self._keeping_up(sockets), text)

    def _keeping_up(self, sockets: Iterable[ServerConnection]) -> list[ServerConnection]:
        """`sockets` but those that stopped reading (cut: they resume from history). A history
        answer is written whole, so a page is never cut while it reads the largest one."""
        largest_answer = 2 * self.config.history_limit * self.config.max_frame_bytes
        return keeping_up(sockets, max(self.slow_socket_bytes, largest_answer), self.log)

    # ---- Talk --------------------------------------------------------------------------------

    async def send(self, message: OutboundMessage) -> SendResult:
        parts = await self._existing_thread(message.thread_id)
        text = _with_attachments(message)
        key = message.idempotency_key
        # A reply with a key (the bridge's answer to a message) gets an id of its own key, kept
        # once: a turn run again after a crash between the reply's entry and the record of its
        # send (`record_sent`) finds that entry instead of adding a second answer.
        suffix = unique_id() if key is None else hashlib.sha256(key.encode()).hexdigest()[:24]
        message_id = f"{message.thread_id}:r{suffix}"
        data: dict[str, Any] = {"markup": message.markup}
        stream_id = message.meta.get("stream_id")
        if isinstance(stream_id, str):
            data["stream_id"] = stream_id
        sender = message.meta.get("agent")
        if isinstance(stream_id, str):
            await self._streams.finish(stream_id)  # every piece before the final message
        store = self.context.store
        thread_key = _thread_key(message.thread_id)
        by = sender if isinstance(sender, str) else "assistant"
        try:
            if key is None:
                entry: HistoryEntry | None = await store.append_history(
                    thread_key, "assistant", message_id, by, text, data=data
                )
            else:
                appended = await store.append_history_once(
                    REPLIES, message_id, thread_key, "assistant", by, text, data=data
                )
                entry = appended.entry
        except StoreError as exc:  # the webchat's "platform" is its store: an outage passes
            raise TransientError(f"the reply could not be kept: {exc}") from exc
        if entry is None:  # kept before: the pages have it (or get it from history); a
            # stream of this run is ended by `end` (`stream_end`)
            return SendResult(message_ids=(message_id,))
        await self._publish(parts[0], message_frame(message.thread_id, entry))
        if isinstance(stream_id, str):  # the end of a streamed reply, and of any cut off before
            self._streams.ended(message.thread_id, stream_id)
        return SendResult(message_ids=(message_id,))

    async def _existing_thread(self, thread_id: str) -> tuple[str, str]:
        """`(session_id, conversation_id)` of a thread some session has, else `NotFoundError`:
        what is sent to a thread nobody has would be kept where no page ever shows it (and
        the sender told it went), for a session that may never exist."""
        parts = split_thread(thread_id)
        if parts is None:
            raise NotFoundError(
                f"{thread_id!r} is not a webchat thread id ('<session_id>.<conversation_id>')"
            )
        try:
            held = await self._sessions.holds(*parts)
        except StoreError as exc:
            raise TransientError(f"could not look up webchat thread {thread_id!r}: {exc}") from exc
        if not held:
            raise NotFoundError(
                f"no webchat session has the thread {thread_id!r} (no such session, or no such "
                "conversation in it): nothing was sent"
            )
        return parts

    async def delta(self, thread_id: str, stream_id: str, text: str) -> None:
        """Streaming: `text` is the next piece of the reply, appended by the page (not stored).

        Pieces that come faster than `DELTA_WINDOW` are merged into one frame: a model emitting
        a token at a time would otherwise cost every tab a frame per token.
        """
        if text and split_thread(thread_id) is not None:
            await self._streams.add(thread_id, stream_id, text)

    async def end(self, thread_id: str, stream_id: str) -> None:
        """Streaming: the turn that streamed `stream_id` is over. When its pieces went out
        and its final message did not (its reply had gone out already, from an earlier run
        of the turn or another node; its send failed; the turn was cut off), the pages are
        told to drop them (`stream_end`): else that half reply stays until the next one."""
        if not await self._streams.cut(stream_id):
            return
        parts = split_thread(thread_id)
        if parts is not None:
            frame = {"type": "stream_end", "thread_id": thread_id, "stream_id": stream_id}
            await self._publish(parts[0], frame)

    async def _publish_delta(self, thread_id: str, stream_id: str, text: str) -> None:
        parts = split_thread(thread_id)
        if parts is not None:
            frame = {"type": "delta", "thread_id": thread_id, "stream_id": stream_id, "text": text}
            await self._publish(parts[0], frame)

    async def typing(self, thread_id: str) -> None:
        parts = split_thread(thread_id)
        if parts is not None:
            await self._publish(parts[0], {"type": "typing", "thread_id": thread_id})

    async def not_answered(self, thread_id: str, message_id: str) -> Sequence[str]:
        """Notices: a note after the user's message `message_id` that it will not be answered
        (a hook dropped it)."""
        return await self._note(thread_id, message_id, NOT_ANSWERED, NOT_ANSWERED_TEXT)

    async def forwarded(self, thread_id: str, message_id: str) -> Sequence[str]:
        """Notices: a note after the user's message `message_id` that a hook passed it on to
        another connection (never which), instead of having it answered here."""
        return await self._note(thread_id, message_id, FORWARDED, FORWARDED_TEXT)

    async def _note(self, thread_id: str, message_id: str, code: str, text: str) -> Sequence[str]:
        """A note about `message_id`, stored in the thread so a reload and every tab show it.
        Kept once per message and code: the same message handled again (after a restart)
        records and sends nothing."""
        parts = await self._existing_thread(thread_id)
        note_id = f"{message_id}:{code}"
        try:
            _, entry = await self.context.store.append_history_once(
                CONNECTION_ID,
                note_id,
                _thread_key(thread_id),
                "system",
                NOTE_SENDER,
                text,
                data={"code": code, "reply_to": message_id},
            )
        except StoreError as exc:
            raise TransientError(f"the note could not be kept: {exc}") from exc
        if entry is not None:
            await self._publish(parts[0], message_frame(thread_id, entry))
        return (note_id,)

    async def fetch(
        self, thread_id: str, *, limit: int = 50, before: str | None = None
    ) -> Sequence[NormalizedMessage]:
        """History feature: the thread's messages, oldest first; `before` is a user message id."""
        key = _thread_key(thread_id)
        store = self.context.store
        if before is None:
            entries = await store.history(key, limit=limit)
        else:
            first = await store.history_seq(CONNECTION_ID, before)
            if first is None:
                raise NotFoundError(f"no webchat message {before!r} to fetch history before")
            entries = await store.history(key, limit=limit, before_seq=first)
        session = thread_id.partition(".")[0]
        return [self._as_normalized(e, thread_id, session) for e in entries]

    def _as_normalized(
        self, entry: HistoryEntry, thread_id: str, session: str
    ) -> NormalizedMessage:
        if entry.role == "user":
            return self._inbound(entry, thread_id, session)
        return NormalizedMessage(
            id=entry.message_id,
            connection_id=CONNECTION_ID,
            channel="webchat",
            channel_user_id=entry.sender,
            display_name=entry.sender,
            thread_id=thread_id,
            timestamp=entry.created_at,
            text=entry.text,
        )

    def socket_count(self) -> int:
        """Open authenticated sockets on this process (for health and tests)."""
        return sum(len(s) for s in self._sockets.values())

    async def close_sockets(self, code: int = 1012, reason: str = "service restart") -> None:
        """Close every chat socket (pages reconnect and resume); the server keeps listening."""
        sockets = [ws for group in self._sockets.values() for ws in group]
        await asyncio.gather(*(ws.close(code, reason) for ws in sockets))


class _FrameTokenMask(logging.Filter):
    """websockets logs each frame at debug cut to its first 46 and last 24 characters: an auth
    frame with the token last (`{"type":"auth","session_id":…,"token":…}`) showed the end of
    the token without its key, so no pattern could mask it. The token goes before the cut."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == "< %s" and isinstance(record.args, tuple):
            record.args = tuple(
                _token_masked(a) if isinstance(a, Frame) else a for a in record.args
            )
        return True


def _token_masked(frame: Frame) -> Frame:
    """A frame a client sent, as it may be logged: a token in it replaced by `***`."""
    if frame.opcode is Opcode.CONT or (frame.opcode is Opcode.TEXT and not frame.fin):
        return dataclasses.replace(frame, data=b"(part of a fragmented frame; not shown)")
    if frame.opcode is not Opcode.TEXT:
        return frame
    try:
        raw = json.loads(bytes(frame.data))
    except (ValueError, RecursionError):
        return frame
    if not isinstance(raw, dict) or "token" not in raw:
        return frame
    masked = json.dumps({**raw, "token": "***"}).encode()  # ASCII: a lone surrogate too
    return dataclasses.replace(frame, data=masked)


def _listen_error(host: str, port: int, exc: OSError) -> str:
    where = f"{host}:{port}"
    if exc.errno == errno.EADDRINUSE:
        return (
            f"webchat cannot listen on {where}: the port is in use (another talkbridge?);"
            " choose another with --port or webchat.port"
        )
    return f"webchat cannot listen on {where}: {exc.strerror}"


def _with_attachments(message: OutboundMessage) -> str:
    """The text, then a line naming each attachment: the page shows no files, and a file
    forwarded or sent with a caption must not vanish without a word."""
    names = [f"[attachment: {a.name or a.kind}]" for a in message.attachments]
    return "\n\n".join(part for part in (message.text, "\n".join(names)) if part)


def _thread_key(thread_id: str) -> str:
    return f"{CONNECTION_ID}\x1f{thread_id}"


async def _refuse(
    ws: ServerConnection,
    code: ErrorCode,
    message: str,
    ref: str | None = None,
    close_code: int = CLOSE_UNAUTHORIZED,
) -> None:
    await ws.send(dumps(reply_frame(error_frame(code, message), ref)))
    await ws.close(close_code, code)


async def _close_expired(ws: ServerConnection) -> None:
    with suppress(ConnectionClosed):  # it closed by itself meanwhile
        await _refuse(ws, "unauthorized", "the access token has expired; sign in again")


__all__ = ["CONNECTION_ID", "WebchatConnector"]


def _store_down(exc: BaseException) -> bool:
    """A store that does not answer is said in one line; anything else gets its traceback."""
    return isinstance(exc, StoreError)
