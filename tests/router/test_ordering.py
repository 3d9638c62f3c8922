"""KeyedSerialExecutor: order per key, bounded concurrency, claims that hand work on."""

from __future__ import annotations

import asyncio

import pytest

from talkbridge.router.ordering import KeyedSerialExecutor


async def test_a_key_queued_behind_a_claim_runs_when_the_claim_is_released() -> None:
    seen: list[tuple[str, int]] = []

    async def handle(key: str, item: int) -> None:
        seen.append((key, item))

    executor: KeyedSerialExecutor[str, int] = KeyedSerialExecutor(handle, max_active=1)
    assert executor.try_claim("a")  # the only slot, held by a caller
    await executor.submit("b", 1)  # ready, but no slot free
    await executor.submit("a", 2)  # behind the claim
    assert seen == []
    executor.release_claim("a")
    await asyncio.wait_for(executor.join(), 5)
    assert sorted(seen) == [("a", 2), ("b", 1)]
    await executor.cancel()


async def test_order_per_key_and_the_concurrency_bound_hold() -> None:
    running = 0
    most = 0
    seen: dict[str, list[int]] = {}

    async def handle(key: str, item: int) -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0)
        seen.setdefault(key, []).append(item)
        running -= 1

    executor: KeyedSerialExecutor[str, int] = KeyedSerialExecutor(handle, max_active=3)
    for item in range(20):
        for key in "abcdef":
            await executor.submit(key, item)
    await asyncio.wait_for(executor.join(), 5)
    assert seen == {key: list(range(20)) for key in "abcdef"}
    assert most == 3
    await executor.cancel()


class _Recorder:
    """A handler that records what it handled and signals each item; the `hold` item waits
    inside the handler until `release` is set (so a second worker on its key would show)."""

    def __init__(self, hold: str | None = None) -> None:
        self.seen: list[str] = []
        self.inside: dict[str, int] = {}
        self.most = 0
        """The most handlers ever running at once for one key: 1 unless a key ran twice."""
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self._hold = hold
        self._done: dict[str, asyncio.Event] = {}

    def done(self, item: str) -> asyncio.Event:
        return self._done.setdefault(item, asyncio.Event())

    async def __call__(self, key: str, item: str) -> None:
        self.inside[key] = self.inside.get(key, 0) + 1
        self.most = max(self.most, self.inside[key])
        try:
            if item == self._hold:
                self.entered.set()
                await self.release.wait()
            self.seen.append(item)
        finally:
            self.inside[key] -= 1
        self.done(item).set()


async def _handled(recorder: _Recorder, item: str) -> None:
    await asyncio.wait_for(recorder.done(item).wait(), 5)


async def test_a_gated_item_holds_no_worker_and_runs_when_its_gate_opens() -> None:
    record = _Recorder()
    gate: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    executor: KeyedSerialExecutor[str, str] = KeyedSerialExecutor(record, max_active=1)
    await executor.submit("a", "a1", gate)
    await executor.submit("b", "b1")  # the only worker is free for it: "a" waits parked
    await _handled(record, "b1")
    assert record.seen == ["b1"]
    gate.set_result(True)
    await _handled(record, "a1")
    assert record.seen == ["b1", "a1"]
    await asyncio.wait_for(executor.join(), 5)
    await executor.cancel()


async def test_gates_opening_out_of_order_keep_the_keys_order() -> None:
    record = _Recorder()
    loop = asyncio.get_running_loop()
    gates: list[asyncio.Future[bool]] = [loop.create_future() for _ in range(3)]
    executor: KeyedSerialExecutor[str, str] = KeyedSerialExecutor(record, max_active=2)
    for item, gate in enumerate(gates):
        await executor.submit("t", f"t{item}", gate)
    gates[2].set_result(True)
    gates[1].cancel()  # an abandoned delivery still opens its gate: the handler decides
    await executor.submit("other", "o")  # by the time it is handled, "t" had its chance
    await _handled(record, "o")
    assert record.seen == ["o"]  # the first item's gate is still shut, so nothing of "t" ran
    gates[0].set_result(True)
    await asyncio.wait_for(executor.join(), 5)
    assert record.seen == ["o", "t0", "t1", "t2"]
    await executor.cancel()


async def test_a_gate_reported_open_at_once_still_releases_its_key_only_once() -> None:
    record = _Recorder(hold="t0")
    gate: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    executor: KeyedSerialExecutor[str, str] = KeyedSerialExecutor(record)
    await executor.submit("t", "t0", gate)
    await executor.submit("t", "t1")
    gate.set_result(True)
    executor.opened("t", gate)  # as the router does; the gate's own callback comes later
    await asyncio.wait_for(record.entered.wait(), 5)
    await executor.submit("other", "o")  # by the time it is handled, a second worker on "t"
    await _handled(record, "o")  # (released twice) would be inside "t0" too
    record.release.set()
    await asyncio.wait_for(executor.join(), 5)
    assert [i for i in record.seen if i != "o"] == ["t0", "t1"] and record.most == 1
    await executor.cancel()


