"""The zombie-connection watch, fed gateway frames as the transport reads them."""

from __future__ import annotations

import json

from talkbridge.connectors.discord.heartbeat import (
    HEARTBEAT_ACK,
    HELLO,
    HeartbeatWatch,
    hello_interval,
    opcode,
)


def test_only_hello_and_ack_frames_are_read() -> None:
    hello = json.dumps({"t": None, "s": None, "op": 10, "d": {"heartbeat_interval": 41250}})
    assert opcode(hello) == HELLO and hello_interval(hello) == 41.25
    assert opcode('{"op": 11, "d": null}') == HEARTBEAT_ACK
    assert opcode(json.dumps({"op": 0, "t": "MESSAGE_CREATE", "d": {}})) is None
    assert opcode("not json") is None and hello_interval('{"op": 10, "d": {}}') is None


def test_two_intervals_without_an_ack_make_a_zombie_once_until_the_next_hello() -> None:
    watch = HeartbeatWatch()
    assert watch.due() is None and watch.zombie(1000.0) is None  # nothing to watch yet
    watch.hello(10.0, now=0.0)
    watch.ack(now=10.1)
    assert watch.due() == 30.1
    assert watch.zombie(30.0) is None  # the heartbeat at 20 may still be answered
    assert watch.zombie(30.2) == 30.2 - 10.1
    assert watch.zombie(60.0) is None  # left: not reported again before the next HELLO
    watch.hello(10.0, now=61.0)
    assert watch.due() == 81.0
