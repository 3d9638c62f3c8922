"""Which unread mail a first start answers: the pure parts (dates, search criteria, the IMAP
answers they are read from) and the `backlog_days` key."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta, timezone
from typing import Any

import pytest
from pydantic import ValidationError

from talkbridge.config import format_errors
from talkbridge.connectors.email.backlog import (
    backlog_cutoff,
    imap_date,
    parse_internal_date,
    received_since,
    since_search,
)
from talkbridge.connectors.email.config import EmailConfig
from talkbridge.connectors.email.imap import internal_dates_of, uid_set

NOW = datetime(2024, 6, 10, 1, 30, tzinfo=UTC)


def test_the_cutoff_is_backlog_days_before_now() -> None:
    assert backlog_cutoff(NOW, 1) == datetime(2024, 6, 9, 1, 30, tzinfo=UTC)
    assert backlog_cutoff(NOW, 0.5) == datetime(2024, 6, 9, 13, 30, tzinfo=UTC)
    assert backlog_cutoff(NOW, 0) == NOW


def test_imap_dates_are_rfc_3501s_with_english_months() -> None:
    assert imap_date(datetime(2024, 6, 9).date()) == "9-Jun-2024"
    assert imap_date(datetime(2023, 12, 31).date()) == "31-Dec-2023"


@pytest.mark.parametrize("hours", [-12, -7, 0, 5.5, 14])
def test_since_finds_a_mail_received_at_the_cutoff_in_any_servers_time_zone(hours: float) -> None:
    # SINCE compares the server's local date of the internal date; at -12:00 a mail received
    # at 01:30 UTC on the 9th is dated the 8th there.
    cutoff = backlog_cutoff(NOW, 1)  # 2024-06-09 01:30 UTC
    assert since_search(cutoff) == "UNSEEN SINCE 8-Jun-2024"
    for received in (cutoff, cutoff + timedelta(hours=23)):
        local = received.astimezone(timezone(timedelta(hours=hours)))
        assert local.date() >= date(2024, 6, 8)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('"17-Jul-1996 02:44:25 -0700"', datetime(1996, 7, 17, 9, 44, 25, tzinfo=UTC)),
        ("01-Dec-2026 20:35:16 +0000", datetime(2026, 12, 1, 20, 35, 16, tzinfo=UTC)),
        (" 1-Jul-2024 00:00:00 +0530", datetime(2024, 6, 30, 18, 30, tzinfo=UTC)),  # day-fixed
        ("01-jan-2024 00:00:00 +0000", datetime(2024, 1, 1, tzinfo=UTC)),
        ("30-Feb-2024 00:00:00 +0000", None),
        ("01-Foo-2024 00:00:00 +0000", None),
        ("2024-01-01T00:00:00Z", None),
        ("", None),
    ],
)
def test_internal_dates_are_read_or_refused(text: str, expected: datetime | None) -> None:
    assert parse_internal_date(text) == expected


def test_internal_dates_are_taken_from_fetch_lines_in_any_item_order() -> None:
    lines: list[Any] = [
        b'1 FETCH (UID 4 INTERNALDATE "01-Dec-2026 20:35:16 +0000")',
        b'2 FETCH (INTERNALDATE "01-Nov-2026 20:35:16 +0000" UID 9)',
        b"3 FETCH (FLAGS (\\Seen))",  # unsolicited: a flag changed meanwhile
        b'4 FETCH (UID 12 INTERNALDATE "not a date")',
        b"Fetch completed (0.001 + 0.000 secs).",
    ]
    assert internal_dates_of(lines) == {
        4: datetime(2026, 12, 1, 20, 35, 16, tzinfo=UTC),
        9: datetime(2026, 11, 1, 20, 35, 16, tzinfo=UTC),
    }


def test_uid_sets_collapse_runs() -> None:
    assert uid_set([7, 1, 2, 3, 9, 10, 3]) == "1:3,7,9:10"
    assert uid_set([5]) == "5"


def test_only_mail_received_since_the_cutoff_is_answered_and_undated_mail_is_left() -> None:
    cutoff = backlog_cutoff(NOW, 1)
    dates = {
        1: cutoff - timedelta(seconds=1),
        2: cutoff,
        3: NOW,
        # 4: the server gave no date for it
    }
    assert received_since([1, 2, 3, 4], dates, cutoff) == [2, 3]


BASE = {
    "id": "help",
    "channel": "email",
    "address": "help@example.com",
    "imap": {"host": "imap.example.com", "username": "help", "password": "x"},
    "smtp": {"host": "smtp.example.com"},
}


@pytest.mark.parametrize(
    ("value", "expected"), [(None, 1), (2, 2), ("0.5", 0.5), (0, 0), ("all", "all"), ("All", "all")]
)
def test_backlog_days_is_a_number_of_days_or_all(value: Any, expected: float | str) -> None:
    given = BASE if value is None else {**BASE, "backlog_days": value}
    assert EmailConfig.model_validate(given).backlog_days == expected


@pytest.mark.parametrize("value", [-1, True, "forever", float("inf"), None])
def test_backlog_days_refuses_anything_else_in_plain_words(value: Any) -> None:
    with pytest.raises(ValidationError) as caught:
        EmailConfig.model_validate({**BASE, "backlog_days": value})
    assert format_errors(caught.value) == [
        "backlog_days: must be a number of days (0 or more), or all"
    ]
