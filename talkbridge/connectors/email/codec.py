"""RFC 5322 bytes <-> talkbridge messages. Pure: no I/O, no await.

Inbound: `decode_mail(raw, ...)` gives a `NormalizedMessage` (or None for mail we must not
answer; see `safety`). Its id is the Message-ID; its thread is the root Message-ID of the
References / In-Reply-To chain, so a conversation stays one thread across replies (the
transport lets only the thread's participants join it: `threads`). `text` is
the new part of the mail (plain preferred, HTML converted, quotes and signature trimmed); the
full text, the HTML and the raw bytes stay in `raw_event` for hooks.

Outbound: `render_reply(...)` builds the reply: In-Reply-To and References, `Re:` once, our own
Message-ID, `Auto-Submitted: auto-replied`, multipart/alternative (plain + Markdown as HTML),
attachments.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import re
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from email import message_from_bytes, policy
from email.headerregistry import Address
from email.message import EmailMessage, Message
from email.utils import format_datetime, getaddresses, parsedate_to_datetime
from typing import TYPE_CHECKING, Any

from talkbridge.connectors import markdown
from talkbridge.connectors.email.authresults import Proof, vouched
from talkbridge.connectors.email.safety import (
    REPLY_PREFIX,
    contact_form_sender,
    is_own,
    own_tag,
    skip_reason,
)
from talkbridge.connectors.email.text import html_to_text, trim_reply, unflow
from talkbridge.message import Attachment, AttachmentKind, NormalizedMessage, ReplyTo

if TYPE_CHECKING:
    from talkbridge.message import OutboundMessage

_MSGID = re.compile(r"<[^<>\s]+>")
_MAX_REFERENCES = 20
MAX_CHAIN = 100
"""Ids of a mail's References and In-Reply-To kept (its root and newest): anyone can write
thousands, and each is looked up in the store."""


# ---- parsing helpers ------------------------------------------------------------------------


def parse_mail(raw: bytes) -> EmailMessage:
    """Parse bytes with the modern policy; never raises (defects are recorded, not fatal)."""
    parsed = message_from_bytes(_legacy_headers_as_utf8(raw), policy=policy.default)
    assert isinstance(parsed, EmailMessage)
    return parsed


_HEADER_END = re.compile(rb"\r?\n\r?\n")


def _legacy_headers_as_utf8(raw: bytes) -> bytes:
    """The mail with its top-level header lines that are raw 8-bit but not UTF-8 re-encoded
    from Windows-1252 to UTF-8, which the parser reads (RFC 6532).

    RFC 5322 headers are ASCII, but old mailers (PHP's `mail()`, web forms) write Latin-1
    names and subjects as raw bytes; the parser would make each such letter U+FFFD, and the
    reply's subject would carry it back. Mail clients read them as Windows-1252; so do we.
    """
    end = _HEADER_END.search(raw)
    head = raw[: end.start()] if end else raw
    if head.isascii():
        return raw
    lines = head.splitlines(keepends=True)
    for index, line in enumerate(lines):
        try:
            line.decode("utf-8")
        except UnicodeDecodeError:
            lines[index] = windows_1252(line.decode("latin-1")).encode("utf-8")
    return b"".join(lines) + raw[len(head) :]


def header(msg: Message, name: str) -> str:
    """A header's decoded value ('' when absent); broken encodings fall back to the raw text."""
    try:
        value = msg.get(name)
    except Exception:  # the header parser gave up: use the undecoded value
        raw = [v for k, v in msg.raw_items() if k.lower() == name.lower()]
        value = raw[0] if raw else None
    if value is None:
        return ""
    return re.sub(r"\s+", " ", windows_1252(str(value))).strip()


def message_ids(value: str) -> list[str]:
    return _MSGID.findall(value)


def message_id_of(msg: Message, raw: bytes) -> str:
    """The Message-ID, or a stable stand-in (hash of the bytes) when the mail has none."""
    value = header(msg, "Message-ID")
    found = message_ids(value)
    if found:
        return found[0]
    token = value.strip().strip("<>")
    if token and " " not in token and "@" in token:
        return f"<{token}>"
    return f"<{hashlib.sha256(raw).hexdigest()[:32]}@talkbridge.invalid>"


def ids_in(msg: Message, name: str) -> list[str]:
    """The Message-IDs in a header, read from its raw value: ids are ASCII with nothing to
    decode, and the header parser takes seconds on the megabyte anyone can write there."""
    value = next((str(v) for k, v in msg.raw_items() if k.lower() == name.lower()), "")
    if not value.isascii():  # 8-bit bytes come as surrogates: letters (RFC 6532) or U+FFFD
        value = value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return message_ids(value)


def reference_chain(msg: Message) -> list[str]:
    """Ids this mail answers, oldest first: References, then In-Reply-To if not already there;
    of more than `MAX_CHAIN`, the root and the newest."""
    ids = ids_in(msg, "References") + ids_in(msg, "In-Reply-To")
    chain = list(dict.fromkeys(ids))
    if len(chain) > MAX_CHAIN:
        chain = [chain[0], *chain[-(MAX_CHAIN - 1) :]]
    return chain


def addresses(msg: Message, *names: str) -> list[tuple[str, str]]:
    """(display name, lower-cased address) pairs from address headers, bad entries skipped."""
    found: list[tuple[str, str]] = []
    for name in names:
        try:
            values = [str(v) for v in msg.get_all(name, [])]
        except Exception:
            values = [v for k, v in msg.raw_items() if k.lower() == name.lower()]
        parsed = [
            (windows_1252(display.strip()), addr.strip().lower())
            for display, addr in getaddresses(values)
            if "@" in addr and " " not in addr.strip()
        ]
        if not parsed:  # no angle brackets where a mailer forgot them: the bare address then
            raw = [str(v) for k, v in msg.raw_items() if k.lower() == name.lower()]
            parsed = [("", m.group(0).lower()) for v in raw for m in _BARE_ADDRESS.finditer(v)]
        found.extend(parsed)
    return found


_BARE_ADDRESS = re.compile(r"[\w.+'-]+@[\w-]+(?:\.[\w-]+)+")


def normalize_subject(subject: str) -> str:
    return REPLY_PREFIX.sub("", subject).strip()


def reply_subject(subject: str) -> str:
    """`Re: ` exactly once, whatever chain of Re:/AW:/SV: the subject already carries."""
    base = normalize_subject(subject)
    return f"Re: {base}" if base else "Re:"


def _timestamp(msg: Message, received_at: datetime) -> datetime:
    value = header(msg, "Date")
    try:
        parsed = parsedate_to_datetime(value) if value else None
    except (TypeError, ValueError, IndexError):
        parsed = None
    if parsed is None:
        return received_at.astimezone(UTC)
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)  # RFC 5322 "-0000": time zone unknown
    return parsed.astimezone(UTC)


