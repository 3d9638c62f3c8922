"""The webchat wire protocol as pure functions: parse client frames, build server frames.

No I/O here, so every rule of `docs/webchat-protocol.md` can be tested by feeding strings in and
looking at what comes out. The connector only moves frames between sockets and these functions.
"""

from __future__ import annotations

import json
import re
from contextlib import suppress
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    StringConstraints,
    TypeAdapter,
    ValidationError,
    model_validator,
)

from talkbridge.config import error_reason
from talkbridge.store.base import HistoryEntry

PROTOCOL_VERSION = 1

ErrorCode = Literal[
    "bad_frame",
    "too_large",
    "unauthorized",
    "forbidden",
    "not_found",
    "rate_limited",
    "internal",
    "empty_message",
    "too_many_sessions",
]

CLOSE_UNAUTHORIZED = 4401
"""Close code: no auth frame first, or a token that is missing or wrong."""
CLOSE_FORBIDDEN = 4403
"""Close code: the session id presented belongs to another token."""
CLOSE_TOO_MANY_SESSIONS = 4429
"""Close code: a new session was needed, and the token has all it may have."""
EMPTY_MESSAGE = (
    "the message is only spaces or invisible characters (such as zero-width spaces): "
    "there is nothing to show"
)

NOT_ANSWERED = "not_answered"
"""The `code` of the note (a `system` message) after a user's message that no one will answer:
a channel-message hook dropped it. Stable: clients match on it, not on the text."""
NOT_ANSWERED_TEXT = "Not answered"
FORWARDED = "forwarded"
"""The `code` of the note after a user's message that a channel-message hook passed on to
another connection (`Forward`) instead of having it answered here. Never names where it went."""
FORWARDED_TEXT = "Passed on"
NOTE_SENDER = "talkbridge"
"""Who a note is from, in the store's history (and in the `history` feature's messages)."""

REF_MAX = 64
CLIENT_ID_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
THREAD_ID_MAX = 200
_CLIENT_ID = re.compile(CLIENT_ID_PATTERN[1:-1])
_THREAD_ID = re.compile(r"[0-9a-f]{32}\.[0-9a-f]{12}")
"""A webchat thread id's shape (`<session_id>.<conversation_id>`, as `ready` gives them)."""
_Ref = Annotated[str, StringConstraints(max_length=REF_MAX)]
ClientId = Annotated[str, StringConstraints(pattern=CLIENT_ID_PATTERN)]
ThreadId = Annotated[str, StringConstraints(min_length=3, max_length=THREAD_ID_MAX)]
Count = Annotated[int, Strict(), Field(ge=0, le=2**63 - 1)]
"""A seq or a limit: a JSON integer (not "1", true or 1.0) that fits the store's integers."""


class _ClientFrame(BaseModel):
    # Unknown fields are ignored so a newer page can talk to an older server.
    model_config = ConfigDict(frozen=True, extra="ignore")

    ref: _Ref | None = None
    """Opaque; echoed on the reply (and on an error) so the client can match them."""


MAX_TOKEN_CHARS = 16 * 1024
"""An identity provider's JWT with a few profile claims is over 1,000 characters, and some run
to several thousand (group lists): a tight cap refused valid tokens. The frame limit still
bounds it."""


class AuthFrame(_ClientFrame):
    type: Literal["auth"]
    token: str | None = Field(default=None, min_length=1, max_length=MAX_TOKEN_CHARS)
    """None: the token of the cookie the link left (sent with the page's socket)."""
    session_id: str | None = Field(default=None, max_length=128)


class SendFrame(_ClientFrame):
    type: Literal["send"]
    thread_id: ThreadId
    client_id: ClientId
    text: str
    """Not blank: `parse_frame` refuses one that shows nothing (`empty_message`)."""


class HistoryFrame(_ClientFrame):
    type: Literal["history"]
    thread_id: ThreadId
    after_seq: Count = 0
    before_seq: Annotated[Count, Field(ge=1)] | None = None
    """The latest entries older than this seq: paging back from the oldest one shown."""
    limit: Annotated[Count, Field(ge=1)] | None = None

    @model_validator(mode="after")
    def _one_direction(self) -> HistoryFrame:
        if "after_seq" in self.model_fields_set and self.before_seq is not None:
            raise ValueError("give after_seq or before_seq, not both")
        return self


class NewConversationFrame(_ClientFrame):
    type: Literal["new_conversation"]
    title: str | None = Field(default=None, max_length=200)


class PingFrame(_ClientFrame):
    type: Literal["ping"]


ClientFrame = Annotated[
    AuthFrame | SendFrame | HistoryFrame | NewConversationFrame | PingFrame,
    Field(discriminator="type"),
]
CLIENT_FRAME_TYPES = ("auth", "send", "history", "new_conversation", "ping")
_adapter: TypeAdapter[ClientFrame] = TypeAdapter(ClientFrame)


