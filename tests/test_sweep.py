"""One timer for many deadlines: entries fall due in order, and one taken out never does."""

from __future__ import annotations

import asyncio

from talkbridge.sweep import DelayedSweep


async def test_entries_fall_due_in_the_order_added_and_popped_ones_never() -> None:
    fired: list[tuple[str, int]] = []
    all_due = asyncio.Event()

    def due(key: str, value: int) -> None:
        fired.append((key, value))
        if key == "c":
            all_due.set()

    sweep: DelayedSweep[str, int] = DelayedSweep(0.01, due)
    sweep.add("a", 1)
    sweep.add("b", 2)
    sweep.add("a", 99)  # already waiting: keeps its place and value
    sweep.add("c", 3)
    assert sweep.get("b") == 2
    assert sweep.pop("b") == 2  # ended before its time: never falls due
    await asyncio.wait_for(all_due.wait(), 5)
    assert fired == [("a", 1), ("c", 3)]
    assert sweep.get("a") is None and sweep.pop("a") is None


async def test_closing_drops_what_waits() -> None:
    fired: list[str] = []
    sweep: DelayedSweep[str, None] = DelayedSweep(0.01, lambda key, _: fired.append(key))
    sweep.add("a", None)
    sweep.close()
    later: DelayedSweep[str, None] = DelayedSweep(0.02, lambda key, _: done.set())
    done = asyncio.Event()
    later.add("marker", None)  # falls due after the closed one would have
    await asyncio.wait_for(done.wait(), 5)
    assert fired == []


async def test_an_entry_added_after_one_was_taken_out_still_falls_due() -> None:
    """The timer made for the first entry is kept and reused: it must not fire the second one
    early, nor forget it."""
    fired: list[str] = []
    done = asyncio.Event()

    def due(key: str, _: None) -> None:
        fired.append(key)
        done.set()

    sweep: DelayedSweep[str, None] = DelayedSweep(0.02, due)
    sweep.add("quick", None)
    sweep.pop("quick")  # a turn that ended at once
    sweep.add("slow", None)
    await asyncio.wait_for(done.wait(), 5)
    assert fired == ["slow"]
