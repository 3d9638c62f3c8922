"""A user's python agent that blocks the event loop (`time.sleep`, `requests`) is named in the
log, as a hook that does is: it stalls every conversation just the same."""

from __future__ import annotations

import itertools
import logging
import re
from pathlib import Path

import pytest

from talkbridge.bridge import Bridge
from talkbridge.config import ConnectionConfig, load_config
from talkbridge.hooks import steps
from talkbridge.hooks.calls import shown_path
from tests.support.talk_connector import TalkConnector, make_message

_modules = itertools.count(1)


@pytest.fixture(autouse=True)
def _sooner(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(steps, "BLOCKING_WARNING", 0.25)  # 1 s, sooner


_MIDDLEWARE = (
    "class Around:\n"
    "    order = 0\n"
    "    async def handle(self, ctx, next):\n"
    "        await next()\n"
    "def create_hook(deps):\n"
    "    return Around()\n"
)


async def _held_lines(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, stream: list[str], middleware: bool
) -> tuple[list[str], Path]:
    """A `python` agent whose `stream` is `stream` (lines), loaded from the config as a user's
    is (with a turn middleware around it when `middleware`), answers one message; the 'held
    up' lines of the log, and the agent's module."""
    module = f"blocking_agent_{next(_modules)}"
    source = tmp_path / f"{module}.py"
    lines = [
        "import asyncio, time",
        "from talkbridge.agents import Result, TextDelta",
        "class Slow:",
        "    name = 'slow'",
        "    async def stream(self, ctx):",
        *(f"        {line}" for line in stream),
        "        yield Result(text='done')",
    ]
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    hooks = ""
    if middleware:
        folder = tmp_path / "hooks" / "turn-middleware" / "around"
        folder.mkdir(parents=True)
        (folder / "hook.py").write_text(_MIDDLEWARE, encoding="utf-8")
        hooks = f"hooks: [{folder}]\n"
    file = tmp_path / "talkbridge.yaml"
    agent = f"{{kind: python, target: '{module}:Slow'}}"
    file.write_text(
        f"store: sqlite:///{tmp_path / 'talkbridge.db'}\n{hooks}"
        f"agents: {{default: slow, definitions: {{slow: {agent}}}}}\n",
        encoding="utf-8",
    )
    config, secrets = load_config(str(file))
    bridge = Bridge(config, secrets, with_webchat=False)
    conn = TalkConnector("test")
    bridge.registry.add(conn, ConnectionConfig(id="test", channel="telegram", trusted=["alice"]))
    await bridge.start()
    try:
        with caplog.at_level(logging.WARNING):
            await conn.inject(make_message("hello", thread_id="c", message_id="m-1"))
            await conn.wait_sent(1)
    finally:
        await bridge.stop()
    assert conn.texts() == ["done"]  # the turn went on: the agent only held it up
    said = [r.getMessage() for r in caplog.records if "held up every conversation" in r.message]
    for line in said:
        assert "time.sleep, or blocking I/O" in line and "asyncio.to_thread" in line
    return [re.sub(r"\(turn [\w-]+\)", "(turn T)", line.split(" ran ")[0]) for line in said], source


@pytest.mark.parametrize("middleware", [False, True], ids=["alone", "in-middleware"])
@pytest.mark.parametrize(
    "stream",
    [
        ["time.sleep(0.5)  # a blocking call: what the test is about"],
        [  # after a delta and an await: every step is timed, not the first only
            "yield TextDelta(text='thinking')",
            "await asyncio.sleep(0)",
            "time.sleep(0.5)",
        ],
    ],
    ids=["at-once", "later"],
)
async def test_a_python_agent_that_blocks_the_loop_is_named(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, stream: list[str], middleware: bool
) -> None:
    """It stalled every conversation without a word; a turn middleware around it is not
    blamed for it either."""
    lines, source = await _held_lines(tmp_path, caplog, stream, middleware)
    assert lines == [
        "agent 'slow' held up every conversation on test/m-1 (turn T): Slow.stream "
        f"({shown_path(str(source))} line 5)"
    ]


async def test_a_python_agent_that_awaits_is_not_named(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Time spent awaiting (a model's answer over an async client) holds up nothing."""
    stream = ["yield TextDelta(text='thinking')", "await asyncio.sleep(0.5)"]
    assert (await _held_lines(tmp_path, caplog, stream, middleware=True))[0] == []
