"""The channel-message kind: routing decisions on top of the engine."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from talkbridge.hooks import (
    ChannelMessageHooks,
    Continue,
    Drop,
    Forward,
    HookFilter,
    HookRegistry,
    Modify,
    RouteToAgent,
    RouteToSentinel,
    Scope,
)
from talkbridge.hooks.calls import shown_path
from talkbridge.message import NormalizedMessage

from .support import WAIT, hook_folder_bridge, make_msg


@pytest.mark.parametrize(
    "decision",
    [RouteToAgent("billing"), RouteToSentinel(), Drop("spam"), Forward("slack-1", "C42")],
)
async def test_routing_decisions_end_the_chain(decision: object) -> None:
    hooks = ChannelMessageHooks()
    later: list[str] = []

    async def decide(msg: NormalizedMessage) -> object:
        return decision

    async def never(msg: NormalizedMessage) -> None:
        later.append(msg.id)

    hooks.add(decide, name="decider", order=0)
    hooks.add(never, name="never", order=1)
    outcome = await hooks.decide(make_msg())
    assert outcome.decision == decision and outcome.decided_by == "decider"
    assert later == []


async def test_modify_and_continue_let_later_hooks_decide() -> None:
    hooks = ChannelMessageHooks()

    async def tag(msg: NormalizedMessage) -> Modify:
        return Modify(msg.model_copy(update={"text": "[vip] " + msg.text}))

    async def shrug(msg: NormalizedMessage) -> Continue:
        return Continue()

    async def route(msg: NormalizedMessage) -> RouteToAgent | None:
        return RouteToAgent("vip-desk") if msg.text.startswith("[vip]") else None

    hooks.add(tag, name="tag", order=0)
    hooks.add(shrug, name="shrug", order=1)
    hooks.add(route, name="route", order=2)
    outcome = await hooks.decide(make_msg("hi"))
    assert outcome.decision == RouteToAgent("vip-desk") and outcome.decided_by == "route"
    assert outcome.message.text == "[vip] hi" and outcome.modified_by == ("tag",)


async def test_no_decision_leaves_routing_to_the_bridge() -> None:
    hooks = ChannelMessageHooks()
    assert (await hooks.decide(make_msg())).decision is None  # no hooks at all

    async def nothing(msg: NormalizedMessage) -> None:
        return None

    hooks.add(nothing, name="nothing")
    outcome = await hooks.decide(make_msg())
    assert outcome.decision is None and outcome.decided_by is None


async def test_fail_closed_failure_becomes_drop_and_bad_modify_is_unusable() -> None:
    hooks = ChannelMessageHooks()

    async def bad_modify(msg: NormalizedMessage) -> Modify:
        return Modify("not a message")  # type: ignore[arg-type]

    hooks.add(bad_modify, name="bad", on_error="fail-closed")
    outcome = await hooks.decide(make_msg())
    assert isinstance(outcome.decision, Drop)
    assert "'bad'" in outcome.decision.reason and "NormalizedMessage" in outcome.decision.reason


async def test_filters_read_the_message_and_edits_are_their_own_event_type() -> None:
    hooks = ChannelMessageHooks()

    async def edits_only(msg: NormalizedMessage) -> Drop:
        return Drop("edit")

    hooks.add(
        edits_only, name="edits", filter=HookFilter(event_types=frozenset({"message.edited"}))
    )
    assert hooks.has_listeners("message.edited") and not hooks.has_listeners("message")
    assert (await hooks.decide(make_msg())).decision is None
    assert (await hooks.decide(make_msg(edit_of="m0"))).decision == Drop("edit")


async def test_thread_scope_uses_the_message_thread_key() -> None:
    hooks = ChannelMessageHooks()
    room = make_msg(thread_id="room-1")

    async def quiet_room(msg: NormalizedMessage) -> Drop:
        return Drop("muted")

    hooks.add(quiet_room, name="mute", scope=Scope.thread(room.thread_key))
    assert (await hooks.decide(room)).decision == Drop("muted")
    assert (await hooks.decide(make_msg(thread_id="room-2"))).decision is None
    assert (await hooks.decide(make_msg(thread_id="room-1", connection_id="b"))).decision is None


async def test_prefetch_and_decide_use_the_prefetched_result() -> None:
    hooks = ChannelMessageHooks()
    calls: list[str] = []
    gate = asyncio.Event()

    async def screen(msg: NormalizedMessage) -> RouteToSentinel:
        calls.append(msg.id)
        gate.set()
        return RouteToSentinel()

    hooks.add(screen, name="screen", needs_thread_lock=False)
    msg = make_msg()
    prefetch = hooks.prefetch(msg)
    await asyncio.wait_for(gate.wait(), WAIT)  # it started before decide was called
    outcome = await hooks.decide(msg, prefetch=prefetch)
    assert outcome.decision == RouteToSentinel() and calls == ["m1"]


async def test_registry_decorator_forms() -> None:
    hooks = HookRegistry()

    @hooks.channel_message
    async def first(msg: NormalizedMessage) -> None:
        return None

    @hooks.channel_message(order=-1, name="vip")
    async def route_vip(msg: NormalizedMessage) -> RouteToAgent:
        return RouteToAgent("vip")

    outcome = await hooks.channel_message.decide(make_msg())
    assert outcome.decided_by == "vip"
    assert hooks.kind_of("first") == "channel-message"
    hooks.unregister("vip")
    assert (await hooks.channel_message.decide(make_msg())).decision is None


async def test_a_failing_subscriber_of_an_imperative_hook_is_one_line_naming_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A handler that a hook folder subscribed (`deps.router.subscribe`) and that raised was
    logged as "a subscriber failed on conn/id" and a traceback, naming neither the handler nor
    its hook: now one line names both places, the traceback is at debug level, and the
    message is still answered (by the bridge's own subscriber) and done with."""
    from tests.support.talk_connector import make_message

    folder = tmp_path / "hooks" / "channel-message" / "relay"
    code = (
        "class Relay:\n"
        "    def __init__(self, router):\n"
        "        self.router = router\n"
        "    def register(self):\n"
        "        pass\n"
        "    def register_connection(self, connection_id):\n"
        "        self.router.subscribe(connection_id, self.copy)\n"
        "    async def copy(self, msg):\n"
        "        raise RuntimeError('the other room is gone')\n"
        "def create_hook(deps):\n"
        "    return Relay(deps.router)\n"
    )
    async with hook_folder_bridge(tmp_path, folder, code) as (bridge, conn):
        with caplog.at_level(logging.DEBUG, logger="talkbridge.router"):
            await conn.inject(make_message("hello", thread_id="chat-1", message_id="m-7"))
            (sent,) = await conn.wait_sent(1)
            await bridge.router.join()
        assert sent.message.text == "hello"
        assert await bridge.store.pending_inbound() == []  # done with: not handled again
    where = shown_path(str(folder / "hook.py"))
    failed = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [(r.levelno, r.getMessage(), r.exc_info) for r in failed] == [
        (
            logging.ERROR,
            f"a subscriber failed on test/m-7: Relay.copy ({where} line 8) raised RuntimeError: "
            f"the other room is gone (at {where} line 9); the other subscribers still get the "
            "message, this one does not get it again",
            None,
        )
    ]
    traceback = [r for r in caplog.records if r.levelno == logging.DEBUG and r.exc_info]
    assert len(traceback) == 1 and "the other room is gone" in str(traceback[0].exc_info[1])  # type: ignore[index]