async def test_a_gate_reported_open_before_it_is_resolved_still_holds_its_item() -> None:
    record = _Recorder()
    gate: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    executor: KeyedSerialExecutor[str, str] = KeyedSerialExecutor(record)
    await executor.submit("t", "t0", gate)
    executor.opened("t", gate)  # too early: a worker that looks now must park it again
    await executor.submit("other", "o")
    await _handled(record, "o")  # the workers have run meanwhile
    assert record.seen == ["o"]
    gate.set_result(True)
    await asyncio.wait_for(executor.join(), 5)
    assert record.seen == ["o", "t0"]
    await executor.cancel()


async def test_handlers_that_never_suspend_share_one_worker() -> None:
    ran: list[int] = []

    async def handle(key: int, item: int) -> None:
        ran.append(key)

    executor: KeyedSerialExecutor[int, int] = KeyedSerialExecutor(
        handle, max_active=64, name="shared"
    )
    for key in range(50):
        await executor.submit(key, key)
    started = [t for t in asyncio.all_tasks() if t.get_name() == "shared-worker"]
    assert len(started) == 1  # one on its way takes them all, not one woken per key
    await asyncio.wait_for(executor.join(), 5)
    assert ran == list(range(50))
    await executor.cancel()


async def test_a_handler_that_suspends_does_not_hold_up_the_keys_behind_it() -> None:
    """Key "a" waits for something only key "b"'s handler does: with the worker on "a" and no
    other taking "b", this would never finish."""
    b_ran = asyncio.Event()

    async def handle(key: str, item: int) -> None:
        if key == "a":
            await b_ran.wait()
        else:
            b_ran.set()

    executor: KeyedSerialExecutor[str, int] = KeyedSerialExecutor(handle, max_active=8)
    await executor.submit("a", 1)
    await executor.submit("b", 2)
    await asyncio.wait_for(executor.join(), 5)
    await executor.cancel()


async def test_has_room_says_whether_submit_would_wait() -> None:
    release = asyncio.Event()

    async def handle(key: str, item: int) -> None:
        await release.wait()

    executor: KeyedSerialExecutor[str, int] = KeyedSerialExecutor(handle, max_pending=1)
    assert executor.has_room
    executor.put("a", 1)  # room: queued at once
    assert not executor.has_room  # in hand still counts until handled
    with pytest.raises(RuntimeError, match="no room"):
        executor.put("c", 3)
    waiting = asyncio.create_task(executor.submit("b", 2))
    release.set()
    await asyncio.wait_for(waiting, 5)
    await asyncio.wait_for(executor.join(), 5)
    assert executor.has_room
    await executor.cancel()


async def test_submits_waiting_for_room_keep_their_order_when_a_newcomer_arrives() -> None:
    """A slot freed for the first waiter is not taken by a submit that came later: otherwise the
    waiter queues again behind the others, and one thread's messages swap places."""
    release, a_started = asyncio.Event(), asyncio.Event()
    handled: list[str] = []
    late: list[asyncio.Task[None]] = []

    async def handle(key: str, item: str) -> None:
        handled.append(item)
        if item == "A":
            a_started.set()
            await release.wait()
            # A newcomer (another connection's delivery) starts before the first waiter runs.
            late.append(asyncio.create_task(executor.submit("x", "newcomer")))

    executor: KeyedSerialExecutor[str, str] = KeyedSerialExecutor(handle, max_pending=1)
    await executor.submit("a", "A")
    waiting = [asyncio.create_task(executor.submit("t", item)) for item in ("t1", "t2")]
    await a_started.wait()  # by now both submits wait for room
    release.set()
    await asyncio.wait_for(asyncio.gather(*waiting), 5)
    await asyncio.wait_for(asyncio.gather(*late), 5)
    await asyncio.wait_for(executor.join(), 5)
    assert [h for h in handled if h.startswith("t")] == ["t1", "t2"]
    assert handled[-1] == "newcomer"
    await executor.cancel()


async def test_a_submit_cancelled_after_it_was_given_room_passes_the_room_on() -> None:
    release, a_started, a_done = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def handle(key: str, item: str) -> None:
        if item == "A":
            a_started.set()
            await release.wait()
            a_done.set()  # wakes the test before the waiter that A's slot is handed to

    executor: KeyedSerialExecutor[str, str] = KeyedSerialExecutor(handle, max_pending=1)
    await executor.submit("a", "A")
    given_up = asyncio.create_task(executor.submit("b", "B"))
    await a_started.wait()  # by now B waits for room
    release.set()
    await a_done.wait()
    given_up.cancel()  # it has the slot by now, but has not run since
    with pytest.raises(asyncio.CancelledError):
        await given_up
    await asyncio.wait_for(executor.submit("c", "C"), 5)  # the slot was not lost with it
    await asyncio.wait_for(executor.join(), 5)
    assert executor.has_room
    await executor.cancel()
