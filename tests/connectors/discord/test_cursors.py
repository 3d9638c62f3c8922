"""The pure record of where each Discord channel was read up to."""

from __future__ import annotations

from talkbridge.connectors.discord.cursors import (
    DAY_MS,
    DISCORD_EPOCH_MS,
    Cursor,
    Cursors,
    after_cursor,
)


def flake(ms: int, n: int = 0) -> int:
    return ((ms - DISCORD_EPOCH_MS) << 22) | n


NOW = 1_760_000_000_000


def test_cursors_only_move_forward_and_survive_a_dump() -> None:
    cursors = Cursors()
    cursors.advance("10", 500, "1")
    cursors.advance("10", 400, None)
    cursors.advance("11", 7, None)
    assert cursors.get("10") == Cursor(500, "1") and cursors.dirty
    cursors.advance("10", 600, None)  # a later message without a guild keeps the guild known
    loaded = Cursors.load(cursors.dump())
    assert loaded.get("10") == Cursor(600, "1") and loaded.get("11") == Cursor(7, None)
    assert not loaded.dirty
    assert loaded.is_new("10", 601) and not loaded.is_new("10", 600) and loaded.is_new("12", 1)


def test_unreadable_stored_cursors_are_left_out() -> None:
    assert Cursors.load("not json").get("1") is None
    loaded = Cursors.load('{"1": ["5", null], "x": ["5", null], "2": [5, null], "3": "5"}')
    assert loaded.get("1") == Cursor(5, None)
    assert [loaded.get(c) for c in ("x", "2", "3")] == [None, None, None]


def test_due_channels_are_the_recent_ones_newest_first_up_to_the_limit() -> None:
    cursors = Cursors()
    cursors.advance("old", flake(NOW - 8 * DAY_MS), None)
    for i in range(5):
        cursors.advance(f"c{i}", flake(NOW - i * 1000), None)
    due = cursors.due(NOW, max_age_days=7, limit=3)
    assert [channel for channel, _ in due] == ["c0", "c1", "c2"]
    assert "old" not in [c for c, _ in cursors.due(NOW, max_age_days=7, limit=50)]


def test_after_cursor_orders_oldest_first_drops_the_seen_and_fills_the_guild() -> None:
    cursor = Cursor(10, "99")
    pages = [
        [{"id": "13", "channel_id": "5"}, {"id": "12", "channel_id": "5"}],
        [{"id": "12", "channel_id": "5"}, {"id": "10"}, {"id": "nope"}, {"id": "14"}],
    ]
    found = after_cursor(pages, cursor, "5")
    assert [m["id"] for m in found] == ["12", "13", "14"]
    assert all(m["guild_id"] == "99" and m["channel_id"] == "5" for m in found)
    assert "guild_id" not in after_cursor([[{"id": "11"}]], Cursor(10, None), "5")[0]
