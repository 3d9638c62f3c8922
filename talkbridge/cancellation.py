"""Keeping cancellation intact in loops that retry on connection errors, and waiting for tasks
to end."""

from __future__ import annotations

import asyncio
from typing import Any


def raise_if_cancelling() -> None:
    """Re-raise a cancellation that a client library turned into another error.

    redis-py may answer a cancellation in the middle of a command with a connection error; a
    loop that retries on those errors would then swallow the cancel and never stop (a shutdown
    that waits for it hangs). Call this first in such a handler.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def cancel_and_wait(*tasks: asyncio.Task[Any], again_after: float = 0.25) -> None:
    """Cancel `tasks` and wait until every one has ended, whatever it raised.

    A cancel can be lost inside a client library (redis-py's read timeouts race it), leaving a
    loop that goes round again; so a task still running after `again_after` seconds is
    cancelled again, until it ends.
    """
    pending = {t for t in tasks if not t.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=again_after)
    for task in tasks:
        if not task.cancelled():
            task.exception()  # retrieved: the caller stops them, it does not want their errors


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
