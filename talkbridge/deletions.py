"""Messages deleted while the bridge is answering them: the turn still running is called off.

Users delete a message at once ("oops, wrong channel") while an agent takes seconds to answer.
The connector hears of it (`BaseConnector.withdraw_reply`) and tells `Deletions.deleted`: a
turn answering that message on this node is cancelled (its agent stops, turn watchers see it
"interrupted", nothing is posted), and one still waiting for its thread is not run. A reply
already being posted is the tombstone's business (`talkbridge.replies`): it is deleted once
recorded.

No task is created per turn: the turn's own task is cancelled, and the cancellation taken back
(`Task.uncancel`) once the turn stopped, as for a lost shard in distributed mode; a stop of
the bridge meanwhile still stops it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger("talkbridge")

REASON = "the message was deleted"
"""Why the turn was interrupted, as turn watchers are told (`TurnFinished.error`)."""

_Key = tuple[str, str]


class Deletions:
    def __init__(self, remembered: int = 10_000) -> None:
        self._recent: OrderedDict[_Key, None] = OrderedDict()
        """Messages deleted lately, heard of on this node: (connection id, native id)."""
        self._remembered = remembered
        self._answering: dict[_Key, asyncio.Task[object]] = {}
        self._called_off: set[_Key] = set()

    def deleted(self, connection_id: str, message_id: str) -> None:
        """A connector heard that a message was deleted (`ConnectorContext.on_deleted`)."""
        key = (connection_id, message_id)
        self._recent[key] = None
        self._recent.move_to_end(key)
        while len(self._recent) > self._remembered:
            self._recent.popitem(last=False)
        task = self._answering.get(key)
        if task is None or key in self._called_off or task is asyncio.current_task():
            return
        self._called_off.add(key)
        task.cancel(REASON)

    def __contains__(self, key: _Key) -> bool:
        """Whether this node heard lately that the message (connection id, native id) was
        deleted."""
        return key in self._recent

    @contextmanager
    def answering(self, connection_id: str, message_id: str) -> Iterator[None]:
        """Run a turn answering the message in this block: should the message be deleted
        meanwhile, the turn is cancelled and the block ends there, quietly (the caller then
        finds `(connection_id, message_id) in deletions`). A cancellation for another reason
        (a stop) goes on as always."""
        key = (connection_id, message_id)
        task = asyncio.current_task()
        assert task is not None
        self._answering[key] = task
        try:
            yield
        except asyncio.CancelledError:
            if key not in self._called_off:
                raise
            self._called_off.discard(key)
            if task.uncancel() > 0:
                raise  # being stopped as well
            log.info("%s/%s was deleted: its turn was stopped before it answered", *key)
        finally:
            del self._answering[key]
            if key in self._called_off:  # the turn swallowed its cancellation (an agent
                self._called_off.discard(key)  # catching it): taken back all the same
                task.uncancel()
