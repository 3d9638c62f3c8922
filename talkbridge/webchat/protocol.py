"""The webchat wire protocol as pure functions: parse client frames, build server frames.

No I/O here, so every rule of `docs/webchat-protocol.md` can be tested by feeding strings in and
looking at what comes out. The connector only moves frames between sockets and these functions.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, TypeAdapter, ValidationError

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
]

CLOSE_UNAUTHORIZED = 4401
"""Close code: no auth frame first, or a token that is missing or wrong."""
CLOSE_FORBIDDEN = 4403
"""Close code: the session id presented belongs to another token."""

_Ref = Annotated[str, StringConstraints(max_length=64)]
ClientId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
ThreadId = Annotated[str, StringConstraints(min_length=3, max_length=200)]


class _ClientFrame(BaseModel):
    # Unknown fields are ignored so a newer page can talk to an older server.
    model_config = ConfigDict(frozen=True, extra="ignore")

    ref: _Ref | None = None
    """Opaque; echoed on the reply (and on an error) so the client can match them."""


class AuthFrame(_ClientFrame):
    type: Literal["auth"]
    token: str = Field(min_length=1, max_length=512)
    session_id: str | None = Field(default=None, max_length=128)


class SendFrame(_ClientFrame):
    type: Literal["send"]
    thread_id: ThreadId
    client_id: ClientId
    text: str = Field(min_length=1)


class HistoryFrame(_ClientFrame):
    type: Literal["history"]
    thread_id: ThreadId
    after_seq: int = Field(default=0, ge=0)
    limit: int | None = Field(default=None, ge=1)


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
        raise FrameError(
            "too_large", f"frame is {frame_size(data)} bytes; the limit is {max_bytes} bytes"
        )
    if isinstance(data, bytes):
        raise FrameError("bad_frame", "frames must be JSON text, not binary")
    try:
        raw = json.loads(data)
    except json.JSONDecodeError as exc:
        raise FrameError("bad_frame", f"frame is not valid JSON: {exc.msg}") from None
    if not isinstance(raw, dict):
        raise FrameError("bad_frame", "a frame must be a JSON object with a 'type'")
    ref = raw.get("ref") if isinstance(raw.get("ref"), str) else None
    kind = raw.get("type")
    if kind not in CLIENT_FRAME_TYPES:
        known = ", ".join(CLIENT_FRAME_TYPES)
        shown = kind if isinstance(kind, str) and len(kind) <= 40 else "(missing)"
        raise FrameError("bad_frame", f"unknown frame type {shown!r}; known: {known}", ref=ref)
    try:
        return _adapter.validate_python(raw)
    except ValidationError as exc:
        raise FrameError("bad_frame", _describe(kind, exc), ref=ref) from None


def _describe(kind: str, exc: ValidationError) -> str:
    parts = []
    for err in exc.errors(include_url=False, include_input=False):
        loc = ".".join(str(p) for p in err["loc"][1:])  # drop the union tag
        parts.append(f"{loc or kind}: {err['msg']}")
    return f"bad {kind} frame: " + "; ".join(parts)


# ---- server frames ---------------------------------------------------------------------------


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
    for key in ("client_id", "stream_id", "markup"):
        if key in entry.data:
            frame[key] = entry.data[key]
    return frame


def _iso(value: datetime) -> str:
    return value.isoformat().replace("+00:00", "Z")


def dumps(frame: dict[str, Any]) -> str:
    return json.dumps(frame, ensure_ascii=False, separators=(",", ":"), default=str)
