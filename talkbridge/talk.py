"""The provider-neutral messaging contract of one connection, and its optional features."""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, Literal, Protocol, TypeAlias, overload, runtime_checkable

from talkbridge.message import Attachment, NormalizedMessage, OutboundMessage, SendResult

MessageHandler = Callable[[NormalizedMessage], Awaitable[None]]

FeatureName = Literal[
    "history",
    "inbound_media",
    "activity",
    "directory",
    "interactions",
    "edit",
    "delete",
    "reactions",
    "streaming",
    "notices",
]
FEATURE_NAMES: tuple[str, ...] = FeatureName.__args__  # type: ignore[attr-defined]

KEYLESS_SEND: ContextVar[str | None] = ContextVar("talkbridge_keyless_send", default=None)
"""Set by the router around the tries of one `send` without an idempotency key, so a
connector's retry of it resumes where the failed try stopped (in this process only: a restart
retries no such send, so it is not stored)."""


class Subscription:
    """Handle returned by `subscribe`; `close()` or leaving a `with` block unsubscribes."""

    __slots__ = ("_closed", "_on_close")

    def __init__(self, on_close: Callable[[], None]) -> None:
        self._on_close = on_close
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._on_close()

    def __enter__(self) -> Subscription:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


# ---- features -------------------------------------------------------------------------------


@runtime_checkable
class History(Protocol):
    async def fetch(
        self, thread_id: str, *, limit: int = 50, before: str | None = None
    ) -> Sequence[NormalizedMessage]:
        """Earlier messages of a thread, oldest first; `before` is a native message id."""
        ...


@runtime_checkable
class InboundMedia(Protocol):
    async def download(self, attachment: Attachment, *, max_bytes: int | None = None) -> bytes: ...


@runtime_checkable
class Activity(Protocol):
    async def typing(self, thread_id: str) -> None:
        """Show that a reply is being prepared; connectors refresh it as the platform needs."""
        ...


@dataclass(frozen=True, slots=True)
class DirectoryEntry:
    id: str
    name: str
    kind: Literal["user", "thread"]
    extra: dict[str, Any] | None = None


@runtime_checkable
class Directory(Protocol):
    async def user(self, user_id: str) -> DirectoryEntry | None: ...
    async def thread(self, thread_id: str) -> DirectoryEntry | None: ...


@runtime_checkable
class Interactions(Protocol):
    async def send_buttons(
        self, thread_id: str, text: str, buttons: Sequence[tuple[str, str]]
    ) -> SendResult:
        """Send `(label, value)` buttons; a click arrives as a message whose text is `value`."""
        ...


class Keep(enum.Enum):
    """The type of `KEEP`."""

    KEEP = "keep"


KEEP: Final = Keep.KEEP
"""`Edit.edit(..., buttons=KEEP)`, the default: the message keeps the buttons it has."""

EditButtons: TypeAlias = Sequence[tuple[str, str]] | Literal[Keep.KEEP]
"""What `Edit.edit` does with a message's buttons: keeps them (`KEEP`) or puts these on."""


@runtime_checkable
class Edit(Protocol):
    async def edit(
        self, thread_id: str, message_id: str, text: str, *, buttons: EditButtons = KEEP
    ) -> None:
        """Replace a sent message's text. Its buttons stay unless `buttons` replaces them with
        other `(label, value)` pairs, or `()` takes them off (an answered question's, say);
        only a connection with the `interactions` feature takes buttons."""
        ...


@runtime_checkable
class Delete(Protocol):
    async def delete(self, thread_id: str, message_id: str) -> None: ...


@runtime_checkable
class Reactions(Protocol):
    async def react(self, thread_id: str, message_id: str, emoji: str) -> None: ...


@runtime_checkable
class Streaming(Protocol):
    """Show an agent's reply while it is produced (webchat); the final text still goes to `send`
    (with `meta["stream_id"]`), and `end` follows the turn: a stream whose final message did
    not go out from it (sent before, failed, or the turn was cut off) must not stay shown."""

    async def delta(self, thread_id: str, stream_id: str, text: str) -> None: ...
    async def end(self, thread_id: str, stream_id: str) -> None: ...


@runtime_checkable
class Notices(Protocol):
    """Tell the sender, where they wait in view for an answer (webchat), what became of a
    message of theirs that no agent answers here: `not_answered`, a channel-message hook
    dropped it (or blocked it, failing closed; or its forward failed); `forwarded`, a hook passed
    it on to another connection. Never why, nor where to: the hook's reason and the target are
    for the operator's log. Each returns the ids of what it recorded in the thread (kept once
    per message: asking again records nothing new)."""

    async def not_answered(self, thread_id: str, message_id: str) -> Sequence[str]: ...
    async def forwarded(self, thread_id: str, message_id: str) -> Sequence[str]: ...


Feature = (
    History
    | InboundMedia
    | Activity
    | Directory
    | Interactions
    | Edit
    | Delete
    | Reactions
    | Streaming
    | Notices
)


class FeatureSource(Protocol):
    """The typed `feature(name)` lookup shared by `Talk`, connectors and the router."""

    @overload
    def feature(self, name: Literal["history"]) -> History | None: ...
    @overload
    def feature(self, name: Literal["inbound_media"]) -> InboundMedia | None: ...
    @overload
    def feature(self, name: Literal["activity"]) -> Activity | None: ...
    @overload
    def feature(self, name: Literal["directory"]) -> Directory | None: ...
    @overload
    def feature(self, name: Literal["interactions"]) -> Interactions | None: ...
    @overload
    def feature(self, name: Literal["edit"]) -> Edit | None: ...
    @overload
    def feature(self, name: Literal["delete"]) -> Delete | None: ...
    @overload
    def feature(self, name: Literal["reactions"]) -> Reactions | None: ...
    @overload
    def feature(self, name: Literal["streaming"]) -> Streaming | None: ...
    @overload
    def feature(self, name: Literal["notices"]) -> Notices | None: ...
    @overload
    def feature(self, name: str) -> Feature | None: ...
    def feature(self, name: str) -> Feature | None: ...


@runtime_checkable
class Talk(FeatureSource, Protocol):
    """What apps and hooks use to talk on one connection, without holding its transport."""

    connection_id: str
    channel: str

    def subscribe(self, handler: MessageHandler) -> Subscription: ...
    async def send(self, message: OutboundMessage) -> SendResult: ...
