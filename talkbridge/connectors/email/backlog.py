"""Which unread mail the first start of a connection answers (pure: no I/O, no aioimaplib).

A connection with no cursor (its first start, or a folder whose UIDVALIDITY changed) cannot
tell the mail nobody handled from the mail a person left unread for years. Answering all of it
sends a flood of replies to people who wrote long ago, so a first start answers the unread
mail *received* in the last `backlog_days` only; the rest stays unread, for a person, and the
cursor moves past it, so it is never answered later either.

The server narrows the search (`UNSEEN SINCE d-Mon-yyyy`, whole days); the INTERNALDATE of each
mail found decides to the second.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, date, datetime, timedelta, timezone

_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_INTERNALDATE = re.compile(
    r"^\s*(\d{1,2})-([A-Za-z]{3})-(\d{4}) (\d{2}):(\d{2}):(\d{2}) ([+-])(\d{2})(\d{2})\s*$"
)


def backlog_cutoff(now: datetime, days: float) -> datetime:
    """The oldest receipt time a first start answers: `days` before `now`."""
    return now - timedelta(days=days)


def imap_date(day: date) -> str:
    """RFC 3501's `date` (`9-Jun-2024`), with English month names whatever the locale."""
    return f"{day.day}-{_MONTHS[day.month - 1]}-{day.year}"


def since_search(cutoff: datetime) -> str:
    """UID SEARCH criteria finding at least every unread mail received at or after `cutoff`.

    SINCE compares the date of the internal date alone, in the server's time zone (RFC 3501,
    6.4.4), which is up to 12 hours behind UTC: the day before the cutoff's UTC date catches
    every mail received since the cutoff, and a few older ones that `received_since` drops.
    """
    day = cutoff.astimezone(UTC).date() - timedelta(days=1)
    return f"UNSEEN SINCE {imap_date(day)}"


def parse_internal_date(text: str) -> datetime | None:
    """An INTERNALDATE (`"17-Jul-1996 02:44:25 -0700"`, quotes optional), or None if unreadable."""
    match = _INTERNALDATE.match(text.strip().strip('"'))
    if match is None:
        return None
    day, month, year, hour, minute, second, sign, off_h, off_m = match.groups()
    try:
        offset = timedelta(hours=int(off_h), minutes=int(off_m))
        zone = timezone(-offset if sign == "-" else offset)
        return datetime(
            int(year),
            _MONTHS.index(month.capitalize()) + 1,
            int(day),
            int(hour),
            int(minute),
            int(second),
            tzinfo=zone,
        )
    except ValueError:  # Feb 30, an hour 25, a month that is not one, an offset of 24 h
        return None


def received_since(
    candidates: list[int], dates: Mapping[int, datetime], cutoff: datetime
) -> list[int]:
    """The UIDs among `candidates` received at or after `cutoff`, in order. A mail whose date
    the server did not give is left alone: answering old mail by mistake is the harm to avoid,
    and it stays unread for a person."""
    return [uid for uid in candidates if uid in dates and dates[uid] >= cutoff]