# ---- bodies and attachments ----------------------------------------------------------------


_C1 = re.compile(r"[\x80-\x9f]")


def _c1_as_cp1252(match: re.Match[str]) -> str:
    try:
        return match.group().encode("latin-1").decode("cp1252")
    except UnicodeDecodeError:  # 0x81, 0x8d, 0x8f, 0x90, 0x9d: no Windows-1252 meaning
        return match.group()


def windows_1252(text: str) -> str:
    """C1 control characters read as the Windows-1252 characters they were meant as.

    Outlook and many webmailers label Windows-1252 text `iso-8859-1`; decoded as labelled, its
    curly quotes, dashes and euro sign (bytes 0x80-0x9f) become invisible control characters.
    Mail clients read the label as Windows-1252 (as the WHATWG Encoding standard says); so do we.
    """
    return _C1.sub(_c1_as_cp1252, text) if _C1.search(text) else text


def part_text(part: Message) -> str:
    """A text part's content in any declared charset; wrong or unknown declarations degrade
    to UTF-8, then Windows-1252, with replacement characters instead of an exception."""
    payload = part.get_payload(decode=True)
    if not isinstance(payload, bytes):
        payload = str(part.get_payload()).encode("utf-8", "replace")
    declared = part.get_content_charset() or "us-ascii"
    attempts = [declared, "utf-8", "cp1252"]
    for charset in attempts:
        try:
            codecs.lookup(charset)
            return windows_1252(payload.decode(charset))
        except (LookupError, UnicodeDecodeError):
            continue
    return payload.decode("utf-8", "replace")


def _leaves(msg: Message) -> list[Message]:
    """Leaf parts in order; an attached message (message/rfc822) is one leaf, not opened."""
    if msg.is_multipart() and msg.get_content_maintype() != "message":
        out: list[Message] = []
        payload = msg.get_payload()
        for sub in payload if isinstance(payload, list) else []:
            if isinstance(sub, Message):
                out.extend(_leaves(sub))
        return out
    return [msg]


