"""KeyedSerialExecutor: order per key, bounded concurrency, claims that hand work on."""

from __future__ import annotations

import asyncio

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


async def test_a_gated_item_holds_no_worker_and_runs_when_its_gate_opens() -> None:
    seen: list[str] = []
    handled = {"a1": asyncio.Event(), "b1": asyncio.Event()}

    async def handle(key: str, item: str) -> None:
        seen.append(item)
        handled[item].set()

    gate: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    executor: KeyedSerialExecutor[str, str] = KeyedSerialExecutor(handle, max_active=1)
    await executor.submit("a", "a1", gate)
    await executor.submit("b", "b1")  # the only worker is free for it: "a" waits parked
    await asyncio.wait_for(handled["b1"].wait(), 5)
    assert seen == ["b1"]
    gate.set_result(True)
    await asyncio.wait_for(handled["a1"].wait(), 5)
    assert seen == ["b1", "a1"]
    await asyncio.wait_for(executor.join(), 5)
    await executor.cancel()


async def test_gates_opening_out_of_order_keep_the_keys_order() -> None:
    seen: list[str] = []
    other_done = asyncio.Event()

    async def handle(key: str, item: str) -> None:
        seen.append(item)
        if key == "other":
            other_done.set()

    loop = asyncio.get_running_loop()
    gates: list[asyncio.Future[bool]] = [loop.create_future() for _ in range(3)]
    executor: KeyedSerialExecutor[str, str] = KeyedSerialExecutor(handle, max_active=2)
    for item, gate in enumerate(gates):
        await executor.submit("t", f"t{item}", gate)
    gates[2].set_result(True)
    gates[1].cancel()  # an abandoned delivery still opens its gate: the handler decides
    await executor.submit("other", "o")  # by the time it is handled, "t" had its chance
    await asyncio.wait_for(other_done.wait(), 5)
    assert seen == ["o"]  # the first item's gate is still shut, so nothing of "t" ran
    gates[0].set_result(True)
    await asyncio.wait_for(executor.join(), 5)
    assert seen == ["o", "t0", "t1", "t2"]
    await executor.cancel()


async def test_a_gate_reported_open_at_once_still_releases_its_key_only_once() -> None:
    seen: list[str] = []
    inside = 0
    most = 0

    async def handle(key: str, item: str) -> None:
        nonlocal inside, most
        inside += 1
        most = max(most, inside)
        await asyncio.sleep(0)  # a second worker on the same key would overlap here
        seen.append(item)
        inside -= 1

    gate: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    executor: KeyedSerialExecutor[str, str] = KeyedSerialExecutor(handle)
    await executor.submit("t", "t0", gate)
    await executor.submit("t", "t1")
    gate.set_result(True)
    executor.opened("t", gate)  # as the router does; the gate's own callback comes later
    await asyncio.wait_for(executor.join(), 5)
    assert seen == ["t0", "t1"] and most == 1
    await executor.cancel()


async def test_a_gate_reported_open_before_it_is_resolved_still_holds_its_item() -> None:
    seen: list[str] = []
    first_done = asyncio.Event()

    async def handle(key: str, item: str) -> None:
        seen.append(item)
        if item == "o":
            first_done.set()

    gate: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    executor: KeyedSerialExecutor[str, str] = KeyedSerialExecutor(handle)
    await executor.submit("t", "t0", gate)
    executor.opened("t", gate)  # too early: a worker that looks now must park it again
    await executor.submit("other", "o")
    await asyncio.wait_for(first_done.wait(), 5)  # the workers have run meanwhile
    assert seen == ["o"]
    gate.set_result(True)
    await asyncio.wait_for(executor.join(), 5)
    assert seen == ["o", "t0"]
    await executor.cancel()
