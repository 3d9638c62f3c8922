"""Loop safety: which mails a bridge must never answer, and the per-thread reply limit.

Auto-responders answering each other is how mail bridges melt down. We refuse to answer what
RFC 3834 and common practice mark as automatic (`Auto-Submitted`, `Precedence`, mailing lists,
bounces, Exchange's `X-Auto-Response-Suppress`), mail we sent ourselves, and, as a last line for
responders that mark nothing, more than N replies per thread in a time window.
"""

from __future__ import annotations

import hashlib
from collections import deque
from email.message import EmailMessage
from email.utils import getaddresses

_BOUNCE_SENDERS = {"mailer-daemon", "postmaster", "mail-daemon", "mailerdaemon"}
_BULK_PRECEDENCE = {"bulk", "list", "junk", "auto_reply"}
_LIST_HEADERS = ("List-Id", "List-Unsubscribe", "List-Post")
_SUPPRESS = {"all", "autoreply", "oof"}
_REPORT_PARTS = {
    "message/delivery-status",  # RFC 3464: a bounce or a delay warning
    "message/disposition-notification",  # RFC 8098: a read receipt
    "message/feedback-report",  # RFC 5965: an abuse report
}


def own_tag(address: str) -> str:
    """A short tag in our Message-IDs that says which mailbox sent them."""
    return hashlib.sha256(address.lower().encode()).hexdigest()[:10]


def is_own_message_id(message_id: str, address: str) -> bool:
    domain = address.rpartition("@")[2].lower()
    value = message_id.strip().lower()
    return value.endswith(f"@{domain}>") and f".tb{own_tag(address)}@" in value


def _header(msg: EmailMessage, name: str) -> str:
    try:
        return str(msg.get(name, "") or "").strip()
    except Exception:  # a header too broken to parse is judged by its raw value
        raw = msg.get_all(name, failobj=[]) if hasattr(msg, "get_all") else []
        return str(raw[0]) if raw else ""


def skip_reason(
    msg: EmailMessage, *, address: str, message_id: str, contact_forms: bool = False
) -> str | None:
    """Why this mail must not be answered, or None when it may be. With `contact_forms`,
    mail From our own address that asks for answers elsewhere (`contact_form_sender`) may be."""
    auto = _header(msg, "Auto-Submitted").split(";")[0].strip().lower()
    if auto and auto != "no":
        return f"Auto-Submitted: {auto}"
    precedence = _header(msg, "Precedence").lower()
    if precedence in _BULK_PRECEDENCE:
        return f"Precedence: {precedence}"
    for name in _LIST_HEADERS:
        if _header(msg, name):
            return f"mailing-list mail ({name})"
    if _header(msg, "X-Autoreply") or _header(msg, "X-Autorespond"):
        return "auto-reply (X-Autoreply)"
    suppress = {v.strip().lower() for v in _header(msg, "X-Auto-Response-Suppress").split(",")}
    if suppress & _SUPPRESS:
        return "the sender asked for no automatic replies (X-Auto-Response-Suppress)"
    if msg.get_content_type() == "multipart/report":
        return "delivery or read report (multipart/report)"
    report = _report_part(msg)
    if report is not None:  # a report sent as multipart/mixed by an older gateway
        return f"delivery or read report ({report})"
    return_path = _header(msg, "Return-Path")
    if return_path == "<>":
        return "bounce (empty Return-Path)"
    bouncer = [a for _, a in getaddresses([return_path]) if _is_bounce_sender(a)]
    if bouncer:  # the envelope sender of a bounce whose From looks like anyone's
        return f"bounce (Return-Path {bouncer[0]})"
    if _header(msg, "X-Failed-Recipients"):
        return "bounce (X-Failed-Recipients)"
    senders = [addr.lower() for _, addr in getaddresses([_header(msg, "From")]) if addr]
    for sender in senders:
        if _is_bounce_sender(sender):
            return f"mailer-daemon mail from {sender}"
        if sender == address.lower():
            form = contact_form_sender(msg, address)
            if form is None:
                return "mail from our own address"
            if not contact_forms:
                return (
                    f"mail from our own address with a Reply-To of {form} (a contact form? "
                    "answer_contact_forms answers such mail)"
                )
    if is_own_message_id(message_id, address):
        return "a message we sent (our own Message-ID)"
    return None


def contact_form_sender(msg: EmailMessage, address: str) -> str | None:
    """For mail From our own address (what many web forms send), the first Reply-To address
    that is not ours: whom the form says the mail is from. None when there is no such one."""
    own = address.lower()
    for _, addr in getaddresses([_header(msg, "Reply-To")]):
        if addr and "@" in addr and addr.lower() != own and not _is_bounce_sender(addr):
            return addr.lower()
    return None


def _is_bounce_sender(address: str) -> bool:
    return address.lower().partition("@")[0] in _BOUNCE_SENDERS


def _report_part(msg: EmailMessage) -> str | None:
    """The content type of a delivery, read or abuse report part anywhere in the mail."""
    try:
        for part in msg.walk():
            if part.get_content_type() in _REPORT_PARTS:
                return part.get_content_type()
    except Exception:  # a structure too broken to walk: judged by its headers alone
        return None
    return None


SWEEP_FROM = 1024


class ReplyLimiter:
    """At most `limit` replies per thread within `window` seconds (the clock is passed in)."""

    def __init__(self, limit: int, window: float) -> None:
        self.limit = limit
        self.window = window
        self._sent: dict[str, deque[float]] = {}
        self._sweep_at = SWEEP_FROM
        """Threads tracked at which those whose window is over are forgotten (a bridge answers
        many threads once; without this, each would stay here for good)."""

    def allowed(self, thread_id: str, now: float) -> bool:
        times = self._sent.get(thread_id)
        if times is None:
            return True
        while times and now - times[0] >= self.window:
            times.popleft()
        if not times:
            del self._sent[thread_id]
            return True
        return len(times) < self.limit

    def record(self, thread_id: str, now: float) -> None:
        self._sent.setdefault(thread_id, deque()).append(now)
        if len(self._sent) >= self._sweep_at:
            for done in [t for t, times in self._sent.items() if now - times[-1] >= self.window]:
                del self._sent[done]
            self._sweep_at = max(SWEEP_FROM, 2 * len(self._sent))  # amortized: O(1) a reply

    @property
    def threads(self) -> int:
        """Threads whose replies are still counted."""
        return len(self._sent)
