"""A cancellation a client library turns into a connection error still stops a retry loop."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from talkbridge.cancellation import (
    cancel_and_wait,
    drain_tasks,
    finish_despite_cancels,
    in_daemon_thread,
    raise_if_cancelling,
)


async def test_a_retry_loop_stops_when_cancelled_mid_command() -> None:
    started = asyncio.Event()
    attempts = 0

    async def command() -> None:  # like redis-py: a cancel mid-command surfaces as this
        nonlocal attempts
        attempts += 1
        if attempts > 1:
            raise ConnectionError("still down")
        started.set()
        try:
            await asyncio.Future()
        except asyncio.CancelledError:
            raise ConnectionError("connection lost") from None

    async def retry_loop() -> str:
        for _ in range(3):  # bounded, so a lost cancel shows as a normal return, not a hang
            try:
                await command()
            except OSError:
                raise_if_cancelling()
        return "gave up"

    task = asyncio.create_task(retry_loop())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert attempts == 1


async def test_cancel_and_wait_cancels_again_when_a_cancel_was_lost() -> None:
    swallowed = asyncio.Event()
    waiting = asyncio.Event()

    async def loses_one_cancel() -> None:
        waiting.set()
        try:
            await asyncio.Future()
        except asyncio.CancelledError:  # as a library racing its own timeout may do
            swallowed.set()
        await asyncio.Future()  # the next cancel ends it

    async def fails() -> None:
        raise RuntimeError("already broken")

    stubborn = asyncio.create_task(loses_one_cancel())
    broken = asyncio.create_task(fails())
    await waiting.wait()
    await asyncio.wait([broken])  # it has failed already: cancel_and_wait must not raise it
    await asyncio.wait_for(cancel_and_wait(stubborn, broken, again_after=0.01), 5)
    assert swallowed.is_set() and stubborn.cancelled()
    assert isinstance(broken.exception(), RuntimeError)  # ended; its error was not raised here


async def test_drain_tasks_returns_once_every_task_ended_even_ones_started_meanwhile() -> None:
    tasks: set[asyncio.Task[None]] = set()
    release = asyncio.Event()
    ended: list[str] = []
    draining: asyncio.Task[None] | None = None
    drain_waited_for_slow: list[bool] = []

    def start(name: str, coro: Any) -> asyncio.Task[None]:
        task = asyncio.create_task(coro, name=name)
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        return task

    async def quick() -> None:
        ended.append("quick")

    async def failing() -> None:
        raise RuntimeError("a background failure is not the drainer's")

    async def slow() -> None:
        await release.wait()
        assert draining is not None
        drain_waited_for_slow.append(not draining.done())  # slow holds it
        start("late", quick())  # started while the drain waits: waited for too
        ended.append("slow")

    done_first = [start("quick", quick()), start("failing", failing())]
    start("slow", slow())
    await asyncio.wait(done_first)  # done; their callbacks may not have run yet
    draining = asyncio.create_task(drain_tasks(tasks))
    release.set()
    await asyncio.wait_for(draining, 5)
    assert drain_waited_for_slow == [True]
    assert not tasks and sorted(ended) == ["quick", "quick", "slow"]


async def test_drain_tasks_with_only_finished_tasks_left_returns() -> None:
    """Since Python 3.12 gathering finished tasks does not yield: the set must still empty."""
    tasks: set[asyncio.Task[None]] = set()

    async def nothing() -> None:
        return None

    task = asyncio.create_task(nothing())
    await task
    tasks.add(task)
    task.add_done_callback(tasks.discard)  # scheduled, not yet run
    await drain_tasks(tasks)
    assert not tasks


async def test_cleanup_finishes_through_the_repeated_cancels_of_a_stop() -> None:
    running, cleaning, release = asyncio.Event(), asyncio.Event(), asyncio.Event()
    cleaned: list[str] = []

    async def cleanup() -> None:
        cleaning.set()  # the connection's finally is waiting on this
        await release.wait()  # events still to hand over, a socket still closing
        cleaned.append("done")

    async def connection() -> None:
        try:
            running.set()
            await asyncio.Event().wait()
        finally:
            await finish_despite_cancels(asyncio.ensure_future(cleanup()), 10)

    task = asyncio.create_task(connection())
    await running.wait()
    task.cancel()
    await cleaning.wait()
    task.cancel()  # as cancel_and_wait does, again and again: each reaches the waiting
    task.cancel()  # connection before the cleanup can end (both are woken in this order)
    release.set()
    with pytest.raises(asyncio.CancelledError):  # the cancel still stands afterwards
        await task
    assert cleaned == ["done"]


async def test_work_in_a_daemon_thread_gives_its_result_and_a_cancel_does_not_wait_for_it() -> None:
    """An SDK's import (`build_pending`): its result or error comes back to the awaiter, and a
    stop cancels the wait at once, the thread, which nothing can interrupt, left to itself
    (a daemon: the process may exit under it)."""
    assert await in_daemon_thread(lambda: 42, "answer") == 42
    with pytest.raises(ModuleNotFoundError, match="gone"):
        await in_daemon_thread(lambda: __import__("gone"), "missing")

    entered, release = threading.Event(), threading.Event()
    threads: list[threading.Thread] = []

    def stuck() -> None:
        threads.append(threading.current_thread())
        entered.set()
        release.wait()

    waiting = asyncio.ensure_future(in_daemon_thread(stuck, "stuck"))
    await asyncio.to_thread(entered.wait)
    await cancel_and_wait(waiting)  # returns although the work goes on
    assert waiting.cancelled()
    assert threads[0].daemon and threads[0].is_alive()
    release.set()
    threads[0].join()
