"""The buttons of sent messages, for edits on platforms that take them off otherwise.

Telegram takes a message's inline keyboard off, and Slack its blocks (which hold both the text
shown and the buttons), when an edit sends the text alone: the edit must send them again. So
what each message was sent with is kept in the store, across restarts, for as long as the
bridge answers edits (`dedupe_for`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence

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


class KeptButtons:
    """The buttons each sent message of one connection carries, by native message id."""

    def __init__(self, context: ConnectorContext, key_prefix: str, log: logging.Logger) -> None:
        self._context = context
        self._prefix = key_prefix
        self._log = log

    async def keep(self, message_id: str, buttons: Sequence[tuple[str, str]]) -> None:
        """Remember what `message_id` now carries (none: forget it). The message went out
        already: a store that fails now costs only a later edit its buttons, so it is logged."""
        key = self._prefix + message_id
        store = self._context.store
        try:
            if buttons:
                value = json.dumps([list(button) for button in buttons])
                await store.set_state(key, value, keep_for=self._context.dedupe_for)
            else:
                await store.delete_state(key)
        except StoreError as exc:
            self._log.warning("could not keep the buttons of %s: %s", message_id, exc)

    async def of(self, message_id: str) -> Buttons:
        """What `message_id` carries; a store that cannot tell fails the edit for a retry, as
        an edit now would take the buttons off."""
        try:
            kept = await self._context.store.get_state(self._prefix + message_id)
        except StoreError as exc:
            raise TransientError(f"cannot tell which buttons the message has: {exc}") from exc
        return tuple((str(label), str(value)) for label, value in json.loads(kept)) if kept else ()

    async def for_edit(self, message_id: str, buttons: EditButtons) -> Buttons:
        """The buttons an edit of `message_id` sends: the kept ones for `KEEP`, else the given."""
        given = replacement(buttons)
        return await self.of(message_id) if given is None else given
