"""A loop's Redis trouble is said once, not on every retry, and its end is said too."""

from __future__ import annotations

import logging

import pytest

from talkbridge.cluster.outage import Outage


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
