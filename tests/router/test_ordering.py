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
