"""Awaiting a log line, without sleeping: for what a component says but shows nowhere else."""

from __future__ import annotations

import asyncio
import logging
from types import TracebackType

from tests.support.waiting import Waitable


class LogWatch(Waitable, logging.Handler):
    """`with LogWatch("logger") as logs: ... await logs.said("words")`: the messages logged
    (at `level` and above) under that logger while the block runs."""

    def __init__(self, logger: str, level: int = logging.DEBUG) -> None:
        logging.Handler.__init__(self, level)
        self._changed = asyncio.Event()
        self._logger = logging.getLogger(logger)
        self._old_level = self._logger.level
        self._wanted = level
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())
        self._notify()

    async def said(self, words: str, timeout: float | None = None) -> str:
        """The first message containing `words`, once logged."""
        await self.wait_for(lambda: any(words in m for m in self.messages), timeout)
        return next(m for m in self.messages if words in m)

    def __enter__(self) -> LogWatch:
        self._logger.addHandler(self)
        if self._logger.getEffectiveLevel() > self._wanted:
            self._logger.setLevel(self._wanted)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._logger.removeHandler(self)
        self._logger.setLevel(self._old_level)
