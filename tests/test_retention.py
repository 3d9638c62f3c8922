"""The retention sweep: what the config says, in bounded steps, and started by the bridge."""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from talkbridge.bridge import Bridge
from talkbridge.cancellation import cancel_and_wait
from talkbridge.config import BridgeConfig, RetentionConfig
from talkbridge.retention import keep_for, sweep, sweep_forever
from talkbridge.store import FailedSend, Retention, SqliteStore
from tests.support.talk_connector import make_message

NOW = Retention(timedelta(0), timedelta(0), timedelta(0))


def test_the_config_becomes_the_store_retention() -> None:
    keep = keep_for(RetentionConfig(dedupe_days=2, sent_days=0.5, failed_sends_days=30))
    assert keep == Retention(timedelta(days=2), timedelta(hours=12), timedelta(days=30))


def test_connectors_keep_their_records_as_long_as_dedupe_ids(tmp_path: Path) -> None:
    config = BridgeConfig(retention=RetentionConfig(dedupe_days=3))
    bridge = Bridge(config, store=SqliteStore(tmp_path / "x.db"), with_webchat=False)
    assert bridge.context.dedupe_for == timedelta(days=3)  # e.g. a Telegram album's updates


async def test_a_sweep_drops_in_steps_what_the_previous_sweep_saw(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "x.db")
    await store.open()
    try:
        for i in range(5):
            assert await store.accept_inbound(make_message(connection_id="tg", message_id=f"m{i}"))
            await store.complete_inbound("tg", f"m{i}")
            await store.record_sent("tg", f"k{i}", [str(i)])
        await store.record_failed_send(
            FailedSend("tg", "t", "x", "boom", datetime.now(UTC) - timedelta(seconds=1))
        )
        first = await sweep(store, NOW, step_size=2)
        assert (first.dedupe, first.sent) == (0, 0)  # nothing was seen by an earlier sweep
        assert first.failed_sends == 1
        second = await sweep(store, NOW, step_size=2)  # three steps of at most 2
        assert (second.dedupe, second.sent, second.more) == (5, 5, False)
        assert await store.accept_inbound(make_message(connection_id="tg", message_id="m0"))
        assert await store.sent_result("tg", "k0") is None
    finally:
        await store.close()


async def test_a_sweep_frees_state_past_its_deadline_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "talkbridge.store")
    store = SqliteStore(tmp_path / "x.db")
    await store.open()
    try:
        store.wall_clock = lambda: time.time() - 2 * 86_400  # written two days ago
        await store.set_state("album", "a day", keep_for=timedelta(days=1))
        await store.set_state("offset", "for good")
        swept = asyncio.Event()
        task = asyncio.create_task(sweep_forever(store, RetentionConfig(), swept))
        await asyncio.wait_for(swept.wait(), 10)
        await cancel_and_wait(task)
        assert "forgot 0 dedupe id(s), 0 send record(s), 0 failed send(s), 1 expired" in caplog.text
        rows = await store._writer.submit(store._ops.query, "SELECT key FROM state")
        assert rows == [("offset",)]
    finally:
        await store.close()


async def test_the_bridge_sweeps_from_start_and_stops_sweeping(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "x.db")
    bridge = Bridge(BridgeConfig(), store=store, with_webchat=False)
    await bridge.start()
    sweeper = bridge._sweeper
    assert sweeper is not None
    await asyncio.wait_for(bridge.swept.wait(), 10)
    [(marks,)] = await store._writer.submit(store._ops.query, "SELECT count(*) FROM prune_marks")
    await bridge.stop()
    assert marks == 2  # the first sweep ran at start: later ones age what it saw
    assert sweeper.cancelled() and bridge._sweeper is None
