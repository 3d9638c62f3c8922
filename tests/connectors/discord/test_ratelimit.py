"""The global-limit bookkeeping of the Discord connector, on a fake clock."""

from __future__ import annotations

import pytest

from talkbridge.connectors.discord.ratelimit import GlobalLimit

GLOBAL = {"Retry-After": "46", "X-RateLimit-Global": "true", "X-RateLimit-Scope": "global"}


def test_only_a_global_429_longer_than_discord_py_waits_out_pauses_the_bot() -> None:
    now = [100.0]
    limit = GlobalLimit(30.0, clock=lambda: now[0])
    limit.answered(429, {"Retry-After": "46", "X-RateLimit-Scope": "user"})  # one route's
    limit.answered(429, {**GLOBAL, "Retry-After": "20"})  # discord.py holds its client for it
    limit.answered(200, GLOBAL)
    assert limit.left() == 0
    limit.answered(429, {"Retry-After": "46", "X-RateLimit-Scope": "global"})
    assert limit.left() == 46
    limit.hit(45.2)  # the body's exact wait never shortens a longer one
    now[0] += 45.5
    assert limit.left() == pytest.approx(0.5)
    now[0] += 0.5
    assert limit.left() == 0
