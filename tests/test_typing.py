"""An app written against the documented API type-checks under `mypy --strict` (py.typed)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

APP = """
from collections.abc import AsyncIterator
from typing import Any, assert_type

from talkbridge import NormalizedMessage, OutboundMessage, Talk
from talkbridge.agents import Result, TextDelta, TurnContext
from talkbridge.bridge import Bridge
from talkbridge.hooks import Decision, Drop, HookDeps, HookRegistry
from talkbridge.router import TalkRouter
from talkbridge.talk import KEEP, Edit, History, Interactions


class SupportAgent:
    name = "support"

    async def stream(self, ctx: TurnContext) -> AsyncIterator[Any]:
        earlier = await ctx.history(5)
        yield TextDelta(text="Looking into it… ")
        yield Result(text=f"done ({len(earlier)} earlier)")


hooks = HookRegistry()


@hooks.channel_message(order=5, on_error="fail-closed", timeout=2)
async def moderation(msg: NormalizedMessage) -> Decision | None:
    return Drop("flagged") if "spam" in msg.text else None


class Archive:
    def __init__(self, deps: HookDeps) -> None:
        self.router = deps.router

    async def on_message(self, msg: NormalizedMessage) -> None:
        history = self.router.feature(msg.connection_id, "history")
        if history is not None:
            await history.fetch(msg.thread_id, limit=10)


async def app(bridge: Bridge, router: TalkRouter, deps: HookDeps) -> None:
    assert_type(deps.router, TalkRouter)
    assert_type(router.feature("tg", "history"), History | None)
    assert_type(router.feature("tg", "edit"), Edit | None)
    assert_type(router.feature("tg", "interactions"), Interactions | None)
    talk: Talk = router.talk("tg")
    assert_type(talk.feature("history"), History | None)
    sent = await router.send("tg", OutboundMessage(thread_id="1", text="hi"))
    editor = router.feature("tg", "edit")
    if editor is not None:
        await editor.edit("1", sent.message_id, "edited")
        await editor.edit("1", sent.message_id, "approved", buttons=())
        await editor.edit("1", sent.message_id, "again", buttons=[("Undo", "undo")])
        await editor.edit("1", sent.message_id, "kept", buttons=KEEP)
    Bridge(hooks=hooks, agents={"support": SupportAgent()})
"""


def test_an_app_using_the_documented_api_passes_mypy_strict(tmp_path: Path) -> None:
    app = tmp_path / "app.py"
    app.write_text(textwrap.dedent(APP), encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", str(app)],
        cwd=ROOT,  # the project's mypy settings (the pydantic plugin), and this talkbridge
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
