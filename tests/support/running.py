"""A connector under test, run as the registry runs it: a recording status, an inbox, a clean stop.

`Starter` is what each connector's `start` fixture hands tests: `await start(**config)` builds a
connector, subscribes an `Inbox`, runs it with a `Status` and (by default) waits until it is up;
every connector it started is stopped when the test ends.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from talkbridge.connectors.base import ConnectionStatus
from talkbridge.message import NormalizedMessage
from tests.support.waiting import Waitable


class Status(Waitable):
    """The `ConnectionStatus` a registry would pass, recording every report."""

    def __init__(self) -> None:
        self.reports: list[tuple[str, str]] = []
        self._changed = asyncio.Event()

    def up(self) -> None:
        self.reports.append(("up", ""))
        self._notify()

    def degraded(self, reason: str) -> None:
        self.reports.append(("degraded", reason))
        self._notify()

    def count(self, kind: str) -> int:
        return sum(1 for k, _ in self.reports if k == kind)

    def ups(self) -> int:
        return self.count("up")

    async def wait(self, condition: Callable[[], bool], timeout: float | None = None) -> None:
        await self.wait_for(condition, timeout)

    async def wait_up(self, times: int = 1) -> None:
        await self.wait(lambda: self.ups() >= times)


@dataclass
class Inbox(Waitable):
    """A subscriber recording what it was handed; `fail_on` makes it refuse a message id once."""

    messages: list[NormalizedMessage] = field(default_factory=list)
    deletions: list[Any] = field(default_factory=list)
    fail_on: set[str] = field(default_factory=set)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    def refusal_key(self, message: NormalizedMessage) -> str:
        """What `fail_on` is matched against."""
        return message.id

    async def __call__(self, message: NormalizedMessage) -> None:
        key = self.refusal_key(message)
        if key in self.fail_on:
            self.fail_on.discard(key)
            raise RuntimeError(f"store unavailable while accepting {message.id}")
        self.messages.append(message)
        self._notify()

    async def deleted(self, deletion: Any) -> None:
        self.deletions.append(deletion)
        self._notify()

    async def wait(self, condition: Callable[[], bool], timeout: float | None = None) -> None:
        await self.wait_for(condition, timeout)

    async def wait_count(self, count: int, timeout: float | None = None) -> list[NormalizedMessage]:
        await self.wait(lambda: len(self.messages) >= count, timeout)
        return self.messages

    @property
    def texts(self) -> list[str]:
        return [m.text for m in self.messages]


class Connector(Protocol):
    def subscribe(self, handler: Any) -> Any: ...
    async def run(self, status: ConnectionStatus) -> None: ...
    async def close(self) -> None: ...


C = TypeVar("C", bound=Connector)


@dataclass
class Running(Generic[C]):
    connector: C
    status: Status
    inbox: Inbox
    task: asyncio.Task[None]

    async def stop(self) -> BaseException | None:
        """Cancel `run` (as the registry does) and close; returns what `run` raised, if anything."""
        error: BaseException | None = None
        if not self.task.done():
            self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            try:
                await self.task
            except Exception as exc:
                error = exc
        await self.connector.close()
        return error


class Starter(Generic[C]):
    """`await starter(inbox=None, wait=True, **config)`: a running connector; `stop_all()` after."""

    def __init__(
        self,
        make: Callable[..., C],
        *,
        running: Callable[[C, Status, Inbox, asyncio.Task[None]], Running[C]] = Running,
        inbox: Callable[[], Inbox] = Inbox,
        attach: Callable[[C, Inbox], None] | None = None,
        wait: bool = True,
    ) -> None:
        """`attach(connector, inbox)` wires more than `subscribe`; `wait=False`: do not wait up."""
        self.make = make
        self.running = running
        self.new_inbox = inbox
        self.attach = attach
        self.wait = wait
        self.started: list[Running[C]] = []

    async def __call__(
        self, inbox: Inbox | None = None, wait: bool | None = None, **overrides: Any
    ) -> Running[C]:
        connector = self.make(**overrides)
        status = Status()
        inbox = inbox if inbox is not None else self.new_inbox()
        connector.subscribe(inbox)
        if self.attach is not None:
            self.attach(connector, inbox)
        task = asyncio.create_task(connector.run(status))
        handle = self.running(connector, status, inbox, task)
        self.started.append(handle)
        if self.wait if wait is None else wait:
            up = asyncio.create_task(status.wait_up())
            await asyncio.wait({up, task}, return_when=asyncio.FIRST_COMPLETED)
            if task.done():
                up.cancel()
                task.result()  # raises what run raised
            await up
        return handle

    async def stop_all(self) -> None:
        for handle in self.started:
            await handle.stop()
