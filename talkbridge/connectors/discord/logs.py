"""discord.py's gateway retries, logged in one line each instead of a traceback.

`Client.connect` logs every failed gateway connection with `logger.exception("Attempting a
reconnect in %.2fs")`: some thirty lines of traceback per retry, through an outage of
minutes, where the operator needs one line saying what failed. A filter on its logger rewrites
that record in place; discord.py itself is left as it is. The same filter drops its warnings
that voice is not supported (PyNaCl, davey missing): talkbridge never uses voice, and a warning
at every start made operators look for a fault.
"""

from __future__ import annotations

import logging

_RETRY = "Attempting a reconnect in %.2fs"
_LINE = 300
"""At most this many characters of the failure: an HTTP error can carry a whole page."""


def one_line(exc: BaseException) -> str:
    """`Kind: first line of the message`, cut to `_LINE` characters."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    line = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return line if len(line) <= _LINE else line[: _LINE - 1] + "…"


class _OneLineRetries(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and record.msg.endswith("voice will NOT be supported"):
            return False
        failure = record.exc_info[1] if record.exc_info else None
        if record.msg == _RETRY and failure is not None:
            record.msg = "Discord gateway: could not connect (%s); retrying in %.1f s"
            args = record.args if isinstance(record.args, tuple) else ()
            record.args = (one_line(failure), *args)
            record.exc_info = record.exc_text = None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


_FILTER = _OneLineRetries()


def install() -> None:
    """Put the filter on discord.py's client logger (once per process)."""
    logger = logging.getLogger("discord.client")
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)