class FrameError(Exception):
    """A frame the server cannot use; `code` and the message go back in an error frame."""

    def __init__(self, code: ErrorCode, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.code: ErrorCode = code
        self.fields = {k: v for k, v in fields.items() if v is not None}

    def frame(self) -> dict[str, Any]:
        return error_frame(self.code, str(self), **self.fields)


def frame_size(data: str | bytes) -> int:
    """Size in bytes as sent; cheap for the common small ASCII frame."""
    if isinstance(data, bytes):
        return len(data)
    return len(data.encode("utf-8", "surrogatepass"))


def parse_frame(data: str | bytes, max_bytes: int) -> ClientFrame:
    """Turn one websocket message into a typed client frame, or raise `FrameError`."""
    if frame_size(data) > max_bytes:
        ids: dict[str, str] = {}
        if isinstance(data, str):  # which message was too long, for the client's outbox
            with suppress(ValueError, RecursionError):
                ids = frame_ids(json.loads(data))
        raise FrameError(
            "too_large",
            f"frame is {frame_size(data)} bytes; the limit is {max_bytes} bytes",
            **ids,
        )
    if isinstance(data, bytes):
        raise FrameError("bad_frame", "frames must be JSON text, not binary")
    try:
        raw = json.loads(data)
        lone_surrogate = ("\\ud" in data or "\\uD" in data) and not _encodable(raw)
    except json.JSONDecodeError as exc:
        raise FrameError("bad_frame", f"frame is not valid JSON: {exc.msg}") from None
    except RecursionError:  # `[[[…]]]` a thousand deep: valid JSON, yet no frame is that deep
        raise FrameError("bad_frame", "frame is nested too deeply to be a frame") from None
    if not isinstance(raw, dict):
        raise FrameError("bad_frame", "a frame must be a JSON object with a 'type'")
    ids = frame_ids(raw)
    if lone_surrogate:
        raise FrameError(
            "bad_frame",
            "the frame holds a lone UTF-16 surrogate (a \\ud800-\\udfff escape without its "
            "pair), which is not text",
            **ids,
        )
    kind = raw.get("type")
    if kind not in CLIENT_FRAME_TYPES:
        known = ", ".join(CLIENT_FRAME_TYPES)
        if kind is None:
            problem = "the frame has no 'type'"
        elif not isinstance(kind, str):
            problem = "'type' must be a string"
        else:
            problem = f"unknown frame type {kind[:40]!r}"
        raise FrameError("bad_frame", f"{problem}; known types: {known}", **ids)
    try:
        frame = _adapter.validate_python(raw)
    except ValidationError as exc:
        raise FrameError("bad_frame", _describe(kind, exc), **ids) from None
    # A code of its own, in words for the person who typed it: the page shows the message as
    # the reason the text was not sent (it read `bad send frame: text: …`).
    if isinstance(frame, SendFrame) and not visible(frame.text):
        raise FrameError("empty_message", EMPTY_MESSAGE, **ids)
    return frame


def visible(text: str) -> bool:
    """Whether `text` shows anything: not only spaces, zero-width or other format characters."""
    return any(ch.isprintable() and not ch.isspace() for ch in text)


def frame_ids(raw: object) -> dict[str, str]:
    """`ref`, `client_id` and `thread_id` of a frame the server refuses, where they are
    well-formed: copied onto the error so the client knows which frame it was about."""
    if not isinstance(raw, dict):
        return {}
    ids: dict[str, str] = {}
    ref, client_id, thread_id = raw.get("ref"), raw.get("client_id"), raw.get("thread_id")
    if isinstance(ref, str) and len(ref) <= REF_MAX and _encodable(ref):
        ids["ref"] = ref
    if isinstance(client_id, str) and _CLIENT_ID.fullmatch(client_id):
        ids["client_id"] = client_id
    if isinstance(thread_id, str) and _THREAD_ID.fullmatch(thread_id):
        ids["thread_id"] = thread_id
    return ids


def _encodable(value: object) -> bool:
    """Whether every string in `value` can be sent as UTF-8 (JSON's `\\ud800` escape makes a
    string that cannot: echoing it would fail the socket's write)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return False
        return True
    if isinstance(value, dict):
        return all(_encodable(k) and _encodable(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_encodable(v) for v in value)
    return True


def _describe(kind: str, exc: ValidationError) -> str:
    parts = []
    for err in exc.errors(include_url=False, include_input=False):
        loc = ".".join(str(p) for p in err["loc"][1:])  # drop the union tag
        parts.append(f"{loc or kind}: {error_reason(err)}")
    return f"bad {kind} frame: " + "; ".join(parts)


# ---- server frames ---------------------------------------------------------------------------


def reply_frame(frame: dict[str, Any], ref: str | None) -> dict[str, Any]:
    """`frame` as the answer to a client frame: with its `ref` when it gave one, and without
    the key when it gave none (a client tells its requests apart by the key, so no null)."""
    return frame if ref is None else {**frame, "ref": ref}


def error_frame(code: ErrorCode, message: str, **fields: Any) -> dict[str, Any]:
    return {"type": "error", "code": code, "message": message, **fields}


def message_frame(thread_id: str, entry: HistoryEntry) -> dict[str, Any]:
    """One stored message of a thread, as every socket of its session sees it."""
    frame: dict[str, Any] = {
        "type": "message",
        "thread_id": thread_id,
        "seq": entry.seq,
        "id": entry.message_id,
        "role": entry.role,
        "text": entry.text,
        "ts": _iso(entry.created_at),
    }
    for key in ("client_id", "stream_id", "markup", "code", "reply_to"):
        if key in entry.data:
            frame[key] = entry.data[key]
    return frame


def _iso(value: datetime) -> str:
    return value.isoformat().replace("+00:00", "Z")


def dumps(frame: dict[str, Any]) -> str:
    return json.dumps(frame, ensure_ascii=False, separators=(",", ":"), default=str)