async def test_a_failing_hook_folder_is_one_line_naming_its_code_and_the_message_not_its_text(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A hook that raised was logged naming its folder and the file that raised, not the
    function or class whose code failed, nor the message it was handling; one that returned
    the message itself (a forgotten `Modify`) had the message's repr, its text included, in
    the log. Now each line names the code (`Guard.on_message`, its file and line) and the
    message by connection and id, never by its text; both messages are still answered."""
    from tests.support.talk_connector import make_message

    folder = tmp_path / "hooks" / "channel-message" / "guard"
    code = (
        "class Guard:\n"
        "    async def on_message(self, msg):\n"
        "        if msg.id == 'm-1':\n"
        "            raise RuntimeError('no profile')\n"
        "        return msg\n"
        "def create_hook(deps):\n"
        "    return Guard()\n"
    )
    async with hook_folder_bridge(tmp_path, folder, code) as (_bridge, conn):
        with caplog.at_level(logging.WARNING, logger="talkbridge.hooks"):
            await conn.inject(make_message("my card is 4111", thread_id="c", message_id="m-1"))
            await conn.inject(make_message("my pin is 1234", thread_id="c", message_id="m-2"))
            await conn.wait_sent(2)
    assert conn.texts() == ["my card is 4111", "my pin is 1234"]  # fail-open: answered
    where = shown_path(str(folder / "hook.py"))
    hint = (
        "a hook returns None, or an instance such as Continue(), Modify(msg), "
        "RouteToAgent('name'), RouteToSentinel(), Drop('why') or Forward('connection-id')"
    )
    assert [r.getMessage() for r in caplog.records] == [
        f"channel-message hook 'guard' failed on test/m-1: Guard.on_message ({where} line 2) "
        f"raised RuntimeError: no profile (at {where} line 4); skipped (fail-open)",
        f"channel-message hook 'guard' failed on test/m-2: Guard.on_message ({where} line 2) "
        "returned the message itself instead of a decision (to change it: Modify(msg); "
        f"{hint}); skipped (fail-open)",
    ]
