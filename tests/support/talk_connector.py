"""A connector that speaks only `Talk`: what tests use to drive the whole path in-process.

`inject()` plays the platform sending us a message; `sent` records what the bridge sent, and
`script` makes the next sends fail the way real platforms do (429, 5xx, revoked token).
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from talkbridge.message import NormalizedMessage, OutboundMessage, SendResult
from talkbridge.talk import MessageHandler, Subscription

_ids = itertools.count(1)


def make_message(
    text: str = "hello",
    *,
    connection_id: str = "test",
    thread_id: str = "t1",
    user: str = "alice",
    message_id: str | None = None,
    **extra: Any,
) -> NormalizedMessage:
    return NormalizedMessage(
        id=message_id or f"m{next(_ids)}",
        connection_id=connection_id,
        channel="webchat" if connection_id == "webchat" else extra.pop("channel", "telegram"),
        channel_user_id=user,
        display_name=user.title(),
        thread_id=thread_id,
        timestamp=datetime.now(UTC),
        text=text,
        **extra,
    )


@dataclass
class Sent:
    message: OutboundMessage
    ids: tuple[str, ...]


class TalkConnector:
    """Implements `Talk` and nothing else."""

    def __init__(self, connection_id: str = "test", channel: str = "telegram") -> None:
        self.connection_id = connection_id
        self.channel = channel
        self._handlers: list[MessageHandler] = []
        self.sent: list[Sent] = []
        self.attempts = 0
        self.script: deque[BaseException | Callable[[], Any]] = deque()
        self.features: dict[str, Any] = {}
        self.sent_event = asyncio.Event()
        self.attempted = asyncio.Event()
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []

    def subscribe(self, handler: MessageHandler) -> Subscription:
        self._handlers.append(handler)
        return Subscription(lambda: self._handlers.remove(handler))

    async def inject(self, message: NormalizedMessage) -> None:
        for handler in list(self._handlers):
            await handler(message)

    async def send(self, message: OutboundMessage) -> SendResult:
        self.attempts += 1
        self.attempted.set()
        if self.script:
            step = self.script.popleft()
            if isinstance(step, BaseException):
                raise step
            result = step()
            if asyncio.iscoroutine(result):
                await result
        ids = (f"{self.connection_id}-out-{len(self.sent) + 1}",)
        self.sent.append(Sent(message, ids))
        self.sent_event.set()
        for count, future in list(self._waiters):
            if len(self.sent) >= count and not future.done():
                future.set_result(None)
        return SendResult(message_ids=ids)

    async def wait_sent(self, count: int, timeout: float = 10.0) -> list[Sent]:
        """Wait until at least `count` messages were sent (an event, not a sleep)."""
        if len(self.sent) < count:
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append((count, future))
            async with asyncio.timeout(timeout):
                await future
        return self.sent

    def feature(self, name: str) -> Any:
        return self.features.get(name)

    def texts(self) -> list[str]:
        return [s.message.text for s in self.sent]
