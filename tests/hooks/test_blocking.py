"""Hooks that block the event loop (`time.sleep`, `requests.post`) are named in the log, whatever
their kind and wherever in their code they block.

Such a hook stalls every conversation, and its own timeout cannot fire; without a word in the log,
the operator sees a bridge that is slow for no reason.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from talkbridge.hooks import steps
from talkbridge.hooks.calls import shown_path
from tests.support.talk_connector import make_message

from .support import hook_folder_bridge

BLOCKS = "time.sleep(0.5)  # a blocking call: what the test is about"


@pytest.fixture(autouse=True)
def _sooner(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(steps, "BLOCKING_WARNING", 0.25)  # 1 s, sooner


async def _held_lines(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    folder: Path,
    code: str,
    also: dict[Path, str] | None = None,
) -> list[str]:
    """Load the hook folders as a user's config does, have one message answered (and the
    watchers done with its turn); the 'held up' lines of the log."""
    async with hook_folder_bridge(tmp_path, folder, code, also=also) as (bridge, conn):
        with caplog.at_level(logging.WARNING, logger="talkbridge.hooks"):
            await conn.inject(make_message("hello", thread_id="c", message_id="m-1"))
            await conn.wait_sent(1)
            await bridge.hooks.drain()
    assert conn.texts() == ["hello"]  # the turn went on: the hook only held it up
    said = [r.getMessage() for r in caplog.records]
    for line in said:
        assert "time.sleep, or blocking I/O" in line and "asyncio.to_thread" in line
    return [line.split(" ran ")[0] for line in said if "held up every conversation" in line]


def _where(folder: Path) -> str:
    return shown_path(str(folder / "hook.py"))


@pytest.mark.parametrize(
    "body",
    [
        ["def on_message(msg):", f"    {BLOCKS}"],
        ["async def on_message(msg):", f"    {BLOCKS}"],
        [  # after its first await: the engine used to time the first step only
            "async def on_message(msg):",
            "    await asyncio.sleep(0)",
            f"    {BLOCKS}",
        ],
    ],
    ids=["sync", "before-awaiting", "after-awaiting"],
)
async def test_a_channel_message_hook_that_blocks_is_named(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, body: list[str]
) -> None:
    folder = tmp_path / "hooks" / "channel-message" / "lookup"
    lines = ["import asyncio, time", "def create_hook(deps):", *(f"    {ln}" for ln in body)]
    code = "\n".join([*lines, "    return on_message", ""])
    assert await _held_lines(tmp_path, caplog, folder, code) == [
        "channel-message hook 'lookup' held up every conversation on test/m-1: on_message "
        f"({_where(folder)} line 3)"
    ]


@pytest.mark.parametrize(
    ("name", "settings", "kind"),
    [
        # `needs_thread_lock: false` hooks start on arrival, in a task of their own.
        ("screen", "needs_thread_lock: false\n", "hook"),
        ("audit", "observer: true\n", "observer"),
    ],
)
async def test_a_lock_free_hook_or_observer_that_blocks_is_named(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, name: str, settings: str, kind: str
) -> None:
    folder = tmp_path / "hooks" / "channel-message" / name
    folder.mkdir(parents=True)
    (folder / "hook.yaml").write_text(settings, encoding="utf-8")
    code = (
        "import asyncio, time\n"
        "def create_hook(deps):\n"
        "    async def on_message(msg):\n"
        "        await asyncio.sleep(0)\n"
        f"        {BLOCKS}\n"
        "    return on_message\n"
    )
    assert await _held_lines(tmp_path, caplog, folder, code) == [
        f"channel-message {kind} {name!r} held up every conversation on test/m-1: on_message "
        f"({_where(folder)} line 3)"
    ]


async def test_the_turn_middleware_that_blocks_is_named_not_the_one_around_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A middleware's step runs what `next()` runs: the outer one is not blamed for the inner
    one's `time.sleep` (nor for the agent)."""
    hooks = tmp_path / "hooks" / "turn-middleware"
    outer = (
        "class Outer:\n"
        "    order = 0\n"
        "    async def handle(self, ctx, next):\n"
        "        await next()\n"
        "def create_hook(deps):\n"
        "    return Outer()\n"
    )
    inner = (
        "import time\n"
        "class Slow:\n"
        "    order = 1\n"
        "    async def handle(self, ctx, next):\n"
        f"        {BLOCKS}\n"
        "        await next()\n"
        "def create_hook(deps):\n"
        "    return Slow()\n"
    )
    lines = await _held_lines(tmp_path, caplog, hooks / "outer", outer, {hooks / "slow": inner})
    assert lines == [
        "turn middleware 'slow' held up every conversation on test/m-1: Slow.handle "
        f"({_where(hooks / 'slow')} line 4)"
    ]


@pytest.mark.parametrize("define", ["def", "async def"])
async def test_a_turn_watcher_that_blocks_is_named(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, define: str
) -> None:
    folder = tmp_path / "hooks" / "agent-turn-finished" / "timings"
    code = (
        "import time\n"
        "def create_hook(deps):\n"
        f"    {define} watch(event):\n"
        f"        {BLOCKS}\n"
        "    return watch\n"
    )
    [line] = await _held_lines(tmp_path, caplog, folder, code)
    assert line.startswith("agent-turn-finished watcher 'timings' held up every conversation on ")
    assert line.endswith(f" of test/c: watch ({_where(folder)} line 3)")
