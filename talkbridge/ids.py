"""Ids that are unique across processes and restarts without a syscall each."""

from __future__ import annotations

import itertools
import secrets

_PREFIX = secrets.token_hex(6)
_numbers = itertools.count(1)


def unique_id() -> str:
    """A random per-process prefix and a counter: unlike uuid4, no os.urandom per id."""
    return f"{_PREFIX}-{next(_numbers):x}"
