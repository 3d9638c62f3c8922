"""Keeping cancellation intact in loops that retry on connection errors, and waiting for tasks
to end."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Any, TypeVar

_T = TypeVar("_T")


def raise_if_cancelling() -> None:
    """Re-raise a cancellation that a client library turned into another error.

    redis-py may answer a cancellation in the middle of a command with a connection error; a
    loop that retries on those errors would then swallow the cancel and never stop (a shutdown
    that waits for it hangs). Call this first in such a handler.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def cancelling() -> bool:
    """Whether the running task is being cancelled.

    A `CancelledError` raised while it is not came from user code (a hook or an agent awaiting
    a task that something else cancelled): that code's failure, to handle like any other error.
    Re-raising it as a cancellation would end the task handling a conversation, which then
    stalls for good.
    """
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


async def cancel_and_wait(
    *tasks: asyncio.Task[Any], again_after: float = 0.25, within: float | None = None
) -> int:
    """Cancel `tasks` and wait until every one has ended, whatever it raised.

    A cancel can be lost inside a client library (redis-py's read timeouts race it), leaving a
    loop that goes round again; so a task still running after `again_after` seconds is
    cancelled again, until it ends. With `within`, it gives up after that many seconds: a task
    that swallows every cancel (a user's agent catching `BaseException`) is left running rather
    than hanging the caller. Returns how many were left so (0 without `within`).
    """
    loop = asyncio.get_running_loop()
    deadline = None if within is None else loop.time() + within
    pending = {t for t in tasks if not t.done()}
    while pending:
        for task in pending:
            task.cancel()
        wait = again_after if deadline is None else min(again_after, deadline - loop.time())
        if wait <= 0:
            break
        _, pending = await asyncio.wait(pending, timeout=wait)
    for task in tasks:
        if task.done() and not task.cancelled():
            task.exception()  # retrieved: the caller stops them, it does not want their errors
    return len(pending)


async def drain_tasks(tasks: set[asyncio.Task[Any]]) -> None:
    """Wait until `tasks` is empty, tasks added meanwhile included.

    For a set its tasks leave by a done callback (`task.add_done_callback(tasks.discard)`).
    Finished tasks are also taken out here: since Python 3.12 gathering tasks that are all done
    returns without yielding to the loop, so a loop waiting for the callbacks to empty the set
    never let them run, and spun forever (a hung shutdown).
    """
    while tasks:
        await asyncio.gather(*tasks, return_exceptions=True)
        tasks.difference_update([task for task in tasks if task.done()])


async def finish_despite_cancels(task: asyncio.Future[Any], seconds: float) -> bool:
    """Wait up to `seconds` for `task` to end, through cancels of the caller meanwhile.

    For cleanup that must not be cut short: a stopping bridge cancels a connection's task again
    and again (`cancel_and_wait`), and work its `finally` still has to do would be lost. The
    caller's cancellation stands once this returns. True if the task ended in time.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not task.done() and (left := deadline - loop.time()) > 0:
        try:
            await asyncio.wait([task], timeout=left)
        except asyncio.CancelledError:
            continue
    return task.done()


async def in_daemon_thread(work: Callable[[], _T], name: str) -> _T:
    """`work()` in a daemon thread of its own, awaited without holding the event loop.

    For work that cannot be interrupted and must not hold up a stop: importing an SDK (seconds
    for aiogram). `asyncio.to_thread` runs it on the default executor, whose threads the loop's
    and the interpreter's shutdown wait for: a Ctrl-C during the import waited for it to
    end. Cancelled, this returns at once; the thread runs on unwaited for, and its result is
    dropped (the process may exit under it)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[_T] = loop.create_future()

    def settle(result: _T | None, error: BaseException | None) -> None:
        if done.done():  # cancelled: nobody waits for it
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(result)  # type: ignore[arg-type]

    def run() -> None:
        result: _T | None = None
        error: BaseException | None = None
        try:
            result = work()
        except BaseException as exc:  # any error is its awaiter's to see
            error = exc
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody awaits it now
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=run, name=name, daemon=True).start()
    return await done
