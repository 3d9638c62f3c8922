"""The pure email codec on a corpus of real-world and RFC example messages (payloads/*.json)."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime
from email import message_from_bytes, policy
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pytest

from talkbridge.connectors.email.codec import (
    MailContext,
    attachment_bytes,
    decode_mail,
    needs_smtputf8,
    new_message_id,
    parse_ref,
    read_mail,
    render_reply,
    reply_subject,
)
from talkbridge.connectors.email.config import EmailConfig
from talkbridge.connectors.email.imap import body_of, mailbox_name
from talkbridge.connectors.email.safety import ReplyLimiter, is_own_message_id
from talkbridge.connectors.email.text import html_to_text, trim_reply
from talkbridge.message import Attachment, NormalizedMessage, OutboundMessage

PAYLOADS = sorted((Path(__file__).parent / "payloads").glob("*.json"))
ADDRESS = "help@example.com"
NOW = datetime(2024, 6, 1, tzinfo=UTC)


def load(path: Path) -> tuple[bytes, dict[str, Any]]:
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["_source"], f"{path.name} must say where it came from"
    raw = base64.b64decode(data["raw_base64"]) if "raw_base64" in data else data["raw"].encode()
    return raw, data["expect"]


@pytest.mark.parametrize("path", PAYLOADS, ids=lambda p: p.stem)
def test_corpus_message_decodes_as_expected(path: Path) -> None:
    raw, expect = load(path)
    result = read_mail(raw, connection_id="help", address=ADDRESS, received_at=NOW, uid=7)
    if "skip" in expect:
        assert isinstance(result, str) and expect["skip"].lower() in result.lower()
        return
    assert not isinstance(result, str), result
    msg = result.message
    assert msg.channel == "email" and msg.connection_id == "help"
    for key in ("id", "thread_id", "channel_user_id", "display_name", "text", "thread_type"):
        if key in expect:
            assert getattr(msg, key) == expect[key], key
    if "thread_name" in expect:
        assert msg.thread_name == expect["thread_name"]
    if "reply_to" in expect:
        assert msg.reply_to is not None and msg.reply_to.message_id == expect["reply_to"]
    if "timestamp" in expect:
        assert msg.timestamp == datetime.fromisoformat(expect["timestamp"])
    if "attachment_types" in expect:
        assert [a.mime_type for a in msg.attachments] == expect["attachment_types"]
    if "attachment_names" in expect:
        assert [a.name for a in msg.attachments] == expect["attachment_names"]
    if "id_suffix" in expect:
        assert msg.id.endswith(expect["id_suffix"])
        again = decode_mail(raw, connection_id="help", address=ADDRESS, received_at=NOW)
        assert again is not None and again.id == msg.id  # stable across restarts: dedupe works
    if "full_text_contains" in expect:
        assert expect["full_text_contains"] in msg.raw_event["full_text"]
        assert expect["full_text_contains"] not in msg.text
    if expect.get("html_kept"):
        assert "<b>" in msg.raw_event["html"]
    assert msg.raw_event["raw"] == raw and msg.raw_event["uid"] == 7


@pytest.mark.parametrize("path", PAYLOADS, ids=lambda p: p.stem)
def test_no_corpus_message_crashes_even_when_mangled(path: Path) -> None:
    raw, _ = load(path)
    for mangled in (raw[: len(raw) // 2], raw.replace(b"\r\n", b"\n"), raw.replace(b":", b"", 3)):
        decode_mail(mangled, connection_id="help", address=ADDRESS, received_at=NOW)


def test_attachment_refs_resolve_to_their_bytes() -> None:
    raw, _ = load(Path(__file__).parent / "payloads" / "inline_image_related.json")
    msg = decode_mail(raw, connection_id="help", address=ADDRESS, received_at=NOW)
    assert msg is not None
    image, pdf = msg.attachments
    assert image.kind == "image" and image.meta == {"content_id": "shot1", "inline": True}
    assert pdf.kind == "document" and "inline" not in pdf.meta
    mid, index = parse_ref(pdf.ref or "")
    assert mid == msg.id
    assert attachment_bytes(raw, index) == b"%PDF-1.4\n"
    assert attachment_bytes(raw, parse_ref(image.ref or "")[1]).startswith(b"\x89PNG")


def test_several_people_make_a_group_thread_and_we_do_not_count() -> None:
    raw = b"From: a@x.org\r\nTo: help@example.com, b@x.org\r\nMessage-ID: <g@x.org>\r\n\r\nhi\r\n"
    msg = decode_mail(raw, connection_id="h", address=ADDRESS, received_at=NOW)
    assert msg is not None and msg.thread_type == "group"
    solo = raw.replace(b", b@x.org", b"")
    msg = decode_mail(solo, connection_id="h", address=ADDRESS, received_at=NOW)
    assert msg is not None and msg.thread_type == "private"


@pytest.mark.parametrize(
    ("headers", "trusted"),
    [
        (b"From: alice@example.org\r\n", True),
        (b"From: alice@example.org\r\nReply-To: alice@example.org\r\n", True),
        # The answer would go to the stranger: not the trusted sender's mail, for trust.
        (b"From: alice@example.org\r\nReply-To: evil@attacker.test\r\n", False),
        (b"From: alice@example.org, evil@attacker.test\r\n", False),
        (b"From: alice@example.org\r\nCc: bob@example.org\r\n", True),
        (b"From: alice@example.org\r\nCc: evil@attacker.test\r\n", False),  # reply-all
        (b"From: alice@example.org\r\nCc: Help+Billing@example.com\r\n", True),  # ours
        # Another mailbox at our domain: anyone's, at a public provider; trusted by pattern.
        (b"From: alice@example.org\r\nCc: support@example.com\r\n", False),
    ],
)
def test_a_mail_is_trusted_only_when_everyone_it_answers_to_is(
    headers: bytes, trusted: bool
) -> None:
    config = _email_config(["*@example.org"])
    raw = headers + b"To: help@example.com\r\nMessage-ID: <t@x.org>\r\n\r\nhi\r\n"
    msg = decode_mail(raw, connection_id="h", address=ADDRESS, received_at=NOW)
    assert msg is not None and msg.channel_user_id == "alice@example.org"
    assert config.trusts_message(msg) is trusted
    # As stored (the Redis inbound bus, a message recovered after a crash): the same verdict.
    stored = NormalizedMessage.model_validate_json(msg.model_dump_json())
    assert config.trusts_message(stored) is trusted


def _email_config(trusted: list[str]) -> EmailConfig:
    return EmailConfig.model_validate(
        {
            "id": "h",
            "address": ADDRESS,
            "imap": {"host": "imap.example.com", "username": "h", "password": "p"},
            "smtp": {"host": "smtp.example.com"},
            "trusted": trusted,
        }
    )


def test_an_at_domain_entry_trusts_that_whole_domain() -> None:
    config = _email_config(["@Example.org"])
    assert config.trusts("alice@example.org")
    assert not config.trusts("alice@example.org.attacker.test")
    assert not config.trusts("alice@other.org")


@pytest.mark.parametrize("entry", ["example.org", "alice"])
def test_a_trusted_entry_that_is_no_address_nor_pattern_is_refused(entry: str) -> None:
    with pytest.raises(ValueError, match=rf"{entry!r} would never match .*\*@"):
        _email_config(["alice@example.org", entry])


def test_our_own_message_ids_and_address_are_never_answered() -> None:
    mid = new_message_id(ADDRESS)
    assert is_own_message_id(mid, ADDRESS)
    assert not is_own_message_id(new_message_id("other@example.com"), ADDRESS)
    ours = f"From: x@y.org\r\nMessage-ID: {mid}\r\n\r\nloop\r\n".encode()
    assert read_mail(ours, connection_id="h", address=ADDRESS, received_at=NOW) == (
        "a message we sent (our own Message-ID)"
    )
    from_us = b"From: Help <HELP@example.com>\r\nMessage-ID: <z@y.org>\r\n\r\nx\r\n"
    assert "own address" in str(
        read_mail(from_us, connection_id="h", address=ADDRESS, received_at=NOW)
    )
    human = b"From: x@y.org\r\nAuto-Submitted: no\r\nMessage-ID: <q@y.org>\r\n\r\nx\r\n"
    assert decode_mail(human, connection_id="h", address=ADDRESS, received_at=NOW) is not None


def test_reply_threads_subjects_and_renders_markdown_as_alternative() -> None:
    context = MailContext(
        message_id="<m2@x.org>",
        references=("<root@x.org>", "<m1@example.com>"),
        subject="RE: Re: AW: Printer",
        reply_to=("ada@x.org",),
        cc=("bob@x.org",),
        thread_id="<root@x.org>",
    )
    out = OutboundMessage(
        thread_id="<root@x.org>",
        text="Try **this**:\n\n- restart\n- <script>x</script>",
        attachments=(
            Attachment(kind="document", name="a.txt", mime_type="text/plain", data=b"hi"),
        ),
    )
    mail = render_reply(
        out, address=ADDRESS, context=context, message_id="<new@example.com>", date=NOW
    )
    parsed = message_from_bytes(mail.as_bytes(), policy=policy.default)
    assert parsed["Subject"] == "Re: Printer"
    assert parsed["In-Reply-To"] == "<m2@x.org>"
    assert parsed["References"].split() == ["<root@x.org>", "<m1@example.com>", "<m2@x.org>"]
    assert parsed["To"] == "ada@x.org" and parsed["Cc"] == "bob@x.org"
    assert parsed["Auto-Submitted"] == "auto-replied"
    assert parsed["Message-ID"] == "<new@example.com>"
    body = parsed.get_body(("plain",))
    html = parsed.get_body(("html",))
    assert body is not None and html is not None
    assert "**this**" in body.get_content()
    assert "<strong>this</strong>" in html.get_content()
    assert "<script>" not in html.get_content()  # raw HTML in Markdown is escaped
    [attached] = list(parsed.iter_attachments())
    assert attached.get_filename() == "a.txt" and attached.get_content() == "hi"


def test_reply_subject_gets_re_exactly_once() -> None:
    assert reply_subject("Hello") == "Re: Hello"
    assert reply_subject("Re: Re: Hello") == "Re: Hello"
    assert reply_subject("AW: RE[2]: Hello") == "Re: Hello"
    assert reply_subject("") == "Re:"


def test_long_reference_chains_keep_the_root() -> None:
    refs = tuple(f"<r{i}@x.org>" for i in range(40))
    context = MailContext("<last@x.org>", refs, "s", ("a@x.org",))
    mail = render_reply(
        OutboundMessage(thread_id="<r0@x.org>", text="x", markup="plain"),
        address=ADDRESS,
        context=context,
        message_id="<n@example.com>",
        date=NOW,
    )
    chain = str(mail["References"]).split()
    assert chain[0] == "<r0@x.org>" and chain[-1] == "<last@x.org>" and len(chain) == 20
    assert mail.get_content_type() == "text/plain"  # plain markup: no HTML alternative


def test_html_to_text_keeps_structure_and_drops_scripts() -> None:
    text = html_to_text(
        "<style>x{}</style><script>alert(1)</script><h1>Title</h1><p>a<br>b</p>"
        "<ul><li>one</li><li>two</li></ul><blockquote>quoted</blockquote><p>end</p>"
    )
    assert text == "Title\n\na\nb\n\n- one\n- two\n\n> quoted\n\nend"
    assert html_to_text("<p>unclosed <b>bold <i>both") == "unclosed bold both"
    assert html_to_text("") == ""


def test_trim_reply_keeps_all_quote_mail_whole_and_interleaved_answers() -> None:
    assert trim_reply("> only a quote\n> nothing new") == "> only a quote\n> nothing new"
    interleaved = "> question 1?\nanswer 1\n> question 2?\nanswer 2\n\n> old tail"
    assert trim_reply(interleaved) == "answer 1\n> question 2?\nanswer 2"
    assert trim_reply("Fine.\n\nSent from my iPhone") == "Fine."
    assert trim_reply("Ok\n\nLe lun. 3 juin 2024, Bob <b@x.org> a écrit :\n> x") == "Ok"


def test_reply_limiter_allows_n_per_window_per_thread() -> None:
    limiter = ReplyLimiter(limit=2, window=60)
    for now in (0.0, 1.0):
        assert limiter.allowed("t", now)
        limiter.record("t", now)
    assert not limiter.allowed("t", 2.0)
    assert limiter.allowed("other", 2.0)
    assert limiter.allowed("t", 60.5)  # the first one left the window


@pytest.mark.parametrize(
    "lines",
    [
        [b"3 FETCH (UID 7 BODY[] {5}", bytearray(b"hello"), b")", b"A1 OK done"],
        # UID after the body: RFC 3501 lets a server put the items in any order.
        [b"3 FETCH (BODY[] {5}", bytearray(b"hello"), b" UID 7)", b"A1 OK done"],
        [
            b"2 FETCH (FLAGS (\\Seen) UID 6)",
            b"3 FETCH (BODY[] {5}",
            bytearray(b"hello"),
            b" UID 7)",
        ],
    ],
)
def test_the_fetched_body_is_found_whatever_the_order_of_its_items(lines: list[Any]) -> None:
    assert body_of(lines, 7) == b"hello"
    assert body_of(lines, 8) is None


def test_a_sentence_ending_like_an_attribution_is_kept_when_no_quote_follows() -> None:
    text = "Hi,\nOn the staging server the installer wrote:\nERROR 42: disk full\nWhat now?"
    assert trim_reply(text) == text
    quoted = "Thanks!\n\nOn Mon, 3 Jun 2024, Ada wrote:\n> is it fixed?\n> Ada"
    assert trim_reply(quoted) == "Thanks!"


def test_an_internationalised_domain_is_answered_in_idna_and_a_utf8_local_part_kept() -> None:
    def reply_to(address: str) -> EmailMessage:
        out = OutboundMessage(thread_id="<r0@x.org>", text="x", markup="plain")
        mail = render_reply(
            out, address=ADDRESS, context=None, to=(address,), message_id="<n@e>", date=NOW
        )
        raw = mail.as_bytes(policy=policy.SMTPUTF8)  # as aiosmtplib sends it with SMTPUTF8
        return message_from_bytes(raw, policy=policy.default)

    assert reply_to("alice@bücher.example")["To"] == "alice@xn--bcher-kva.example"
    assert reply_to("jörg@bücher.example")["To"] == "jörg@xn--bcher-kva.example"
    assert needs_smtputf8(["jörg@bücher.example", "alice@bücher.example"]) == [
        "jörg@bücher.example"
    ]


def test_folder_names_go_in_modified_utf7() -> None:
    assert mailbox_name("Unterstützung") == "Unterst&APw-tzung"
    assert mailbox_name("日本語") == "&ZeVnLIqe-"  # RFC 3501's own example
    assert mailbox_name("Q&A") == "Q&-A" and mailbox_name("INBOX") == "INBOX"


def test_a_mail_with_no_address_to_answer_is_skipped_before_any_turn() -> None:
    # Its answer could go nowhere: skipped, it stays unread for a person, no turn is spent.
    for headers in (b"", b"From: not an address at all\r\n"):
        raw = headers + b"To: help@example.com\r\nMessage-ID: <n@x.org>\r\n\r\nhelp?\r\n"
        result = read_mail(raw, connection_id="h", address=ADDRESS, received_at=NOW)
        assert result == "no address to answer (no usable From or Reply-To)"
    bare = b"From: Ada ada@example.org\r\nMessage-ID: <b@x.org>\r\n\r\nhi\r\n"  # no <...>
    msg = decode_mail(bare, connection_id="h", address=ADDRESS, received_at=NOW)
    assert msg is not None and msg.channel_user_id == "ada@example.org"


def test_the_reply_limiter_forgets_threads_whose_window_is_over() -> None:
    limiter = ReplyLimiter(limit=2, window=60)
    for n in range(5000):  # one reply each to many threads, a second apart
        limiter.record(f"t{n}", float(n))
    assert limiter.threads <= 2 * 60 + 1024  # not 5000: only recent threads are kept
    limiter.record("t4999", 4999.5)
    assert not limiter.allowed("t4999", 4999.6)  # a recent thread's count is intact


def test_windows_1252_text_labelled_iso_8859_1_keeps_its_quotes_dashes_and_euro() -> None:
    # Outlook's classic: Windows-1252 bytes under an iso-8859-1 label, in body and headers.
    raw = (
        b"From: =?iso-8859-1?q?Ren=E9_=93Bob=94?= <bob@example.org>\r\n"
        b"To: help@example.com\r\nMessage-ID: <cp@example.org>\r\n"
        b"Subject: =?iso-8859-1?q?=93Invoice=94_=96_=80_40?=\r\n"
        b"Content-Type: text/plain; charset=iso-8859-1\r\n"
        b"Content-Transfer-Encoding: quoted-printable\r\n\r\n"
        b"He said =93it costs =80 40=94 =96 caf=E9.\r\n"
    )
    msg = decode_mail(raw, connection_id="help", address=ADDRESS, received_at=NOW)
    assert msg is not None
    assert msg.text == "He said \u201cit costs \u20ac 40\u201d \u2013 caf\u00e9."
    assert msg.thread_name == "\u201cInvoice\u201d \u2013 \u20ac 40"
    assert msg.display_name == "Ren\u00e9 \u201cBob\u201d"


@pytest.mark.parametrize(
    ("params", "wrapped", "expected"),
    [
        ("format=flowed", "the printer on the second floor \r\njams", "second floor jams"),
        (
            "format=flowed; delsp=yes",
            "the printer on the second fl \r\noor jams",
            "second floor jams",
        ),
    ],
)
def test_a_format_flowed_body_reads_as_its_writer_typed_it(
    params: str, wrapped: str, expected: str
) -> None:
    delsp = "delsp=yes" in params  # the space that marks a wrap is then one more than the text
    # Thunderbird and Apple Mail wrap at ~72 characters, a trailing space marking each wrap
    # (RFC 3676); the quote of the earlier mail is wrapped and space-stuffed the same way.
    raw = (
        b"From: bob@example.org\r\nTo: help@example.com\r\nMessage-ID: <fl@example.org>\r\n"
        b"Content-Type: text/plain; charset=utf-8; " + params.encode() + b"\r\n\r\n"
        b"Since Monday " + wrapped.encode() + b" every morning.\r\n \r\n"
        b"On Mon, 3 Jun 2024, Help wrote:\r\n> Is the printer" + b" " * (1 + delsp) + b"\r\n"
        b"> still jammed?\r\n"
    )
    msg = decode_mail(raw, connection_id="help", address=ADDRESS, received_at=NOW)
    assert msg is not None
    assert msg.text == f"Since Monday the printer on the {expected} every morning."
    assert msg.raw_event["full_text"].endswith("> Is the printer still jammed?")
