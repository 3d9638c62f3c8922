"""The one message shape every channel is translated into and out of.

Connectors turn platform payloads into `NormalizedMessage` (inbound) and render `OutboundMessage`
back into the platform's form; nothing else in the core ever sees a platform payload.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    model_validator,
)

KNOWN_CHANNELS: tuple[str, ...] = (
    "telegram",
    "telegram_user",
    "whatsapp",
    "wechat",
    "webchat",
    "discord",
    "email",
    "feishu",
    "slack",
)


def _check_channel(value: str) -> str:
    # Extensible: third-party connectors add channels, so any lowercase identifier is accepted.
    if not value or not value.replace("_", "").isalnum() or value.lower() != value:
        raise ValueError(
            f"channel must be a lowercase identifier such as 'telegram', got {value!r}"
        )
    return value


Channel = Annotated[str, AfterValidator(_check_channel)]
"""A channel name: one of `KNOWN_CHANNELS`, or a lowercase identifier a plug-in connector adds."""

ThreadType = Literal["private", "group"]
Markup = Literal["plain", "markdown"]
AttachmentKind = Literal[
    "image", "video", "audio", "voice", "document", "sticker", "location", "contact", "other"
]
Trust = Literal["trusted", "untrusted"]


_set = object.__setattr__


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """pydantic's shallow copy without its generic steps (no extra fields or private
        attributes here to copy): every hook that modifies a message and every routed message
        pays for one. Like pydantic's, `update` is not validated."""
        if deep:
            return super().model_copy(update=update, deep=True)
        cls = type(self)
        copied = cls.__new__(cls)
        fields = self.__dict__.copy()
        fields_set = self.__pydantic_fields_set__.copy()
        if update:
            fields.update(update)
            fields_set.update(update)
        _set(copied, "__dict__", fields)
        _set(copied, "__pydantic_fields_set__", fields_set)
        _set(copied, "__pydantic_extra__", None)
        _set(copied, "__pydantic_private__", None)
        return copied


def _aware_utc(value: datetime) -> datetime:
    if value.tzinfo is None:
        raise ValueError("timestamp must be timezone-aware")
    return value.astimezone(UTC)


class Attachment(_Frozen):
    """A file or structured item; `ref` is what the `inbound_media` feature resolves."""

    kind: AttachmentKind
    name: str | None = None
    mime_type: str | None = None
    size: int | None = Field(default=None, ge=0)
    ref: str | None = None
    """Opaque, connector-defined reference (a file id, a URL, a part index)."""
    data: bytes | None = Field(default=None, exclude=True, repr=False)
    """Outbound only: the bytes to upload when there is no `ref`."""
    meta: dict[str, Any] = Field(default_factory=dict)
    """Kind-specific fields: coordinates of a location, phone number of a contact, …"""


class ReplyTo(_Frozen):
    message_id: str
    content: str | None = None
    sender_name: str | None = None


class MessageRouting(_Frozen):
    """What the channel-message hooks decided; absent on arrival."""

    agent: str | None = None
    trust: Trust = "untrusted"
    routed_by: str | None = None
    """Name of the hook that chose `agent`; None when the bundled default routing chose it."""
    forwarded_from: str | None = None
    """Connection id the message was forwarded from."""
    flags: tuple[str, ...] = ()
    sender_trusted: bool = False
    """The sender is trusted (by config or an approved pairing), whatever `trust` says of the
    message: an untrusted one of a trusted sender is one whose answer would reach others who
    are not (a stranger on an email's Cc). The sentinel gives such a sender no pairing code."""


class NormalizedMessage(_Frozen):
    id: str = Field(min_length=1)
    connection_id: str = Field(min_length=1)
    channel: Channel
    channel_user_id: str
    display_name: str = ""
    thread_id: str = Field(min_length=1)
    thread_name: str | None = None
    thread_type: ThreadType = "private"
    timestamp: Annotated[datetime, AfterValidator(_aware_utc)]
    text: str = ""
    attachments: tuple[Attachment, ...] = ()
    reply_to: ReplyTo | None = None
    routing: MessageRouting | None = None
    edit_of: str | None = None
    """Set when this event edits an earlier message: the native id of the original."""
    also_answered: tuple[str, ...] = ()
    """Who besides the sender a reply reaches (an email's Reply-To and reply-all Cc), all of
    whom must be trusted for the message to be. A field, not part of `raw_event`, so that it is
    kept when the message is stored: trust is decided again on another node and after a crash."""
    sender_roles: tuple[str, ...] = ()
    """Roles the sender holds where it wrote, as `<scope>/<role name>` (Discord: `<server
    id>/<role>`), for trust by role. Kept when stored, as `also_answered` is."""
    sender_verified: bool | None = None
    """Whether a proof of `channel_user_id` held. None where the platform itself vouches for
    its ids (all but email); False where the connection checks and the check failed (an email
    whose From its receiving server does not vouch for, with `authenticated_by` set), and
    then neither config nor a pairing trusts the sender. Kept when the message is stored."""
    raw_event: Any = Field(default=None, exclude=True, repr=False)

    @property
    def thread_key(self) -> str:
        """Globally unique conversation key: thread ids are only unique within a connection."""
        return thread_key(self.connection_id, self.thread_id)


class OutboundMessage(_Frozen):
    thread_id: str = Field(min_length=1)
    text: str = ""
    markup: Markup = "markdown"
    reply_to: str | None = None
    """Native id of the message this one answers."""
    attachments: tuple[Attachment, ...] = ()
    idempotency_key: str | None = None
    buttons: tuple[tuple[str, str], ...] = ()
    """Optional (label, value) pairs for connectors with the `interactions` feature."""
    meta: dict[str, Any] = Field(default_factory=dict)
    """Connector hints that do not fit the model (e.g. the webchat's turn id)."""

    @model_validator(mode="after")
    def _has_content(self) -> OutboundMessage:
        if not self.text and not self.attachments:
            raise ValueError("an outbound message needs text or at least one attachment")
        return self


class SendResult(_Frozen):
    """What a send produced: one id, or several when the platform forced a split."""

    message_ids: tuple[str, ...] = Field(min_length=1)

    @property
    def message_id(self) -> str:
        return self.message_ids[0]


def thread_key(connection_id: str, thread_id: str) -> str:
    """Conversation key unique across connections (thread ids are unique only within one)."""
    return f"{connection_id}\x1f{thread_id}"


def utcnow() -> datetime:
    return datetime.now(UTC)
