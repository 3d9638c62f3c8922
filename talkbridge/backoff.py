"""Capped exponential backoff with full jitter, shared by reconnects and send retries."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

STABLE_AFTER = 30.0
"""Seconds a connection must stay up before its backoff starts from the beginning again: one
that comes up and fails at once, again and again, must not be retried at the first delay."""


@dataclass(slots=True)
class Backoff:
    """`next()` gives the delay before the next attempt; `reset()` after a success.

    Full jitter (a uniform draw below the exponential cap) keeps many clients that failed
    together from retrying together.
    """

    base: float = 0.5
    cap: float = 60.0
    factor: float = 2.0
    attempts: int = 0
    rng: random.Random = field(default_factory=random.Random)

    def ceiling(self) -> float:
        return float(min(self.cap, self.base * self.factor**self.attempts))

    def next(self) -> float:
        ceiling = self.ceiling()
        self.attempts += 1
        return self.rng.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        self.attempts = 0
