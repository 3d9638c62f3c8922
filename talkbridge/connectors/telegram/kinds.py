"""The message kinds with no text of their own: what an agent reads of them, or why they are
skipped. Pure, on the Bot API's JSON.

A dice, a poll, a checklist, a contact, a venue or a location says something in words an agent
can answer, so it arrives as that text (the structured attachment stays, where there is one). A
story, a game, an invoice, a giveaway or paid media holds nothing a bot can read: the transport
says in the log what it skipped and why, or the bot would seem to ignore the user for no reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SKIPPED = {
    "story": "a forwarded story, which the Bot API gives bots as an id only, not its content",
    "game": "a game, played on the game's own page; there is nothing in it to answer",
    "invoice": "an invoice; the bridge takes no payments",
    "giveaway": "a giveaway announcement, with nothing in it to answer",
    "giveaway_winners": "the winners of a giveaway, with nothing in it to answer",
    "paid_media": "paid media without a caption, which is hidden from bots until paid",
    "rich_message": "a rich message, which this version does not read",
}
"""Kinds of message with no text form, and why they are not delivered."""


def _name(person: Mapping[str, Any]) -> str:
    return " ".join(str(p) for p in (person.get("first_name"), person.get("last_name")) if p)


def _contact(contact: Mapping[str, Any]) -> str:
    parts = [_name(contact), str(contact.get("phone_number") or "")]
    return "Contact: " + ", ".join(p for p in parts if p)


def _venue(venue: Mapping[str, Any]) -> str:
    parts = [str(venue.get(k) or "") for k in ("title", "address")]
    return "Venue: " + ", ".join(p for p in parts if p)


def _location(location: Mapping[str, Any]) -> str:
    what = "Live location" if location.get("live_period") else "Location"
    return f"{what}: {location.get('latitude')}, {location.get('longitude')}"


def _poll(poll: Mapping[str, Any]) -> str:
    what = "Quiz" if poll.get("type") == "quiz" else "Poll"
    options = [o.get("text") for o in poll.get("options") or () if isinstance(o, Mapping)]
    lines = [f"{what}: {poll.get('question') or ''}".rstrip()]
    lines += [f"- {text}" for text in options if text]
    return "\n".join(lines)


def _checklist(checklist: Mapping[str, Any]) -> str:
    lines = [f"Checklist: {checklist.get('title') or ''}".rstrip()]
    for task in checklist.get("tasks") or ():
        if isinstance(task, Mapping) and task.get("text"):
            done = task.get("completion_date") or task.get("completed_by_user")
            lines.append(f"- [{'x' if done else ' '}] {task['text']}")
    return "\n".join(lines)


def _dice(dice: Mapping[str, Any]) -> str:
    return f"{dice.get('emoji') or '🎲'} (dice value {dice.get('value')})"


def _web_app_data(data: Mapping[str, Any]) -> str:
    return str(data.get("data") or "")


_TEXT_FORMS = (
    ("contact", _contact),
    ("venue", _venue),  # before `location`, which a venue also carries
    ("location", _location),
    ("poll", _poll),
    ("checklist", _checklist),
    ("dice", _dice),
    ("web_app_data", _web_app_data),  # what a Web App sent the bot (`sendData`)
)


def text_form(message: Mapping[str, Any]) -> str:
    """The words of a message that has no text or caption, or "" if its kind has none."""
    for field, form in _TEXT_FORMS:
        value = message.get(field)
        if isinstance(value, Mapping):
            return form(value)
    return ""


def skipped(message: Mapping[str, Any], *, edited: bool) -> tuple[str, str] | None:
    """(kind, why) for a message the bridge does not deliver though someone sent it, so the
    transport can say so; None for anything else (service messages: joins, pins, …)."""
    if edited and isinstance(message.get("location"), Mapping):
        # Only a live location changes after it is sent, every few seconds while it is shared:
        # answering each move would run the agent over and over.
        return "live location", "a live location moved; its first position was delivered"
    for kind, why in SKIPPED.items():
        if kind in message:
            return kind, why
    return None