def _is_attachment(part: Message) -> bool:
    disposition = (part.get_content_disposition() or "").lower()
    if disposition == "attachment" or part.get_filename():
        return True
    return part.get_content_maintype() not in ("text", "multipart")


def _body_parts(msg: Message) -> tuple[Message | None, Message | None]:
    """The plain and the HTML body part (either may be None)."""
    plain = html = None
    for part in _leaves(msg):
        if _is_attachment(part):
            continue
        subtype = part.get_content_subtype()
        if part.get_content_type() == "text/plain" and plain is None:
            plain = part
        elif subtype == "html" and html is None:
            html = part
    return plain, html


_KINDS: dict[str, AttachmentKind] = {"image": "image", "video": "video", "audio": "audio"}


def attachments_of(msg: Message, message_id: str) -> list[Attachment]:
    """Every leaf that is not the body, inline images included; `ref` = `<id>#<leaf index>`."""
    plain, html = _body_parts(msg)
    found: list[Attachment] = []
    for index, part in enumerate(_leaves(msg)):
        if part is plain or part is html or not _is_attachment(part):
            continue
        try:
            payload = part.get_payload(decode=True)
        except Exception:
            payload = None
        size = len(payload) if isinstance(payload, bytes) else None
        if part.get_content_type() == "message/rfc822":
            size = len(part.as_bytes()) if size is None else size
        meta: dict[str, Any] = {}
        content_id = header(part, "Content-ID").strip("<>")
        if content_id:
            meta["content_id"] = content_id
        if (part.get_content_disposition() or "inline") == "inline":
            meta["inline"] = True
        try:
            name = part.get_filename()
        except Exception:
            name = None
        found.append(
            Attachment(
                kind=_KINDS.get(part.get_content_maintype(), "document"),
                name=name,
                mime_type=part.get_content_type(),
                size=size,
                ref=f"{message_id}#{index}",
                meta=meta,
            )
        )
    return found


def attachment_bytes(raw: bytes, index: int) -> bytes:
    """The decoded content of leaf `index` of a mail (what an attachment `ref` points at)."""
    leaves = _leaves(parse_mail(raw))
    if not 0 <= index < len(leaves):
        raise LookupError(f"the mail has no part {index}")
    part = leaves[index]
    if part.get_content_type() == "message/rfc822":
        return part.as_bytes()
    payload = part.get_payload(decode=True)
    return payload if isinstance(payload, bytes) else b""


def parse_ref(ref: str) -> tuple[str, int]:
    message_id, _, index = ref.rpartition("#")
    if not message_id or not index.isdigit():
        raise ValueError(f"not an email attachment reference: {ref!r}")
    return message_id, int(index)


# ---- inbound --------------------------------------------------------------------------------


@dataclass(frozen=True)
class MailContext:
    """What answering one mail needs later (stored by the transport; JSON round-trips)."""

    message_id: str
    references: tuple[str, ...]
    subject: str
    reply_to: tuple[str, ...]
    cc: tuple[str, ...] = ()
    thread_id: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> MailContext:
        data = json.loads(text)
        return cls(
            message_id=data["message_id"],
            references=tuple(data.get("references", ())),
            subject=data.get("subject", ""),
            reply_to=tuple(data.get("reply_to", ())),
            cc=tuple(data.get("cc", ())),
            thread_id=data.get("thread_id", ""),
        )


@dataclass
class InboundMail:
    """A parsed inbound mail: the message for the router and the context for replying."""

    message: NormalizedMessage
    context: MailContext
    chain: list[str] = field(default_factory=list)


def context_of(msg: Message, message_id: str, *, address: str, thread_id: str) -> MailContext:
    """Whom the answer goes to: all (Reply-To or From, and the others on To and Cc), the
    mailbox's own address (plus-tagged too) never."""
    answer = addresses(msg, "Reply-To") or addresses(msg, "From")
    answer_to = [a for _, a in answer if not is_own(a, address)]
    others = [
        a for _, a in addresses(msg, "To", "Cc") if not is_own(a, address) and a not in answer_to
    ]
    return MailContext(
        message_id=message_id,
        references=tuple(reference_chain(msg)),
        subject=header(msg, "Subject"),
        reply_to=tuple(dict.fromkeys(answer_to)),
        cc=tuple(dict.fromkeys(others)),
        thread_id=thread_id,
    )


