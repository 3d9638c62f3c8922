"""PartialSends: a retried split send resumes after the last step that went out, also when the
retry comes from another process (a restart) over the same store."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta

import pytest

from talkbridge.connectors.sending import PartialSends
from talkbridge.message import OutboundMessage
from talkbridge.store import Store
from tests.store.conftest import Backend


class Boom(Exception):
    pass


def steps(
    calls: list[int], fail_at: int | None = None, ids_per_step: int = 1
) -> Callable[[int], Awaitable[list[str]]]:
    async def step(index: int) -> list[str]:
        calls.append(index)
        if index == fail_at:
            raise Boom
        return [f"m{index}.{n}" for n in range(ids_per_step)]

    return step


async def test_a_retry_with_the_same_key_skips_the_steps_already_done() -> None:
    sends = PartialSends()
    calls: list[int] = []
    with pytest.raises(Boom):
        await sends.run("k", 4, steps(calls, fail_at=2, ids_per_step=2))
    sent = await sends.run("k", 4, steps(calls))
    assert calls == [0, 1, 2, 2, 3]
    assert sent == ["m0.0", "m0.1", "m1.0", "m1.1", "m2.0", "m3.0"]
    assert await sends.run("k", 2, steps(calls)) == ["m0.0", "m1.0"]  # done: forgotten


async def test_without_a_key_every_step_runs_again() -> None:
    sends = PartialSends()
    calls: list[int] = []
    with pytest.raises(Boom):
        await sends.run(None, 3, steps(calls, fail_at=1))
    await sends.run(None, 3, steps(calls))
    assert calls == [0, 1, 0, 1, 2]


async def test_the_oldest_unfinished_key_is_forgotten_past_the_limit() -> None:
    sends = PartialSends(limit=1)
    calls: list[int] = []
    for key in ("a", "b"):
        with pytest.raises(Boom):
            await sends.run(key, 2, steps(calls, fail_at=1))
    calls.clear()
    await sends.run("b", 2, steps(calls))  # kept: resumes at step 1
    await sends.run("a", 2, steps(calls))  # forgotten: starts over
    assert calls == [1, 0, 1]


async def opened(backend: Backend) -> Store:
    store = backend.make()
    await store.open()
    return store


MESSAGE = OutboundMessage(thread_id="t", text="long " * 2000, idempotency_key="reply:7")


async def test_a_retry_after_a_restart_resumes_where_the_send_stopped(backend: Backend) -> None:
    store = await opened(backend)
    calls: list[int] = []
    with pytest.raises(Boom):
        await PartialSends(store, "tg").send(MESSAGE, 4, steps(calls, fail_at=2))
    await store.close()
    store = await opened(backend)  # a new process: nothing in memory
    try:
        sent = await PartialSends(store, "tg").send(MESSAGE, 4, steps(calls))
        assert calls == [0, 1, 2, 2, 3]
        assert sent == ["m0.0", "m1.0", "m2.0", "m3.0"]
        calls.clear()  # done: forgotten, a new send of the key goes out whole
        await PartialSends(store, "tg").send(MESSAGE, 4, steps(calls))
        assert calls == [0, 1, 2, 3]
    finally:
        await store.close()


async def test_progress_is_kept_per_connection_and_for_a_while_only(backend: Backend) -> None:
    store = await opened(backend)
    try:
        calls: list[int] = []
        for connection, fail_at in (("tg", 1), ("old", 1), ("other", None)):
            if connection == "old":  # written two hours ago, kept for one: ran out
                store.wall_clock = lambda: time.time() - 2 * 3600
            with pytest.raises(Boom) if fail_at is not None else contextlib.nullcontext():
                await PartialSends(store, connection, keep_for=timedelta(hours=1)).send(
                    MESSAGE, 3, steps(calls, fail_at=fail_at)
                )
            store.wall_clock = time.time
        assert calls == [0, 1, 0, 1, 0, 1, 2]  # the same key on another connection: another send
        calls.clear()
        await PartialSends(store, "tg").send(MESSAGE, 3, steps(calls))
        await PartialSends(store, "old").send(MESSAGE, 3, steps(calls))
        assert calls == [1, 2, 0, 1, 2]
    finally:
        await store.close()


async def test_a_retry_that_says_something_else_is_sent_in_full(backend: Backend) -> None:
    """A turn run again after a restart may answer otherwise: the rest of the earlier answer
    would make no sense after the start of this one."""
    store = await opened(backend)
    try:
        calls: list[int] = []
        with pytest.raises(Boom):
            await PartialSends(store, "tg").send(MESSAGE, 3, steps(calls, fail_at=2))
        calls.clear()
        other = MESSAGE.model_copy(update={"text": "other " * 2000})
        await PartialSends(store, "tg").send(other, 3, steps(calls))
        assert calls == [0, 1, 2]
    finally:
        await store.close()
