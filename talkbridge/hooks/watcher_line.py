"""One turn watcher's events, delivered in order per conversation without holding up turns.

A watcher that awaits something in `on_turn_started` must not get the same turn's `finished`
(or the next turn's events) before it returns: each conversation's events wait in line for
that watcher. Different conversations, and different watchers, still run concurrently. The
line is bounded: a watcher too slow for the traffic has events dropped (said once, naming the
watcher's code, and again when it has caught up; the count since the start is in /healthz),
never the turns it watches slowed down. A watcher of both events gets whole turns: a turn's
`finished` follows its `started` in (past the bound, as it is one per turn under way) or out.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Final

from talkbridge.hooks.calls import hook_code

log = logging.getLogger("talkbridge.hooks")

MAX_BEHIND: Final = 1000
"""Events one watcher may have waiting (all conversations together) before new ones are
dropped."""

STARTED: Final = "agent-turn-started"

Deliver = Callable[[str, str, Callable[[Any], Any], Any], Awaitable[None]]
"""`deliver(kind, name, fn, event)`: one call of the watcher, its errors handled there."""


class WatcherLine:
    """The events waiting for one watcher, a line per conversation, each drained by a task of
    its own that ends when its line is empty."""

    def __init__(
        self, name: str, deliver: Deliver, tasks: set[asyncio.Task[None]], *, max_behind: int
    ) -> None:
        self.name = name
        self._deliver = deliver
        self._tasks = tasks
        """Shared with the other watchers: what a stop waits for, or cancels."""
        self._max_behind = max_behind
        self._lines: dict[str, deque[tuple[str, Callable[[Any], Any], Any]]] = {}
        self._waiting = 0
        self._dropped = 0
        """Dropped since the watcher fell behind (told when it has caught up)."""
        self.dropped_total = 0
        """Dropped since the start: /healthz shows it."""
        self.paired = False
        """It watches both events: a turn's `finished` goes where its `started` went."""
        self._started_turns: set[str] = set()
        self._dropped_turns: set[str] = set()

    @property
    def behind(self) -> int:
        """Events queued for the watcher and not yet handled."""
        return self._waiting

    def put(
        self, key: str, kind: str, fn: Callable[[Any], Any], event: Any, turn: str = ""
    ) -> None:
        """Queue `event` (of turn `turn`) behind the watcher's earlier events of conversation
        `key`."""
        if self.paired and turn:
            if kind != STARTED:
                if turn in self._dropped_turns:
                    self._dropped_turns.discard(turn)
                    self._drop(kind, fn)
                    return
                if turn in self._started_turns:  # its start is in line: its end follows it
                    self._started_turns.discard(turn)
                    self._queue(key, kind, fn, event)
                    return
            elif self._waiting >= self._max_behind:
                self._dropped_turns.add(turn)
            else:
                self._started_turns.add(turn)
        if self._waiting >= self._max_behind:
            self._drop(kind, fn)
            return
        self._queue(key, kind, fn, event)

    def _drop(self, kind: str, fn: Callable[[Any], Any]) -> None:
        self._dropped += 1
        self.dropped_total += 1
        if self._dropped == 1:
            log.warning(
                "turn watcher %r (%s) is %d events behind: dropping this %s event and the next "
                "ones until it catches up (a watcher should return quickly and start slow work "
                "as a task of its own; /healthz counts the dropped events under watchers)",
                self.name,
                hook_code(fn),
                self._waiting,
                kind,
            )

    def _queue(self, key: str, kind: str, fn: Callable[[Any], Any], event: Any) -> None:
        self._waiting += 1
        line = self._lines.get(key)
        if line is not None:
            line.append((kind, fn, event))
            return
        self._lines[key] = deque([(kind, fn, event)])
        task = asyncio.create_task(self._drain(key), name=f"turn watcher {self.name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _drain(self, key: str) -> None:
        line = self._lines[key]
        try:
            while line:
                kind, fn, event = line[0]
                await self._deliver(kind, self.name, fn, event)
                line.popleft()
                self._waiting -= 1
        finally:  # emptied, or cancelled at a stop: what is left is not delivered
            self._waiting -= len(line)
            del self._lines[key]
            if self._dropped and not self._waiting:
                log.warning(
                    "turn watcher %r caught up; %d events were dropped (%d since the start)",
                    self.name,
                    self._dropped,
                    self.dropped_total,
                )
                self._dropped = 0