def read_mail(
    raw: bytes,
    *,
    connection_id: str,
    address: str,
    received_at: datetime,
    uid: int | None = None,
    authenticated_by: str | None = None,
    contact_forms: bool = False,
) -> InboundMail | str:
    """Decode one mail; returns the reason instead when it must not be answered.

    With `authenticated_by` (the receiving server's authserv-id) the message says whether
    that server vouches for its From (`sender_verified`); without, it is not checked (None).
    With `contact_forms`, mail From our own address with a Reply-To elsewhere (a web form's)
    is answered, its sender being that Reply-To, which nothing vouches for.
    """
    msg = parse_mail(raw)
    message_id = message_id_of(msg, raw)
    chain = reference_chain(msg)
    reason = skip_reason(
        msg, address=address, message_id=message_id, contact_forms=contact_forms, answers=chain
    )
    if reason is not None:
        return reason
    thread_id = chain[0] if chain else message_id
    own = address.lower()
    senders = addresses(msg, "From") or addresses(msg, "Sender") or addresses(msg, "Return-Path")
    form = contact_forms and bool(senders) and all(a == own for _, a in senders)
    if form:  # (`skip_reason` let it through: it has a Reply-To elsewhere)
        named = contact_form_sender(msg, address)
        senders = [(d, a) for d, a in addresses(msg, "Reply-To") if a == named][:1]
    display, sender = senders[0] if senders else ("", "unknown")
    participants = {a for _, a in addresses(msg, "From", "To", "Cc") if not is_own(a, own)}
    plain, html = _body_parts(msg)
    html_text = part_text(html) if html is not None else None
    full = part_text(plain) if plain is not None else ""
    if plain is not None and str(plain.get_param("format", "")).lower() == "flowed":
        full = unflow(full, delsp=str(plain.get_param("delsp", "")).lower() == "yes")
    if not full.strip() and html_text is not None:
        full = html_to_text(html_text)
    full = full.replace("\r\n", "\n").strip()
    subject = header(msg, "Subject")
    in_reply_to = ids_in(msg, "In-Reply-To")
    context = context_of(msg, message_id, address=address, thread_id=thread_id)
    if not context.reply_to:  # checked before a turn runs: its answer could go nowhere
        return "no address to answer (no usable From or Reply-To)"
    proof: Proof | None = None
    if authenticated_by is not None and not form:
        domains = {a.rpartition("@")[2] for _, a in addresses(msg, "From")}
        if len(domains) == 1:  # (From addresses of several domains: no one proof for all)
            proof = vouched(msg, authenticated_by, domains.pop())
    message = NormalizedMessage(
        id=message_id,
        connection_id=connection_id,
        channel="email",
        channel_user_id=sender,
        display_name=display or sender,
        thread_id=thread_id,
        thread_name=normalize_subject(subject) or None,
        thread_type="group" if len(participants) > 1 else "private",
        timestamp=_timestamp(msg, received_at),
        text=trim_reply(full) if full else "",
        attachments=tuple(attachments_of(msg, message_id)),
        reply_to=ReplyTo(message_id=in_reply_to[-1]) if in_reply_to else None,
        # Whom a reply goes to (Reply-To or From, and the others on To/Cc: replies go to all),
        # and who else signed the mail: all must be trusted for the mail to be (a trusted From
        # with a stranger's Reply-To or Cc is not: the answer reaches them).
        also_answered=tuple(
            sorted({a for _, a in senders} | set(context.reply_to) | set(context.cc))
        ),
        sender_verified=None if authenticated_by is None else proof is not None,
        raw_event={
            "raw": raw,
            "uid": uid,
            "contact_form": form,  # From our own address, the sender named by Reply-To
            "from_authenticated": proof,  # "dmarc", "dkim", or None (see `authenticated_by`)
            "full_text": full,
            "html": html_text,
            "subject": subject,
            "headers": [(k, str(v)) for k, v in msg.raw_items()],
            "context": asdict(context),
        },
    )
    return InboundMail(message, context, chain)


def decode_mail(
    raw: bytes,
    *,
    connection_id: str,
    address: str,
    received_at: datetime,
    uid: int | None = None,
    authenticated_by: str | None = None,
) -> NormalizedMessage | None:
    """The `NormalizedMessage` for a mail, or None for one we must never answer."""
    result = read_mail(
        raw,
        connection_id=connection_id,
        address=address,
        received_at=received_at,
        uid=uid,
        authenticated_by=authenticated_by,
    )
    return result.message if isinstance(result, InboundMail) else None


