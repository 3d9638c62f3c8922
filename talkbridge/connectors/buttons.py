"""The buttons of sent messages, for edits on platforms that take them off otherwise.

Telegram takes a message's inline keyboard off, and Slack its blocks (which hold both the text
shown and the buttons), when an edit sends the text alone: the edit must send them again. So
what each message was sent with is kept in the store, across restarts, for as long as the
bridge answers edits (`dedupe_for`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence

from talkbridge.connectors.base import ConnectorContext
from talkbridge.errors import PermanentError, StoreError, TransientError
from talkbridge.talk import KEEP, EditButtons

Buttons = tuple[tuple[str, str], ...]


def replacement(buttons: EditButtons) -> Buttons | None:
    """`Edit.edit`'s `buttons` as the pairs to put on the message, or None for `KEEP`."""
    if buttons is KEEP:
        return None
    if isinstance(buttons, str | bytes) or not isinstance(buttons, Sequence):
        raise PermanentError(
            "buttons must be (label, value) pairs, () to take them off, or KEEP; "
            f"got {type(buttons).__name__}"
        )
    pairs: list[tuple[str, str]] = []
    for pair in buttons:
        if (
            not isinstance(pair, tuple | list)
            or len(pair) != 2
            or not all(isinstance(p, str) for p in pair)
        ):
            raise PermanentError(f"a button is a (label, value) pair of strings, not {pair!r}")
        label, value = pair
        pairs.append((label, value))
    return tuple(pairs)


Position = Callable[[str], "tuple[str, tuple[int, ...]] | None"]
"""A sent message's chat and its place there (ids grow with time in a chat), from its native
id; None for an id that names no message of a chat (an uploaded file)."""


class KeptButtons:
    """The buttons each sent message of one connection carries, by native message id.

    A message's record is kept for `dedupe_for` after it was sent or last edited. An edit that
    keeps the buttons (`KEEP`) of a message without a record must tell "it had none" from "its
    record ran out", or it takes buttons off without a word. Two small records per chat, written
    only when buttons are kept (plain sends cost nothing), tell: `newest`, the latest message
    given buttons there (kept for good: one per chat), and `floor`, what `newest` was when a
    record was kept while no `floor` was (kept for `dedupe_for` from then: every message given
    buttons after that one was given them since, so its record outlives the floor). A message
    without a record after `newest`, or after a `floor`, had none; any other may have had
    buttons no longer known, and its edit fails, naming it, rather than dropping them.
    """

    def __init__(
        self,
        context: ConnectorContext,
        key_prefix: str,
        log: logging.Logger,
        position: Position | None = None,
    ) -> None:
        self._context = context
        self._prefix = key_prefix
        self._log = log
        self._position = position

    async def keep(self, message_id: str, buttons: Sequence[tuple[str, str]]) -> None:
        """Remember what `message_id` now carries (none too: an edit took them off, which
        later edits must know as surely as buttons). The message went out already: a store
        that fails now costs only a later edit its buttons, so it is logged."""
        key = self._prefix + message_id
        store = self._context.store
        keep_for = self._context.dedupe_for
        place = self._position(message_id) if self._position is not None else None
        try:
            newest: tuple[int, ...] | None = None
            if buttons and place is not None:
                chat = place[0]
                newest = _order(await store.get_state(f"{self._prefix}newest:{chat}"))
                floor_key = f"{self._prefix}floor:{chat}"
                if await store.get_state(floor_key) is None:  # before this message's record
                    await store.set_state(
                        floor_key, json.dumps(list(newest or ())), keep_for=keep_for
                    )
            value = json.dumps([list(button) for button in buttons])
            await store.set_state(key, value, keep_for=keep_for)
            if buttons and place is not None and (newest is None or place[1] > newest):
                await store.set_state(
                    f"{self._prefix}newest:{place[0]}", json.dumps(list(place[1]))
                )
        except StoreError as exc:
            self._log.warning("could not keep the buttons of %s: %s", message_id, exc)

    async def of(self, message_id: str) -> Buttons:
        """What `message_id` carries; a store that cannot tell fails the edit for a retry, as
        an edit now would take the buttons off."""
        try:
            kept = await self._context.store.get_state(self._prefix + message_id)
            if kept is not None:
                return tuple((str(label), str(value)) for label, value in json.loads(kept))
            if await self._had_none(message_id):
                return ()
        except StoreError as exc:
            raise TransientError(f"cannot tell which buttons the message has: {exc}") from exc
        days = self._context.dedupe_for.total_seconds() / 86400
        raise PermanentError(
            f"cannot keep the buttons of message {message_id}: which it had is kept for "
            f"{days:g} days (retention.dedupe_days) after it was sent or last edited; edit it "
            "with buttons=() to leave them off, or with the buttons to show"
        )

    async def _had_none(self, message_id: str) -> bool:
        """Whether a message without a record surely had no buttons (see the class)."""
        place = self._position(message_id) if self._position is not None else None
        if place is None:
            return True  # no chat to tell by: as before records were placed
        chat, order = place
        store = self._context.store
        newest = _order(await store.get_state(f"{self._prefix}newest:{chat}"))
        if newest is None or order > newest:
            return True  # nothing sent in the chat since, or before, had buttons
        floor = _order(await store.get_state(f"{self._prefix}floor:{chat}"))
        return floor is not None and order > floor

    async def for_edit(self, message_id: str, buttons: EditButtons) -> Buttons:
        """The buttons an edit of `message_id` sends: the kept ones for `KEEP`, else the given."""
        given = replacement(buttons)
        return await self.of(message_id) if given is None else given


def _order(value: str | None) -> tuple[int, ...] | None:
    if not value:
        return None
    try:
        found = json.loads(value)
    except ValueError:
        return None
    if isinstance(found, list) and all(isinstance(n, int) for n in found):
        return tuple(found)
    return None
