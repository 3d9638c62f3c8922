"""A loop's Redis trouble is said once, not on every retry, and its end is said too."""

from __future__ import annotations

import logging

import pytest
import redis.asyncio as aioredis

from talkbridge.cluster.fanout import WebchatFanout
from talkbridge.cluster.keys import ClusterKeys
from talkbridge.outage import Outage
from talkbridge.store.redis import reconnecting
from tests.cluster.conftest import wait_until
from tests.peers.redis import outage_redis


def test_an_outage_is_one_warning_then_quiet_until_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = logging.getLogger("talkbridge.cluster.test")
    outage = Outage("reading the inbound bus", log)
    with caplog.at_level(logging.INFO, logger="talkbridge.cluster.test"):
        outage.worked()  # nothing to say while all is well
        for _ in range(8):  # a node retrying four times a second
            outage.failed(ConnectionError("Error 111 connecting to 127.0.0.1:6379"))
        outage.worked()
        outage.worked()
    said = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert [level for level, _ in said] == ["WARNING", "INFO"]
    assert said[0][1] == (
        "reading the inbound bus failed: Error 111 connecting to 127.0.0.1:6379; "
        "retrying until it works again"
    )
    assert said[1][1].startswith("reading the inbound bus works again, after ")


async def test_the_webchat_fan_out_says_a_redis_outage_once_and_its_end(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # It reconnects every half second: a warning each time buried the log for the whole outage.
    def said(level: int) -> list[str]:
        return [r.getMessage() for r in caplog.records if r.levelno == level]

    caplog.set_level(logging.DEBUG, logger="talkbridge.cluster.fanout")
    async with outage_redis() as server:
        client = aioredis.Redis.from_url(server.url, decode_responses=True, **reconnecting())
        fanout = WebchatFanout(client, ClusterKeys("tbtest-outage"), "a")
        try:
            await fanout.start()
            server.stop()
            await wait_until(lambda: len(said(logging.DEBUG)) >= 3)  # it keeps retrying
            await server.start()
            await wait_until(lambda: bool(said(logging.INFO)))
        finally:
            await fanout.stop()
            await client.aclose()
    assert len(said(logging.WARNING)) == 1
    assert said(logging.WARNING)[0].startswith("the webchat fan-out listener failed: ")
    assert said(logging.INFO)[0].startswith("the webchat fan-out listener works again")