# ---- outbound -------------------------------------------------------------------------------


def new_message_id(address: str, unique: str | None = None) -> str:
    """A Message-ID of our domain, tagged so we recognise our own mail coming back."""
    domain = address.rpartition("@")[2]
    token = unique or uuid.uuid4().hex
    return f"<{token}.tb{own_tag(address)}@{domain}>"


def markdown_to_html(text: str) -> str:
    # html=False in the parser: raw HTML in the text is shown as text, never passed into the mail.
    body = markdown.parser(tables=True).render(text)
    return f"<!DOCTYPE html>\n<html><body>\n{body}</body></html>\n"


def _split_mime(mime_type: str | None) -> tuple[str, str]:
    maintype, _, subtype = (mime_type or "application/octet-stream").partition("/")
    if not maintype or not subtype:
        return "application", "octet-stream"
    return maintype.lower(), subtype.lower()


def _format(addr: str) -> str:
    """An address for a header. An internationalised domain goes as IDNA (`xn--…`), which
    every server takes; a local part that is not ASCII stays as it is, and the mail goes with
    SMTPUTF8 (RFC 6531), which the server must offer (`needs_smtputf8`)."""
    local, _, domain = addr.rpartition("@")
    if not domain.isascii():
        try:
            domain = domain.encode("idna").decode("ascii")
        except UnicodeError:
            raise ValueError(f"cannot answer {addr!r}: its domain is not a valid name") from None
    return f"{local}@{domain}"


def needs_smtputf8(addresses: Iterable[str]) -> list[str]:
    """The addresses a mail can reach only over SMTPUTF8: those with a local part beyond
    ASCII (`jürgen@example.org`; a domain beyond ASCII goes as IDNA)."""
    return [a for a in addresses if not a.rpartition("@")[0].isascii()]


def render_reply(
    message: OutboundMessage,
    *,
    address: str,
    context: MailContext | None,
    to: tuple[str, ...] = (),
    message_id: str,
    date: datetime,
    display_name: str | None = None,
) -> EmailMessage:
    """The mail for `message`: a reply to `context`, or a new mail to `to` when it is None.

    Raises ValueError for what cannot be sent (no recipient, an attachment without bytes).
    """
    recipients = context.reply_to if context is not None else to
    if not recipients:
        raise ValueError("no recipient: the mail being answered had no usable From or Reply-To")
    mail = EmailMessage(policy=policy.SMTP)
    sender = Address(display_name=display_name or "", addr_spec=address)
    mail["From"] = sender
    mail["To"] = ", ".join(_format(a) for a in recipients)
    if context is not None and context.cc:
        mail["Cc"] = ", ".join(_format(a) for a in context.cc)
    if context is not None:
        subject = reply_subject(context.subject)
        references = [*context.references, context.message_id]
        if len(references) > _MAX_REFERENCES:  # keep the root, drop the middle (RFC 5322 3.6.4)
            references = [references[0], *references[-(_MAX_REFERENCES - 1) :]]
        mail["In-Reply-To"] = context.message_id
        mail["References"] = " ".join(references)
    else:
        subject = str(message.meta.get("subject") or "Message")
    mail["Subject"] = subject
    mail["Date"] = format_datetime(date.astimezone(UTC))
    mail["Message-ID"] = message_id
    mail["Auto-Submitted"] = "auto-replied"  # RFC 3834: other responders must not answer this
    mail["X-Auto-Response-Suppress"] = "All"  # and Exchange sends us no out-of-office notes
    mail.set_content(message.text or "", subtype="plain", charset="utf-8")
    if message.markup == "markdown" and message.text:
        mail.add_alternative(markdown_to_html(message.text), subtype="html", charset="utf-8")
    for attachment in message.attachments:
        if attachment.data is None:
            raise ValueError(
                f"attachment {attachment.name or attachment.kind!r} has no bytes to attach"
            )
        maintype, subtype = _split_mime(attachment.mime_type)
        mail.add_attachment(
            attachment.data,
            maintype=maintype,
            subtype=subtype,
            filename=attachment.name or "attachment",
        )
    return mail


def recipients_of(mail: EmailMessage) -> list[str]:
    return [a for _, a in addresses(mail, "To", "Cc")]
