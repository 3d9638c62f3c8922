"""Noticing a "zombie" gateway connection: heartbeats no longer acknowledged; pure.

Discord's gateway docs: "If a client does not receive a heartbeat ACK between its attempts at
sending heartbeats, this may be due to a failed or 'zombied' connection. The client should
immediately terminate the connection with any close code besides 1000 or 1001, then reconnect
and attempt to Resume." discord.py does not: its keep-alive thread times out on the last frame
*received* (`heartbeat_timeout` is compared with any frame's arrival, despite its docs), so a
connection on which dispatches still arrive while heartbeats go unacknowledged is never left.

The transport feeds this watch the gateway frames it reads (`on_socket_raw_receive`): HELLO
(op 10) gives the interval and starts a connection's watch, HEARTBEAT_ACK (op 11) renews it.
discord.py sends a heartbeat at HELLO and then every interval, so each heartbeat's ACK is due
before the next one leaves: with no ACK for two intervals, one heartbeat went a whole interval
unanswered, and the connection is a zombie.
"""

from __future__ import annotations

import json

HELLO = 10
HEARTBEAT_ACK = 11
_SHORT_FRAME = 2048
"""Frames longer than this are dispatches (HELLO and ACK are tiny): not parsed here."""


def opcode(frame: str) -> int | None:
    """The op code of a short non-dispatch gateway frame, with HELLO's interval in seconds
    read by `hello_interval`; None for anything else (dispatches, unreadable frames)."""
    if len(frame) > _SHORT_FRAME or '"op"' not in frame:
        return None
    try:
        data = json.loads(frame)
    except ValueError:
        return None
    op = data.get("op") if isinstance(data, dict) else None
    return op if isinstance(op, int) and op != 0 else None


def hello_interval(frame: str) -> float | None:
    """HELLO's `heartbeat_interval`, in seconds."""
    try:
        value = json.loads(frame)["d"]["heartbeat_interval"]
    except (ValueError, KeyError, TypeError):
        return None
    return value / 1000.0 if isinstance(value, int | float) and value > 0 else None


class HeartbeatWatch:
    """When the current gateway connection's heartbeats are overdue; times are monotonic."""

    def __init__(self) -> None:
        self.interval: float | None = None
        """The connection's heartbeat interval; None: no connection being watched (before its
        HELLO, or once it was found a zombie and is being left)."""
        self.last_ack = 0.0

    def hello(self, interval: float, now: float) -> None:
        """A connection opened: discord.py heartbeats at once, then every `interval`."""
        self.interval = interval
        self.last_ack = now

    def ack(self, now: float) -> None:
        self.last_ack = now

    def due(self) -> float | None:
        """When the connection counts as a zombie unless an ACK comes first; None: unwatched."""
        if self.interval is None:
            return None
        return self.last_ack + 2 * self.interval

    def zombie(self, now: float) -> float | None:
        """Seconds without an ACK when the connection is a zombie (and stop watching it until
        the next HELLO); None while it is fine."""
        due = self.due()
        if due is None or now < due:
            return None
        self.interval = None
        return now - self.last_ack
