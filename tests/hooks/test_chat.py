"""Chat hooks (mutate or replace the message list) and reply hooks (first reply wins)."""

from __future__ import annotations

from typing import Any

import pytest

from talkbridge.errors import TurnAbortedError
from talkbridge.hooks import ChatHooks

from .support import make_ctx

Messages = list[dict[str, Any]]


async def test_chat_hooks_mutate_in_place_or_replace() -> None:
    chat = ChatHooks()
    seen: list[int] = []

    def add_system(messages: Messages) -> None:
        messages.insert(0, {"role": "system", "content": "be brief"})

    async def keep_last_two(messages: Messages) -> Messages:
        seen.append(len(messages))
        return messages[-2:]

    chat.add_chat(add_system, name="system")
    chat.add_chat(keep_last_two, name="trim")
    original: Messages = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
    ]
    result = await chat.run_chat(original)
    assert seen == [4]  # the in-place insert was visible to the next hook
    assert original[0]["role"] == "system"
    assert result == [{"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]


async def test_chat_hooks_on_a_turn_rewrite_the_prompt() -> None:
    chat = ChatHooks()

    def redact(messages: Messages) -> None:
        messages[-1]["content"] = messages[-1]["content"].replace("4111", "****")

    chat.add_chat(redact, name="redact")
    ctx = make_ctx("card 4111")
    await chat.run_chat_hooks(ctx)
    assert ctx.input.prompt == "card ****"


async def test_reply_hooks_first_reply_wins_rest_skipped() -> None:
    chat = ChatHooks()
    calls: list[str] = []

    def abstain(messages: Messages) -> None:
        calls.append("abstain")

    async def faq(messages: Messages, reply: str | None) -> str:
        calls.append("faq")
        return f"FAQ instead of {reply}"

    def never(messages: Messages) -> str:
        calls.append("never")
        return "too late"

    chat.add_reply(abstain, name="abstain")
    chat.add_reply(faq, name="faq")
    chat.add_reply(never, name="never")
    outcome = await chat.run_reply([{"role": "user", "content": "q"}], "agent answer")
    assert outcome.reply == "FAQ instead of agent answer" and outcome.replied_by == "faq"
    assert calls == ["abstain", "faq"]
    assert await chat.run_reply_hooks(make_ctx(), "x") == "FAQ instead of x"


async def test_no_reply_keeps_the_agents_and_errors_follow_on_error() -> None:
    chat = ChatHooks()

    def broken(messages: Messages) -> str:
        raise RuntimeError("bad hook")

    chat.add_reply(broken, name="broken")
    outcome = await chat.run_reply([], "agent answer")
    assert outcome.reply == "agent answer" and outcome.replied_by is None

    strict = ChatHooks()
    strict.add_chat(lambda messages: "not a list", name="strict", on_error="fail-closed")
    with pytest.raises(TurnAbortedError, match="'strict'"):
        await strict.run_chat([])
