"""Keys of an email connection; validated without importing aioimaplib or aiosmtplib."""

from __future__ import annotations

import math
from email.headerregistry import Address
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from talkbridge.config import ConnectionConfig
from talkbridge.connectors.email.safety import is_own  # pure: no SDK, unlike the codec

Security = Literal["ssl", "starttls", "none"]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ImapConfig(_Section):
    host: str = Field(min_length=1)
    port: int | None = Field(default=None, ge=1, le=65535)
    """Default: 993 for `ssl`, 143 otherwise."""
    security: Security = "ssl"
    """`ssl`: TLS from the first byte; `starttls`: upgrade a plain connection; `none`: plain."""
    username: str = Field(min_length=1)
    password: SecretStr
    """Also as `{file: /path}` (a password file) or `${ENV_VAR}`."""
    folder: str = Field(default="INBOX", min_length=1)
    sent_folder: str | Literal[False] = "auto"
    """Where each reply is saved once sent (IMAP APPEND, marked read), so that people using the
    mailbox in a mail client see both sides: `auto`, the folder the server marks `\\Sent`
    (RFC 6154), if any; a folder's name (created when missing); `false`, not saved."""

    @field_validator("sent_folder", mode="before")
    @classmethod
    def _no_sent_folder(cls, value: Any) -> Any:
        """One line for whatever is no folder (`true`, a number): not one per union member."""
        if value is None or value is False:
            return False
        if not isinstance(value, str) or not value.strip():
            raise ValueError(
                "names the folder replies are saved to: auto, a folder's name, or false"
            )
        return value

    @property
    def effective_port(self) -> int:
        return self.port or (993 if self.security == "ssl" else 143)


class SmtpConfig(_Section):
    host: str = Field(min_length=1)
    port: int | None = Field(default=None, ge=1, le=65535)
    """Default: 465 for `ssl`, 587 for `starttls`, 25 for `none`."""
    security: Security = "starttls"
    username: str | None = None
    """Omitted: send without logging in (a local relay)."""
    password: SecretStr | None = None

    @property
    def effective_port(self) -> int:
        return self.port or {"ssl": 465, "starttls": 587, "none": 25}[self.security]

    @model_validator(mode="after")
    def _login_is_complete(self) -> SmtpConfig:
        if (self.username is None) != (self.password is None):
            raise ValueError("username and password go together (give both, or neither)")
        return self


class EmailConfig(ConnectionConfig):
    """One mailbox. A mail is trusted when every address it is from and every address a reply
    goes to (Reply-To or From, and the others on To and Cc) is trusted: a trusted From with a
    stranger's Reply-To or Cc would send the default agent's answer to that stranger."""

    channel: Literal["email"] = "email"
    address: str
    """The mailbox's own address: the From of every reply and the domain of our Message-IDs."""
    imap: ImapConfig
    smtp: SmtpConfig
    answer_contact_forms: bool = False
    """Answer mail From the mailbox's own address with a Reply-To elsewhere (what many web
    contact forms send), as mail from that Reply-To; skipped as our own mail otherwise. Our
    replies are never answered (our Message-ID, `Auto-Submitted`), and the reply limits hold."""
    authenticated_by: str | None = None
    """The authserv-id your receiving mail server writes into `Authentication-Results`
    (`mx.example.com`). Set, a sender is trusted (by `trusted` or a pairing) only when the
    topmost such header of that id says DMARC passed, or DKIM passed for the From domain:
    anyone can write any From. Unset, From is taken as it is written."""
    idle_renew: float = Field(default=5 * 60, gt=0)
    """Seconds before IDLE is re-issued (servers may drop an IDLE after 30 minutes). Also how
    soon a connection that died silently (a NAT dropping it) is noticed: the server must answer
    the renewal within `timeout`."""
    poll_interval: float = Field(default=60.0, gt=0)
    """Seconds between checks when the server has no IDLE."""
    max_replies_per_thread: int = Field(default=10, ge=1)
    max_replies_per_address: int = Field(default=20, ge=1)
    """Replies to one address (the one answered: Reply-To or From) across all its threads: a
    responder that answers each reply with a new mail starts a new thread every time."""
    reply_window: float = Field(default=3600.0, gt=0)
    """At most `max_replies_per_thread` replies per thread, and `max_replies_per_address` to
    one address, in this many seconds (stops loops)."""
    timeout: float = Field(default=30.0, gt=0)
    """Seconds one IMAP command or SMTP exchange may take."""
    backlog_days: float | Literal["all"] = 1
    """How far back the first start of a connection (no cursor yet, or the folder's UIDVALIDITY
    changed) answers unread mail, in days before the start by the server's receipt time. Older
    unread mail stays unread for a person and is never answered. `0`: only mail arriving after
    the start; `all`: every unread mail, however old. One day answers what came in just before
    a bridge was set up without answering a mailbox's years of unread mail."""

    @field_validator("backlog_days", mode="before")
    @classmethod
    def _days_or_all(cls, value: Any) -> float | str:
        if isinstance(value, str) and value.strip().lower() == "all":
            return "all"
        if not isinstance(value, bool):  # YAML's `true` would pass as 1
            try:
                days = float(value)
            except (TypeError, ValueError):
                pass
            else:
                if math.isfinite(days) and days >= 0:
                    return days
        raise ValueError("must be a number of days (0 or more), or all")

    @field_validator("authenticated_by")
    @classmethod
    def _authserv_id(cls, value: str | None) -> str | None:
        if value is None:
            return None
        name = value.strip().lower().rstrip(".")
        if not name or any(c.isspace() or c in ';()"' for c in name):
            raise ValueError(
                "must be the authserv-id your receiving server writes first in its "
                "Authentication-Results header (a host name such as mx.example.com)"
            )
        return name

    @field_validator("address")
    @classmethod
    def _one_address(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("is empty (expected local-part@domain.tld)")
        try:
            parsed = Address(addr_spec=value.strip())
        except (ValueError, IndexError) as exc:
            raise ValueError(f"not an email address ({exc})") from None
        if not parsed.username or not parsed.domain or "." not in parsed.domain.strip("."):
            raise ValueError("not an email address (expected local-part@domain.tld)")
        return parsed.addr_spec.lower()

    @field_validator("trusted")
    @classmethod
    def _address_patterns(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        """Sender ids are lower-cased addresses, so patterns must be too (`*@Example.com`).

        `@example.com` is the usual way to write a whole domain, so it means `*@example.com`;
        an entry with no `@` and no wildcard (`example.com`, `alice`) could never match an
        address, and is refused rather than trusting nobody in silence.
        """
        patterns = []
        for entry in value:
            pattern = entry.strip().lower()
            if pattern.startswith("@"):
                pattern = "*" + pattern
            elif "@" not in pattern and not any(c in pattern for c in "*?["):
                raise ValueError(
                    f"trusted holds addresses or patterns: {entry!r} would never match "
                    f"(an address is name@domain; a whole domain is *@{pattern or 'example.com'})"
                )
            patterns.append(pattern)
        return tuple(patterns)

    def trusts_sender(self, message: Any) -> bool:
        return self.trusts(message.channel_user_id.lower())

    def others_answered(self, message: Any) -> tuple[str, ...]:
        """Every address a reply-all reaches, in lower case, but the mailbox's own (plus-tagged
        too). Another mailbox at its domain is no exception: at a public provider
        (help@gmail.com) that is anyone; colleagues are trusted by a pattern (`*@acme.com`)."""
        answered = (a.lower() for a in message.also_answered)
        return tuple(a for a in answered if not is_own(a, self.address))
