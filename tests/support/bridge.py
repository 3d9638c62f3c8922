"""The whole Bridge (registry, router, hooks, agents) over a connector's peer, for e2e tests.

`bridges(tmp_path, connection)` yields `start(*connections)`: each connection dict is completed
by `connection` (channel, peer URLs, …), the Bridge starts on a SQLite store in `tmp_path`, and
`start` returns once every connection is up or down (`agents=`: the Bridge's agents, by name;
`prepare=`: called with the Bridge before it starts, to add hooks).
All started Bridges stop at the end.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from talkbridge.agents import Agent
from talkbridge.bridge import Bridge
from talkbridge.config import parse_config
from talkbridge.registry import ConnectionState

StartBridge = Callable[..., Awaitable[Bridge]]


@asynccontextmanager
async def bridges(
    tmp_path: Path,
    connection: Callable[[dict[str, Any]], dict[str, Any]],
    *,
    timeout: float = 10.0,
) -> AsyncIterator[StartBridge]:
    started: list[Bridge] = []

    async def start(
        *connections: dict[str, Any],
        agents: Mapping[str, Agent] | None = None,
        prepare: Callable[[Bridge], None] | None = None,
    ) -> Bridge:
        configured = [connection(c) for c in connections]
        data = {"store": f"sqlite:///{tmp_path}/talkbridge.db", "connections": configured}
        config, secrets = parse_config(data, tmp_path)
        instance = Bridge(config, secrets, agents=agents, with_webchat=False)
        if prepare is not None:
            prepare(instance)
        await instance.start()
        started.append(instance)
        for c in configured:
            await instance.registry.wait_for(
                c["id"], ConnectionState.UP, ConnectionState.DOWN, timeout=timeout
            )
        return instance

    try:
        yield start
    finally:
        for instance in started:
            if instance._started:  # a test may have stopped it already
                await instance.stop(drain_timeout=2)
