"""Authentication-Results (RFC 8601): when the receiving server vouches for a mail's From."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from talkbridge.connectors.email.authresults import parse
from talkbridge.connectors.email.codec import InboundMail, read_mail
from talkbridge.message import NormalizedMessage


def message(headers: str, sender: str = "Ada <ada@example.org>", **kw: str) -> NormalizedMessage:
    raw = f"{headers}From: {sender}\r\nTo: help@example.com\r\nSubject: hi\r\n\r\nhello\r\n"
    result = read_mail(
        raw.encode(),
        connection_id="help",
        address="help@example.com",
        received_at=datetime(2024, 6, 1, tzinfo=UTC),
        authenticated_by=kw.get("authserv_id", "mx.example.com"),
    )
    assert isinstance(result, InboundMail)
    return result.message


def test_parse_reads_ids_results_and_properties_past_comments_and_quotes() -> None:
    value = (
        ' MX.Example.COM 1 (comment; with = signs (nested)); dkim=pass (good sig) reason="a;b"'
        ' header.d=Example.org header.i="@example.org"; spf = neutral smtp.mailfrom=x.test;'
        " dmarc/1=pass header.from=example.org"
    )
    authserv_id, results = parse(value)
    assert authserv_id == "mx.example.com"
    assert [(r.method, r.result) for r in results] == [
        ("dkim", "pass"),
        ("spf", "neutral"),
        ("dmarc", "pass"),
    ]
    assert results[0].props == {"header.d": "Example.org", "header.i": "@example.org"}
    assert parse("mx.example.com; none") == ("mx.example.com", [])


@pytest.mark.parametrize(
    ("results", "proof"),
    [
        ("dmarc=pass header.from=example.org", "dmarc"),
        ("dmarc=pass", "dmarc"),  # the server judged the mail's own From
        ("dmarc=pass header.from=evil.test", None),
        ("dmarc=fail header.from=example.org; dkim=pass header.d=example.org", None),
        ("dmarc=none; dkim=pass header.d=example.org", "dkim"),
        ("dkim=pass header.i=@example.org", "dkim"),
        ("dkim=pass header.i=news@example.org", "dkim"),
        ("dkim=pass header.d=example.org.", "dkim"),
        ("dmarc=temperror; dkim=pass header.d=evil.test; dkim=pass header.d=example.org", "dkim"),
        ("dkim=fail header.d=example.org", None),
        ("dkim=pass header.d=evil.test", None),
        ("dkim=pass header.d=ample.org", None),  # not a parent of example.org
        ("spf=pass smtp.mailfrom=example.org", None),  # the envelope sender, not From
        ("none", None),
    ],
)
def test_what_vouches_for_a_from(results: str, proof: str | None) -> None:
    msg = message(f"Authentication-Results: mx.example.com; {results}\r\n")
    assert msg.raw_event["from_authenticated"] == proof
    assert msg.sender_verified is (proof is not None)


@pytest.mark.parametrize(
    ("signer", "sender", "aligned"),
    [
        ("example.org", "eu@mail.example.org", True),  # a parent signs for its subdomain
        ("mail.example.org", "ada@example.org", True),  # DMARC's relaxed default (RFC 7489)
        ("bounce.mail.example.org", "eu@shop.example.org", True),  # one organization
        ("mail.example.co.uk", "ada@example.co.uk", True),  # a two-label public suffix
        ("evil.co.uk", "ada@victim.co.uk", False),  # two organizations under co.uk
        ("co.uk", "ada@victim.co.uk", False),  # a public suffix owns nothing below it
        ("evil.github.io", "ada@victim.github.io", False),  # the list's private part counts
        ("example.org.evil.test", "ada@example.org", False),
    ],
)
def test_dkim_aligns_by_organizational_domain(signer: str, sender: str, aligned: bool) -> None:
    signed = f"Authentication-Results: mx.example.com; dkim=pass header.d={signer}\r\n"
    assert message(signed, sender).sender_verified is aligned
    by_i = f"Authentication-Results: mx.example.com; dkim=pass header.i=@{signer}\r\n"
    assert message(by_i, sender).sender_verified is aligned


def test_a_domain_asking_for_strict_alignment_is_judged_by_the_dmarc_verdict() -> None:
    # adkim=s lives in the domain's DMARC record: the server's verdict says whether it held.
    strict = "dmarc=fail header.from=example.org; dkim=pass header.d=mail.example.org"
    assert not message(f"Authentication-Results: mx.example.com; {strict}\r\n").sender_verified


def test_only_the_topmost_header_of_our_server_counts() -> None:
    ours = "Authentication-Results: mx.example.com; dmarc=fail header.from=example.org\r\n"
    forged = "Authentication-Results: mx.example.com; dmarc=pass header.from=example.org\r\n"
    other = "Authentication-Results: relay.example.net; dmarc=pass\r\n"
    assert not message(other + ours + forged).sender_verified
    assert not message(other).sender_verified
    assert not message("").sender_verified
    assert message(other + forged.replace("MX", "mx")).sender_verified


def test_from_addresses_of_two_domains_are_not_vouched_for() -> None:
    passed = "Authentication-Results: mx.example.com; dmarc=pass header.from=example.org\r\n"
    assert not message(passed, "ada@example.org, eve@evil.test").sender_verified


def test_without_authenticated_by_nothing_is_checked_and_the_verdict_is_stored() -> None:
    raw = b"From: ada@example.org\r\nTo: help@example.com\r\n\r\nhello\r\n"
    result = read_mail(
        raw, connection_id="help", address="help@example.com", received_at=datetime.now(UTC)
    )
    assert isinstance(result, InboundMail) and result.message.sender_verified is None
    # Kept where the message is stored (distributed mode's bus, a restart's recovery),
    # unlike `raw_event`.
    unverified = message("")
    stored = NormalizedMessage.model_validate_json(unverified.model_dump_json())
    assert stored.sender_verified is False


def test_a_contact_forms_sender_is_never_vouched_for() -> None:
    # The form's own domain passes DMARC; the customer's address in Reply-To is what anyone
    # typed into the form.
    passed = "Authentication-Results: mx.example.com; dmarc=pass header.from=example.com\r\n"
    raw = (
        f"{passed}From: help@example.com\r\nReply-To: boss@example.org\r\nTo: help@example.com"
        "\r\n\r\nhello\r\n"
    )
    result = read_mail(
        raw.encode(),
        connection_id="help",
        address="help@example.com",
        received_at=datetime.now(UTC),
        authenticated_by="mx.example.com",
        contact_forms=True,
    )
    assert isinstance(result, InboundMail)
    assert result.message.channel_user_id == "boss@example.org"
    assert result.message.sender_verified is False
