"""The page in a real browser: Playwright driving Debian's chromium (never `playwright install`)."""

from __future__ import annotations

import asyncio
import collections
import json
import socket
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from talkbridge.bridge import Bridge
from talkbridge.config import BridgeConfig, ConnectionConfig, parse_config
from talkbridge.errors import PermanentError, StoreError
from talkbridge.hooks import Forward, HookRegistry
from talkbridge.init_template import write_starter
from talkbridge.message import NormalizedMessage, OutboundMessage
from tests.support.agents import GatedAgent
from tests.support.talk_connector import TalkConnector
from tests.webchat.conftest import (
    MS,
    TIMEOUT,
    TOKEN_A,
    TOKEN_B,
    Webchat,
    expect,
    open_chat,
    page_swallowing_sends,
    page_url,
    say,
    say_on_a_phone,
)


async def test_send_see_the_reply_stream_then_reload_keeps_history(
    webchat: Webchat, context: Any
) -> None:
    page = await open_chat(context, webchat)
    webchat.echo.gate = asyncio.Event()
    await say(page, "hello")

    # The reply is shown while it is produced: the first half, in a streaming bubble.
    await asyncio.wait_for(webchat.echo.streaming.wait(), TIMEOUT)
    streaming = page.locator(".msg.streaming .bubble")
    await expect(streaming).to_have_text("echo:")
    # A reload mid-stream shows the reply so far again, not only what comes after it.
    await page.reload()
    await expect(streaming).to_have_text("echo:")
    webchat.echo.gate.set()
    # The final message replaces the streaming bubble: one assistant bubble, whole text.
    assistant = page.locator(".msg-assistant .bubble")
    await expect(assistant).to_have_text(["echo: hello"])
    await expect(page.locator(".msg.streaming")).to_have_count(0)
    await expect(page.locator(".msg-user .bubble")).to_have_text(["hello"])
    await expect(page.locator(".msg.pending")).to_have_count(0)
    await expect(page.locator("#chat-title")).to_have_text("hello")

    await page.reload()
    await expect(page.locator("#status")).to_have_attribute("data-state", "online")
    await expect(page.locator(".msg .bubble")).to_have_text(["hello", "echo: hello"])
    assert len(webchat.echo.turns) == 1  # the reload resent nothing


async def test_a_reply_that_ends_without_its_final_message_leaves_no_half_copy(
    webchat: Webchat, context: Any
) -> None:
    """Its turn was cut off, or its reply had gone out before (from the turn's earlier run):
    the bridge ends the stream, and the page drops what it showed of it."""
    page = await open_chat(context, webchat)
    webchat.echo.gate = asyncio.Event()
    await say(page, "hello")
    await asyncio.wait_for(webchat.echo.streaming.wait(), TIMEOUT)
    streaming = page.locator(".msg.streaming .bubble")
    await expect(streaming).to_have_text("echo:")
    (turn,) = webchat.echo.turns
    await webchat.connector.end(turn.thread_id, "s1")
    await expect(page.locator(".msg.streaming")).to_have_count(0)
    await expect(page.locator(".msg .bubble")).to_have_text(["hello"])
    webchat.echo.gate.set()  # (the harness's turn goes on to its end)
    await expect(page.locator(".msg-assistant .bubble")).to_have_text(["echo: hello"])
    await expect(page.locator(".msg.streaming")).to_have_count(0)


async def test_a_second_tab_sees_new_messages(webchat: Webchat, context: Any) -> None:
    first = await open_chat(context, webchat)
    second = await open_chat(context, webchat)  # same browser profile: same session
    await say(first, "from the first tab")
    await expect(second.locator(".msg .bubble")).to_have_text(
        ["from the first tab", "echo: from the first tab"]
    )
    await say(second, "and back")
    await expect(first.locator(".msg .bubble")).to_have_text(
        ["from the first tab", "echo: from the first tab", "and back", "echo: and back"]
    )


class Frames:
    """Every websocket frame a page sends and receives, parsed."""

    def __init__(self, page: Any) -> None:
        self.sent: list[dict[str, Any]] = []
        self.received: list[dict[str, Any]] = []
        page.on("websocket", self._socket)

    def _socket(self, ws: Any) -> None:
        ws.on("framesent", lambda payload: self.sent.append(json.loads(payload)))
        ws.on("framereceived", lambda payload: self.received.append(json.loads(payload)))

    def sends(self) -> list[str]:
        return [f["client_id"] for f in self.sent if f["type"] == "send"]


async def open_watched_chat(context: Any, webchat: Webchat) -> tuple[Any, Frames]:
    page = await context.new_page()
    frames = Frames(page)
    await page.goto(page_url(webchat))
    await expect(page.locator("#status")).to_have_attribute("data-state", "online", timeout=MS)
    return page, frames


async def test_two_tabs_send_each_message_once_even_after_a_reconnect(
    webchat: Webchat, context: Any
) -> None:
    """Tabs share the outbox: each tab sent every message it saw pending (at once, and again
    after a reconnect), so each went out once per tab, the copies acknowledged as duplicates.
    The tab a message was typed in sends it; the other shows it and leaves it be."""
    first, first_frames = await open_watched_chat(context, webchat)
    second, second_frames = await open_watched_chat(context, webchat)
    for page, text in ((first, "one"), (second, "two")):
        await say(page, text)
        for tab in (first, second):
            await expect(tab.locator(".msg-assistant .bubble").last).to_have_text(f"echo: {text}")
    await context.set_offline(True)
    for page in (first, second):
        await expect(page.locator("#status")).to_have_attribute("data-state", "offline")
    await say(first, "typed offline")
    await expect(second.locator(".msg.pending .bubble")).to_have_text(["typed offline"])
    await context.set_offline(False)
    texts = ["one", "two", "typed offline"]
    for page in (first, second):
        await expect(page.locator("#status")).to_have_attribute("data-state", "online")
        await expect(page.locator(".msg-assistant .bubble")).to_have_text(
            [f"echo: {t}" for t in texts]
        )
    # A last turn from each tab: whatever either sent before it was sent before it.
    await say(second, "last from the second")
    await expect(first.locator(".msg-assistant .bubble").last).to_have_text(
        "echo: last from the second"
    )
    await say(first, "last from the first")
    await expect(second.locator(".msg-assistant .bubble").last).to_have_text(
        "echo: last from the first"
    )
    texts += ["last from the second", "last from the first"]
    assert [m.text for m in webchat.echo.turns] == texts
    sends = first_frames.sends() + second_frames.sends()
    assert len(sends) == len(set(sends)) == len(texts), sends  # each message went out once
    received = first_frames.received + second_frames.received
    assert [f for f in received if f["type"] == "ack" and f["duplicate"]] == []
    assert [f for f in received if f["type"] == "error"] == []
    for page in (first, second):
        await expect(page.locator("#toast")).to_be_hidden()
        await expect(page.locator(".msg.pending, .msg.failed")).to_have_count(0)


async def test_a_message_left_pending_by_a_reload_is_sent_by_the_reloaded_page(
    webchat: Webchat, context: Any
) -> None:
    """The reloaded page is a new tab: it takes over what the page before it left unsent."""
    page, swallow = await page_swallowing_sends(context, webchat)
    await say(page, "left pending")
    await expect(page.locator(".msg.pending .meta")).to_have_text("Sending…")
    swallow["sends"] = False
    await page.reload()
    await expect(page.locator(".msg .bubble")).to_have_text(["left pending", "echo: left pending"])
    assert [m.text for m in webchat.echo.turns] == ["left pending"]


async def test_html_and_script_in_messages_show_as_text(webchat: Webchat, context: Any) -> None:
    page = await open_chat(context, webchat)
    attacks = [
        "<img src=x onerror=window.__pwned=1>",
        "<script>window.__pwned=1</script>",
        "[click](javascript:window.__pwned=1) **bold** `<b>code</b>` https://example.com/x",
    ]
    for text in attacks:
        await say(page, text)
        await expect(page.locator(".msg-assistant .bubble").last).to_contain_text("echo:")
    messages = page.locator("#messages")
    await expect(messages.locator(".msg-user .bubble")).to_have_text(attacks)
    await expect(messages.locator(".msg-assistant .bubble").nth(0)).to_have_text(
        "echo: " + attacks[0]
    )
    await expect(messages.locator(".msg-assistant .bubble").nth(1)).to_have_text(
        "echo: " + attacks[1]
    )
    assert await messages.locator("img, script, iframe, b").count() == 0
    assert await page.evaluate("window.__pwned") is None
    # The Markdown subset renders, but only http(s) links become links.
    reply = messages.locator(".msg-assistant .bubble").nth(2)
    await expect(reply.locator("strong")).to_have_text("bold")
    await expect(reply.locator("code")).to_have_text("<b>code</b>")
    await expect(reply.locator("a")).to_have_count(1)
    assert await reply.locator("a").get_attribute("href") == "https://example.com/x"
    await expect(reply).to_contain_text("[click](javascript:window.__pwned=1)")


STREAMED_ATTACK = [
    "Here: <scr",
    "ipt>window.pwned=1</scr",
    "ipt> and <img src=x one",
    "rror=window.pwned=1> **bo",
    "ld** [x](javascript:",
    "window.pwned=1) `<b>co",
    "de</b>`\n\n```html\n<ifr",
    "ame src=javascript:window.pwned=1>\n\n</iframe>\n``",
    "`\n\n- [ok](https://exa",
    "mple.com/<i>)\r",
    "\n\n> <svg onload=window.pwned=1>",
]
"""A reply streamed in pieces cut inside its tags, marks, links, a code block (across a blank
line in it) and a CRLF: at every piece the page must show text, never markup."""

SAME_AS_WHOLE = """text => {
    const bubble = document.querySelector('.msg.streaming .bubble');
    const whole = document.createElement('div');
    whole.append(window.__md.renderMarkdown(text));
    return bubble !== null && bubble.innerHTML === whole.innerHTML;
}"""
"""Whether the streaming bubble is what the reply so far renders to in one go."""


async def test_a_reply_streamed_in_pieces_cut_inside_tags_and_marks_shows_them_as_text(
    webchat: Webchat, context: Any
) -> None:
    page = await open_chat(context, webchat)
    thread_id = await page.evaluate("localStorage.getItem('talkbridge.active')")
    await page.evaluate("async () => { window.__md = await import('/static/markdown.js'); }")
    so_far = ""
    for piece in STREAMED_ATTACK:
        so_far += piece
        await webchat.connector.delta(thread_id, "x1", piece)
        # Drawn block by block, it is what the whole reply so far renders to: no more, no less.
        await page.wait_for_function(SAME_AS_WHOLE, arg=so_far.replace("\r\n", "\n"))
        assert (
            await page.locator("#messages").locator("script, img, iframe, svg, b, i").count() == 0
        )
    final = OutboundMessage(thread_id=thread_id, text=so_far, meta={"stream_id": "x1"})
    await webchat.connector.send(final)
    reply = page.locator(".msg-assistant .bubble")
    await expect(reply).to_contain_text("<script>window.pwned=1</script>")
    await expect(page.locator(".msg.streaming")).to_have_count(0)
    await expect(reply.locator("strong")).to_have_text("bold")
    await expect(reply.locator("code").first).to_have_text("<b>code</b>")
    await expect(reply.locator("a")).to_have_count(1)
    assert await reply.locator("a").get_attribute("href") == "https://example.com/%3Ci%3E"
    assert await page.locator("#messages").locator("script, img, iframe, svg, b, i").count() == 0
    assert await page.evaluate("window.pwned") is None


async def test_a_long_streamed_reply_is_rendered_once_not_again_at_every_piece(
    webchat: Webchat, context: Any
) -> None:
    """Each piece rendered the whole reply so far again: a reply of many paragraphs cost the
    square of its length (a 64 KiB one streamed token by token froze the page)."""
    page = await open_chat(context, webchat)
    thread_id = await page.evaluate("localStorage.getItem('talkbridge.active')")
    await page.evaluate("async () => { (await import('/static/markdown.js')).work.steps = 0; }")
    bubble = page.locator(".msg.streaming .bubble")
    paragraph = "A paragraph with **bold**, `code` and a [link](https://example.com/) in it."
    total = 0
    for n in range(60):
        piece = f"{n}: {paragraph}\n\n"
        total += len(piece)
        await webchat.connector.delta(thread_id, "long", piece)
        await expect(bubble.locator("p")).to_have_count(n + 1)
    steps = await page.evaluate("async () => (await import('/static/markdown.js')).work.steps")
    assert steps <= 12 * total, (steps, total)


async def test_pieces_of_a_reply_arriving_together_are_drawn_once_per_frame(
    webchat: Webchat, context: Any
) -> None:
    """Each delta frame redrew the bubble (and laid the thread out) at once: a page catching
    up, or a model faster than the screen, drew many times a frame, for nothing."""
    page = await context.new_page()
    routes: list[Any] = []

    def relay(ws: Any) -> None:
        server = ws.connect_to_server()
        ws.on_message(server.send)
        server.on_message(ws.send)
        routes.append(ws)

    await page.route_web_socket("**/ws", relay)
    await page.goto(page_url(webchat))
    await expect(page.locator("#status")).to_have_attribute("data-state", "online")
    thread_id = await page.evaluate("localStorage.getItem('talkbridge.active')")
    # A frame counter, and for each change of the bubbles the frame it was drawn in.
    await page.evaluate(
        """() => {
            window.__frame = 0;
            const tick = () => { window.__frame += 1; requestAnimationFrame(tick); };
            requestAnimationFrame(tick);
            window.__drawn = [];
            new MutationObserver(() => window.__drawn.push(window.__frame)).observe(
                document.getElementById('log'), { childList: true, subtree: true });
        }"""
    )
    pieces = [f"word{n} " for n in range(80)]
    for piece in pieces:  # as the server would send them, back to back
        routes[-1].send(
            json.dumps(
                {"type": "delta", "thread_id": thread_id, "stream_id": "fast", "text": piece}
            )
        )
    bubble = page.locator(".msg.streaming .bubble")
    await expect(bubble).to_have_text("".join(pieces).strip())
    drawn = await page.evaluate("window.__drawn")
    # Drawn once a frame. A frame's scroll steps run before its animation callbacks, so a
    # window update the scroll after a draw causes is counted in the draw's frame: at most
    # two changes then, where drawing at each piece made dozens in a frame.
    assert drawn and max(collections.Counter(drawn).values()) <= 2, drawn
    assert len(drawn) < len(pieces) / 2, drawn


async def test_the_send_button_leaves_the_message_box_ready_for_the_next_one(
    webchat: Webchat, context: Any
) -> None:
    """A tap on Send left the focus on the button: on a phone the keyboard closed after each
    message, and on a computer the next one needed a click in the box first."""
    page = await open_chat(context, webchat)
    box = page.get_by_role("textbox", name="Message")
    await box.fill("sent with the button")
    await page.get_by_role("button", name="Send message").click()
    await expect(page.locator(".msg-assistant .bubble")).to_have_text(
        ["echo: sent with the button"]
    )
    await expect(box).to_be_focused()
    await page.keyboard.type("and the next one")
    await page.keyboard.press("Enter")
    await expect(page.locator(".msg-assistant .bubble")).to_have_text(
        ["echo: sent with the button", "echo: and the next one"]
    )


async def test_new_conversation_and_switching(webchat: Webchat, context: Any) -> None:
    page = await open_chat(context, webchat)
    await say(page, "first topic")
    await expect(page.locator(".msg-assistant .bubble")).to_have_text(["echo: first topic"])
    new = page.get_by_role("button", name="New conversation", exact=True)
    await new.click()
    conversations = page.locator(".conversation-list .conversation")
    await expect(conversations).to_have_count(2)
    await expect(page.locator(".msg")).to_have_count(0)
    await expect(page.get_by_role("textbox", name="Message")).to_be_focused()
    await new.click()  # the new one is still empty: no second empty conversation
    await expect(conversations).to_have_count(2)
    await say(page, "second topic")
    await expect(page.locator(".msg .bubble")).to_have_text(["second topic", "echo: second topic"])
    await expect(conversations.first).to_contain_text("second topic")
    await expect(conversations.first).to_have_attribute("aria-current", "true")
    await conversations.nth(1).click()
    await expect(page.locator(".msg .bubble")).to_have_text(["first topic", "echo: first topic"])
    assert len({m.thread_id for m in webchat.echo.turns}) == 2


async def test_reconnects_by_itself_and_resumes(webchat: Webchat, context: Any) -> None:
    page = await open_chat(context, webchat)
    await say(page, "before")
    await expect(page.locator(".msg .bubble")).to_have_text(["before", "echo: before"])
    await webchat.connector.close_sockets()
    thread_id = webchat.echo.turns[0].thread_id
    await webchat.connector.send(OutboundMessage(thread_id=thread_id, text="said while away"))
    await expect(page.locator("#status")).to_have_attribute("data-state", "online")
    await expect(page.locator(".msg .bubble")).to_have_text(
        ["before", "echo: before", "said while away"]
    )
    await say(page, "after")
    await expect(page.locator(".msg .bubble")).to_have_text(
        ["before", "echo: before", "said while away", "after", "echo: after"]
    )


async def test_a_page_outlives_a_restart_of_the_bridge_on_its_generated_token(
    context: Any, tmp_path: Path
) -> None:
    """The embedded default: no token configured. What is typed while the bridge is down is
    sent once it is back, on the same link."""
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]
    config = BridgeConfig.model_validate(
        {"store": f"sqlite:///{tmp_path / 'talkbridge.db'}", "webchat": {"port": port}}
    )
    first = Bridge(config)
    await first.start()
    url = await first.webchat_url()
    page = await context.new_page()
    await page.goto(url)
    await say(page, "before")
    await expect(page.locator(".msg .bubble")).to_have_text(["before", "before"])
    await first.stop()
    await expect(page.locator("#status")).not_to_have_attribute("data-state", "online")
    await say(page, "while down")
    second = Bridge(config)
    await second.start()
    try:
        assert await second.webchat_url() == url
        await expect(page.locator("#status")).to_have_attribute("data-state", "online")
        await expect(page.locator(".msg .bubble")).to_have_text(
            ["before", "before", "while down", "while down"]
        )
    finally:
        await second.stop()


async def test_a_wrong_token_gets_a_clear_page(webchat: Webchat, context: Any) -> None:
    page = await context.new_page()
    response = await page.goto(page_url(webchat, "not-the-token"))
    assert response is not None and response.status == 401
    await expect(page.get_by_role("heading")).to_have_text("This access token is not valid")
    await expect(page.locator("body")).to_contain_text("talkbridge run")
    response = await page.goto(f"{webchat.http}/")
    assert response is not None and response.status == 401
    await expect(page.get_by_role("heading")).to_have_text("This link has no access token")


async def test_the_link_token_leaves_the_address_bar_and_the_plain_address_opens(
    webchat: Webchat, context: Any
) -> None:
    page = await open_chat(context, webchat)
    assert "token" not in page.url  # not in screenshots, shared screens or copied links
    await say(page, "  indented\n    twice")
    user = page.locator(".msg-user .bubble")
    await expect(page.locator(".msg-assistant")).to_have_count(1)
    assert await user.evaluate("b => b.innerText") == "  indented\n    twice"  # as typed

    await page.goto(f"{webchat.http}/")  # a bookmark of the plain address, a reload
    await expect(page.locator("#status")).to_have_attribute("data-state", "online")
    await expect(page.locator(".msg-assistant .bubble")).to_have_count(1)


async def test_the_page_opens_with_either_the_cookie_or_the_saved_token(
    webchat: Webchat, context: Any
) -> None:
    page = await open_chat(context, webchat)
    await page.evaluate("localStorage.removeItem('talkbridge.token')")  # the cookie remains
    await page.goto(f"{webchat.http}/")
    await expect(page.locator("#status")).to_have_attribute("data-state", "online")

    await page.evaluate("token => localStorage.setItem('talkbridge.token', token)", TOKEN_A)
    await context.clear_cookies()  # expired, or arriving from another site's link
    await page.goto(f"{webchat.http}/")
    await expect(page.locator("#status")).to_have_attribute("data-state", "online")
    assert "token" not in page.url


async def test_losing_the_network_shows_and_what_was_typed_goes_out_once_it_is_back(
    webchat: Webchat, context: Any
) -> None:
    page = await open_chat(context, webchat)
    await context.set_offline(True)
    status = page.locator("#status")
    await expect(status).to_have_attribute("data-state", "offline")
    await expect(status).to_contain_text("No network")
    await say(page, "typed offline")
    await expect(page.locator(".msg.pending .meta")).to_have_text("Waiting for the connection…")
    await context.set_offline(False)
    await expect(status).to_have_attribute("data-state", "online")
    await expect(page.locator(".msg .bubble")).to_have_text(
        ["typed offline", "echo: typed offline"]
    )
    assert len(webchat.echo.turns) == 1


async def test_what_a_closed_tab_typed_offline_is_sent_by_the_tab_still_open(
    webchat: Webchat, context: Any
) -> None:
    # Tabs share the stored outbox: the tab that reconnects must not wipe another's message.
    typing_tab = await open_chat(context, webchat)
    other_tab = await open_chat(context, webchat)
    await context.set_offline(True)
    for page in (typing_tab, other_tab):
        await expect(page.locator("#status")).to_have_attribute("data-state", "offline")
    await say(typing_tab, "typed in the closed tab")
    await expect(other_tab.locator(".msg.pending .bubble")).to_have_text(
        ["typed in the closed tab"]
    )
    await typing_tab.close()
    await say(other_tab, "typed in the open tab")
    await context.set_offline(False)
    bubbles = other_tab.locator(".msg:not(.pending) .bubble")
    await expect(bubbles).to_have_count(4)
    shown = await bubbles.all_inner_texts()
    mine = ["typed in the closed tab", "typed in the open tab"]
    assert sorted(shown) == sorted([*mine, *(f"echo: {t}" for t in mine)])
    assert all(shown.index(t) < shown.index(f"echo: {t}") for t in mine)
    assert [m.text for m in webchat.echo.turns] == [
        "typed in the closed tab",
        "typed in the open tab",
    ]


async def test_resuming_many_threads_past_the_rate_limit_loses_none(
    webchat: Webchat, context: Any
) -> None:
    page = await open_chat(context, webchat)
    conversations = page.locator(".conversation-list .conversation")
    for n in range(5):
        if n:
            await page.get_by_role("button", name="New conversation", exact=True).click()
            await expect(conversations).to_have_count(n + 1)
        await say(page, f"topic {n}")
        await expect(page.locator(".msg-assistant .bubble")).to_have_text([f"echo: topic {n}"])
    threads = {m.text: m.thread_id for m in webchat.echo.turns}
    # The resume after a reconnect asks for every thread at once: more than the burst allows.
    webchat.connector.frame_burst = 2
    webchat.connector.frame_rate = 4.0
    await webchat.connector.close_sockets()
    for n in range(5):
        text = f"said while away {n}"
        await webchat.connector.send(OutboundMessage(thread_id=threads[f"topic {n}"], text=text))
    await expect(page.locator("#status")).to_have_attribute("data-state", "online")
    for n in range(5):
        await conversations.filter(has_text=f"topic {n}").click()
        await expect(page.locator(".msg .bubble")).to_have_text(
            [f"topic {n}", f"echo: topic {n}", f"said while away {n}"]
        )


async def test_a_resume_the_server_failed_on_is_asked_again_and_loses_nothing(
    webchat: Webchat, context: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    page = await open_chat(context, webchat)
    await say(page, "before")
    await expect(page.locator(".msg .bubble")).to_have_text(["before", "echo: before"])
    store = webchat.connector.context.store
    history = store.history
    failures = [StoreError("redis store at 127.0.0.1:6379/0: Connection refused")]

    async def down_once(*args: Any, **kwargs: Any) -> Any:
        if failures:
            raise failures.pop()  # the store blinks: an internal error, "send it again"
        return await history(*args, **kwargs)

    monkeypatch.setattr(store, "history", down_once)
    await webchat.connector.close_sockets()
    thread_id = webchat.echo.turns[0].thread_id
    await webchat.connector.send(OutboundMessage(thread_id=thread_id, text="said while away"))
    await expect(page.locator("#status")).to_have_attribute("data-state", "online")
    # The page's resume failed once; it was dropped, and this message never showed.
    await expect(page.locator(".msg .bubble")).to_have_text(
        ["before", "echo: before", "said while away"]
    )
    assert failures == []


async def test_a_connection_that_stops_answering_is_dropped_and_made_again(
    webchat: Webchat, context: Any
) -> None:
    """A socket that never closes but carries nothing (a lost Wi-Fi, a sleeping laptop): the
    page's heartbeat notices, instead of showing "Connected" over a dead line."""
    page = await context.new_page()
    await page.clock.install()  # the page's timers run when the test says so
    dead = {"now": False}

    def relay(ws: Any) -> None:
        server = ws.connect_to_server()
        ws.on_message(lambda message: None if dead["now"] else server.send(message))
        server.on_message(lambda message: None if dead["now"] else ws.send(message))

    await page.route_web_socket("**/ws", relay)
    await page.goto(page_url(webchat))
    status = page.locator("#status")
    await expect(status).to_have_attribute("data-state", "online")
    dead["now"] = True
    await page.clock.run_for(20_000)  # the heartbeat's ping goes unanswered...
    await expect(status).to_have_attribute("data-state", "online")
    await page.clock.run_for(10_000)  # ...for 10 s: the connection is dropped
    await expect(status).not_to_have_attribute("data-state", "online")
    dead["now"] = False
    await page.clock.run_for(2_000)  # the first reconnect comes within a second
    await expect(status).to_have_attribute("data-state", "online")


async def test_earlier_messages_load_when_asked(start_webchat: Any, context: Any) -> None:
    webchat = await start_webchat(history_limit=4)
    page = await open_chat(context, webchat)
    for n in range(3):
        await say(page, f"m{n}")
        await expect(page.locator(".msg-assistant")).to_have_count(n + 1)
    await page.reload()
    await expect(page.locator(".msg .bubble")).to_have_text(["m1", "echo: m1", "m2", "echo: m2"])
    await page.get_by_role("button", name="Show earlier messages").click()
    await expect(page.locator(".msg .bubble")).to_have_text(
        ["m0", "echo: m0", "m1", "echo: m1", "m2", "echo: m2"]
    )
    await expect(page.get_by_role("button", name="Show earlier messages")).to_have_count(0)


async def test_a_page_back_on_an_empty_conversation_offers_what_came_before_the_latest(
    start_webchat: Any, context: Any
) -> None:
    """It held nothing of the thread, so its resume asked from the start (`after_seq: 0`): that
    is the latest page, and the messages before it were missing with no way to show them."""
    webchat = await start_webchat(history_limit=4)
    page = await open_chat(context, webchat)
    await context.set_offline(True)
    await expect(page.locator("#status")).to_have_attribute("data-state", "offline")
    session_id = await page.evaluate("localStorage.getItem('talkbridge.session')")
    phone = await webchat.authed(session_id=session_id)  # the same user on another device
    for n in range(3):
        await phone.turn(f"m{n}", f"m{n}")
    await context.set_offline(False)
    await expect(page.locator(".msg .bubble")).to_have_text(["m1", "echo: m1", "m2", "echo: m2"])
    await page.get_by_role("button", name="Show earlier messages").click()
    await expect(page.locator(".msg .bubble")).to_have_text(
        ["m0", "echo: m0", "m1", "echo: m1", "m2", "echo: m2"]
    )


async def test_phone_sized_layout_opens_the_conversation_list(
    webchat: Webchat, browser: Any
) -> None:
    context = await browser.new_context(
        viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True
    )
    try:
        page = await context.new_page()
        await page.goto(page_url(webchat))
        await expect(page.locator("#status")).to_have_attribute("data-state", "online")
        sidebar_button = page.get_by_role("button", name="Show conversations")
        await expect(sidebar_button).to_be_visible()
        await expect(
            page.get_by_role("button", name="New conversation", exact=True)
        ).not_to_be_in_viewport()
        await sidebar_button.click()
        await expect(
            page.get_by_role("button", name="New conversation", exact=True)
        ).to_be_in_viewport()
        # The drawer holds the keyboard while open; closing it gives focus back to its button.
        assert await page.evaluate("document.querySelector('main').inert") is True
        await page.keyboard.press("Escape")
        await expect(sidebar_button).to_be_focused()
        assert await page.evaluate("document.querySelector('main').inert") is False
        # A drawer left open when the window widens (a rotated tablet) must not leave the
        # chat inert.
        await sidebar_button.click()
        await page.set_viewport_size({"width": 1100, "height": 800})
        await page.wait_for_function("() => !document.querySelector('main').inert")
        await page.get_by_role("textbox", name="Message").fill("typed on the wide screen")
        await page.set_viewport_size({"width": 390, "height": 844})
        await say_on_a_phone(page, "from a phone")
        await expect(page.locator(".msg-assistant .bubble")).to_have_text(["echo: from a phone"])
        width = await page.evaluate("document.documentElement.scrollWidth")
        assert width <= 390  # nothing sticks out sideways

        # A long code line scrolls inside its own block; the conversation does not widen.
        await say_on_a_phone(page, "code:\n```\n" + "x = long_name + " * 40 + "\n```")
        code = page.locator(".msg-assistant pre")
        await expect(code).to_have_count(1)
        widths = await code.evaluate("pre => [pre.scrollWidth, pre.clientWidth]")
        assert widths[0] > widths[1]  # it has its own scroll
        box = await page.evaluate(
            "[...document.querySelectorAll('#messages, html')].map("
            "e => e.scrollWidth <= e.clientWidth)"
        )
        assert box == [True, True]

        # The longest status there is still leaves the conversation's title readable.
        await context.set_offline(True)
        await expect(page.locator("#status")).to_contain_text("No network")
        title, status = await page.evaluate(
            "['#chat-title', '#status'].map(s => document.querySelector(s)"
            ".getBoundingClientRect().width)"
        )
        assert title >= 120 and status >= 120, (title, status)
        assert await page.evaluate("document.documentElement.scrollWidth") <= 390
    finally:
        await context.close()


async def test_markdown_subset_builds_only_safe_nodes(webchat: Webchat, context: Any) -> None:
    page = await open_chat(context, webchat)
    source = "\n".join(
        [
            "# Title",
            "- one **two** *three*",
            "- [data](data:text/html,<script>x</script>) [ok](http://example.com/?a=1&b=<i>)",
            "",
            "3. third",
            "4. fourth",
            "",
            "```html",
            "<script>window.__pwned=1</script>",
            "```",
            "> <img src=x onerror=window.__pwned=1>",
        ]
    )
    html = await page.evaluate(
        """async (source) => {
            const { renderMarkdown } = await import('/static/markdown.js');
            const box = document.createElement('div');
            box.append(renderMarkdown(source));
            document.body.append(box);
            return box.innerHTML;
        }""",
        source,
    )
    assert "<ul><li>one <strong>two</strong> <em>three</em></li>" in html
    assert '<ol start="3"><li>third</li><li>fourth</li></ol>' in html
    assert (
        '<pre><code data-lang="html">&lt;script&gt;window.__pwned=1&lt;/script&gt;</code></pre>'
        in html
    )
    assert "<blockquote>&lt;img src=x onerror=window.__pwned=1&gt;</blockquote>" in html
    assert 'href="http://example.com/?a=1&amp;b=%3Ci%3E"' in html
    assert "data:" not in html.split("href=")[-1] and html.count("<a ") == 1
    assert "<script" not in html and "<img" not in html
    assert await page.evaluate("window.__pwned") is None


@pytest.mark.parametrize(
    ("source", "html"),
    [
        (
            "see https://en.wikipedia.org/wiki/Foo_(bar), ok",
            'see <a href="https://en.wikipedia.org/wiki/Foo_(bar)"',
        ),
        ("(at https://example.com/x)", '<a href="https://example.com/x" '),
        (
            "[wiki](https://en.wikipedia.org/wiki/Foo_(bar))",
            'href="https://en.wikipedia.org/wiki/Foo_(bar)"',
        ),
        ("[mail](mailto:help@example.com)", '<a href="mailto:help@example.com"'),
        ("<https://example.com/auto>", '<a href="https://example.com/auto"'),
        ("~~gone~~ and ***both***", "<del>gone</del> and <strong><em>both</em></strong>"),
        ("above\n\n---\n\nbelow", "<p>above</p><hr><p>below</p>"),
        ("![a cat](https://example.com/cat.png)", '<a href="https://example.com/cat.png"'),
        ("inline ```x``` code", "inline <code>x</code> code"),
        ("[x](javascript:alert(1))", "[x](javascript:alert(1))"),
    ],
)
async def test_markdown_links_and_marks(
    webchat: Webchat, context: Any, source: str, html: str
) -> None:
    page = await context.new_page()
    await page.goto(page_url(webchat))
    rendered = await page.evaluate(
        """async (source) => {
            const { renderMarkdown } = await import('/static/markdown.js');
            const box = document.createElement('div');
            box.append(renderMarkdown(source));
            return box.innerHTML;
        }""",
        source,
    )
    assert html in rendered, rendered
    assert "javascript:" not in rendered.split("href=", 1)[-1] or "href=" not in rendered


def _wipe(folder: Path, pattern: str) -> None:
    for path in folder.glob(pattern):
        path.unlink()


HOSTILE = 64 * 1024
"""A reply as long as a frame may be, made of what sends a naive inline scanner to the end of
the line from every character: it rendered in quadratic time, again at every streamed piece."""


async def test_markdown_renders_hostile_replies_in_steps_linear_in_their_length(
    webchat: Webchat, context: Any
) -> None:
    page = await context.new_page()
    await page.goto(page_url(webchat))
    results = await page.evaluate(
        """async (n) => {
            const { renderMarkdown, work } = await import('/static/markdown.js');
            const inputs = {
                brackets: '['.repeat(n),
                images: '!['.repeat(n / 2),
                'brackets then a link': '['.repeat(n / 2) + '](https://example.com/)',
                'brackets, an unclosed target': '['.repeat(n / 2) + '](' + 'a'.repeat(n / 2),
                'a link each': '[a](https://x.example/)'.repeat(n / 23),
                'unclosed targets': '[a]('.repeat(n / 4),
                'a URL then parentheses': 'https://example.com/' + ')'.repeat(n),
                'code marks': '`a'.repeat(n / 2),
                'bold marks': '**a'.repeat(n / 3),
                'unclosed autolinks': '<https://a'.repeat(n / 10),
                'underscores': ' _a'.repeat(n / 3),
                'strikes': '~~a'.repeat(n / 3),
                'stars then an underscore': '*'.repeat(n) + '_',
                'h then a backtick': 'h'.repeat(n) + '`',
                'marks then their closers': '<*_~`!['.repeat(n / 7) + '>*_~`])',
            };
            const out = {};
            for (const [name, text] of Object.entries(inputs)) {
                work.steps = 0;
                const box = document.createElement('div');
                box.append(renderMarkdown(text));
                out[name] = {
                    length: text.length,
                    steps: work.steps,
                    text: box.textContent === text,
                    links: box.querySelectorAll('a').length,
                };
            }
            return out;
        }""",
        HOSTILE,
    )
    for name, result in results.items():
        # Each character is looked at a few times (by each rule it may start or end, at each
        # of up to five levels of nested marks), never once per earlier character (which made
        # 32,768 steps a character for 64 KiB of `[`).
        assert result["steps"] <= 40 * result["length"], (name, result)
    plain = ["brackets", "images", "brackets, an unclosed target", "unclosed targets"]
    assert all(results[name]["text"] for name in plain), results  # shown as they came
    assert results["brackets then a link"]["links"] == 1
    assert results["a link each"]["links"] == HOSTILE // 23
    assert results["a URL then parentheses"]["links"] == 1
    assert results["brackets"]["links"] == results["unclosed targets"]["links"] == 0


async def test_what_waited_to_be_sent_when_the_store_was_wiped_stays_to_send_again(
    context: Any, tmp_path: Path
) -> None:
    """A static token: the wiped store gives the page a new session, whose conversations are
    not the ones the waiting message was typed in. It was deleted without a word."""
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]
    db = tmp_path / "talkbridge.db"
    config = BridgeConfig.model_validate(
        {"store": f"sqlite:///{db}", "webchat": {"port": port, "tokens": [TOKEN_A]}}
    )
    first = Bridge(config)
    await first.start()
    page = await context.new_page()
    await page.goto(f"http://127.0.0.1:{port}/?token={quote(TOKEN_A)}")
    await say(page, "before")
    await expect(page.locator(".msg .bubble")).to_have_text(["before", "before"])
    await first.stop()
    await expect(page.locator("#status")).not_to_have_attribute("data-state", "online")
    await say(page, "while down")
    await asyncio.to_thread(_wipe, tmp_path, "talkbridge.db*")
    second = Bridge(config)
    await second.start()
    try:
        await expect(page.locator("#status")).to_have_attribute("data-state", "online")
        unsent = page.locator(".msg.failed")
        await expect(unsent.locator(".bubble")).to_have_text(["while down"])
        await expect(unsent.locator(".meta")).to_contain_text("Not sent")
        await page.reload()  # kept across a reload too
        await expect(page.locator("#status")).to_have_attribute("data-state", "online")
        await unsent.get_by_role("button", name="Send again").click()
        await expect(page.locator(".msg .bubble")).to_have_text(["while down", "while down"])
        await expect(unsent).to_have_count(0)
    finally:
        await second.stop()


async def test_what_waited_to_be_sent_when_another_tokens_link_opened_stays_to_send_again(
    webchat: Webchat, context: Any
) -> None:
    """The stored session is the other token's (closed with 4403): the page starts a new
    session, and what waited for the old one is shown as not sent, not deleted."""
    first = await open_chat(context, webchat)
    await context.set_offline(True)
    await expect(first.locator("#status")).to_have_attribute("data-state", "offline")
    await say(first, "typed with the first link")
    await expect(first.locator(".msg.pending .bubble")).to_have_text(["typed with the first link"])
    await first.close()
    await context.set_offline(False)
    page = await context.new_page()
    await page.goto(page_url(webchat, TOKEN_B))
    await expect(page.locator("#status")).to_have_attribute("data-state", "online")
    unsent = page.locator(".msg.failed")
    await expect(unsent.locator(".bubble")).to_have_text(["typed with the first link"])
    await unsent.get_by_role("button", name="Send again").click()
    await expect(page.locator(".msg .bubble")).to_have_text(
        ["typed with the first link", "echo: typed with the first link"]
    )
    (turn,) = webchat.echo.turns
    assert turn.channel_user_id == await page.evaluate("localStorage['talkbridge.session']")


async def test_a_message_of_invisible_characters_is_not_sent_and_the_page_says_why(
    webchat: Webchat, context: Any
) -> None:
    # Zero-width spaces and joiners are no whitespace to `trim()`: the page sent them, and
    # showed the server's `bad send frame: text: …` as the reason it was not sent.
    page = await open_chat(context, webchat)
    await say(page, "\u200b\u2060\u200d")
    await expect(page.locator("#toast")).to_contain_text("Nothing to send")
    await expect(page.get_by_role("textbox", name="Message")).to_have_value("\u200b\u2060\u200d")
    await say(page, "shown")
    await expect(page.locator(".msg .bubble")).to_have_text(["shown", "echo: shown"])
    await expect(page.locator(".msg.failed")).to_have_count(0)
    assert [t.text for t in webchat.echo.turns] == ["shown"]


async def test_a_browser_past_the_tokens_session_limit_is_told_so_and_others_go_on(
    start_webchat: Any, context: Any, browser: Any
) -> None:
    chat = await start_webchat(max_sessions_per_token=1)
    page = await open_chat(context, chat)  # the one session the token may start
    other = await browser.new_context()
    try:
        refused = await other.new_page()
        await refused.goto(page_url(chat))
        await expect(refused.locator("#fatal-title")).to_have_text(
            "This link cannot start another session", timeout=MS
        )
        await expect(refused.locator("#fatal-text")).to_contain_text("a link of your own")
    finally:
        await other.close()
    await page.reload()  # the browser that has its session goes on
    await say(page, "still here")
    await expect(page.locator(".msg .bubble")).to_have_text(["still here", "echo: still here"])


def starter_bridge(folder: Path, **options: Any) -> Bridge:
    """A bridge in `folder` as `talkbridge init` leaves it: its keyword-router hook drops
    "buy spam"."""
    write_starter(folder)
    config, secrets = parse_config(
        {
            "store": "sqlite:///talkbridge.db",
            "webchat": {"host": "127.0.0.1", "port": 0},
            "hooks": ["hooks/channel-message/keyword-router"],
        },
        folder,
    )
    return Bridge(config, secrets, **options)


async def test_a_message_a_hook_drops_shows_not_answered_under_it_and_after_a_reload(
    context: Any, tmp_path: Path
) -> None:
    """The README's steps: `talkbridge init`'s keyword-router drops "buy spam". The page said
    nothing, and the message sat there waiting for a reply that would never come."""
    bridge = starter_bridge(tmp_path)
    await bridge.start()
    try:
        page = await context.new_page()
        await page.goto(await bridge.webchat_url())
        await say(page, "buy spam")
        note = page.locator(".msg-note")
        await expect(note).to_have_text(["Not answered"])
        await expect(note).to_have_attribute("data-code", "not_answered")
        await say(page, "I want a refund")
        await expect(page.locator(".msg-assistant .bubble")).to_have_text(
            ["[billing] I want a refund"]
        )
        # In its place: right under the message it is about, on the user's side.
        rows = page.locator(".msg")
        await expect(rows).to_have_count(4)
        classes = [await rows.nth(i).get_attribute("class") for i in range(4)]
        assert [c.split()[1] for c in classes] == [
            "msg-user",
            "msg-note",
            "msg-user",
            "msg-assistant",
        ]
        user, shown = (
            await page.locator(".msg-user").first.bounding_box(),
            await note.bounding_box(),
        )
        assert user is not None and shown is not None
        assert shown["y"] >= user["y"] + user["height"]  # below it
        assert abs((shown["x"] + shown["width"]) - (user["x"] + user["width"])) < 2  # aligned
        await page.reload()
        await expect(page.locator(".msg-note")).to_have_text(["Not answered"])
        assert "looks like spam" not in await page.content()
    finally:
        await bridge.stop()


async def test_a_note_after_other_messages_quotes_the_message_it_is_about(
    context: Any, tmp_path: Path
) -> None:
    """Messages typed while a reply is on its way wait their turn: the dropped one's note comes
    after those typed behind it, and names the message it is about."""
    agent = GatedAgent()
    bridge = starter_bridge(tmp_path, agents={"echo": agent})
    await bridge.start()
    try:
        page = await context.new_page()
        await page.goto(await bridge.webchat_url())
        await say(page, "hello")
        await asyncio.wait_for(agent.started["hello"].wait(), TIMEOUT)
        for text in ("buy spam", "and this"):
            await say(page, text)
        await expect(page.locator(".msg-user .bubble")).to_have_text(
            ["hello", "buy spam", "and this"]
        )
        agent.gates["hello"].set()
        agent.gates["and this"].set()
        note = page.locator(".msg-note")
        await expect(note).to_have_text(["Not answered: “buy spam”"])
        await expect(page.locator(".msg-assistant .bubble")).to_have_text(
            ["answer to hello", "answer to and this"]
        )
        await page.reload()
        await expect(page.locator(".msg-note")).to_have_text(["Not answered: “buy spam”"])
    finally:
        await bridge.stop()


def _escalating_to_a_desk(tmp_path: Path) -> tuple[Bridge, TalkConnector]:
    """A bridge whose hook passes "urgent" messages on to the `oncall-desk` connection."""
    hooks = HookRegistry()

    @hooks.channel_message(name="escalate-to-oncall")
    async def escalate(msg: NormalizedMessage) -> Forward | None:
        return Forward("oncall-desk", thread_id="room-7") if "urgent" in msg.text else None

    config = BridgeConfig.model_validate(
        {"store": f"sqlite:///{tmp_path / 'talkbridge.db'}", "webchat": {"port": 0}}
    )
    bridge = Bridge(config, hooks=hooks)
    desk = TalkConnector("oncall-desk")
    bridge.registry.add(desk, ConnectionConfig(id="oncall-desk", channel="telegram"))
    return bridge, desk


async def test_a_message_a_hook_forwards_shows_passed_on_under_it_and_after_a_reload(
    context: Any, tmp_path: Path
) -> None:
    """A hook passing a message on to another connection left it waiting for a reply that
    would never come here, without a word. "Passed on" shows under it, naming nowhere."""
    bridge, desk = _escalating_to_a_desk(tmp_path)
    await bridge.start()
    try:
        page = await context.new_page()
        await page.goto(await bridge.webchat_url())
        await say(page, "urgent: the printer is on fire")
        note = page.locator(".msg-note")
        await expect(note).to_have_text(["Passed on"])
        await expect(note).to_have_attribute("data-code", "forwarded")
        await expect(note).to_have_class("msg msg-note msg-note-user")  # under the message
        assert desk.texts()[0].endswith("urgent: the printer is on fire")
        await say(page, "thanks")
        await expect(page.locator(".msg-assistant .bubble")).to_have_text(["thanks"])
        await page.reload()
        await expect(page.locator(".msg-note")).to_have_text(["Passed on"])
        await expect(page.locator(".msg .bubble")).to_have_count(3)
        content = await page.content()
        assert "oncall" not in content and "room-7" not in content
    finally:
        await bridge.stop()


async def test_passed_on_shows_as_soon_as_the_hook_decided_not_when_the_send_is_done(
    context: Any, tmp_path: Path
) -> None:
    """ "Passed on" waited for the forward's send to finish: a target still starting, or
    waiting out a 429 and its retries, left the sender without a word all that while. It shows
    once the hook decided; a forward that then fails for good adds "Not answered" under it."""
    bridge, desk = _escalating_to_a_desk(tmp_path)
    delivering = asyncio.Event()
    desk.script.append(delivering.wait)  # the desk's platform takes its time
    await bridge.start()
    try:
        page = await context.new_page()
        await page.goto(await bridge.webchat_url())
        await say(page, "urgent: the printer is on fire")
        note = page.locator(".msg-note")
        await expect(note).to_have_text(["Passed on"])
        assert desk.attempts == 1 and desk.sent == []  # still on its way
        delivering.set()
        await desk.wait_sent(1)
        # The next one is refused for good after the note said "Passed on": nobody answers.
        desk.script.append(PermanentError("chat not found"))
        await say(page, "urgent: and the fax")
        await expect(note).to_have_text(["Passed on", "Passed on", "Not answered"])
        await page.reload()
        await expect(note).to_have_text(["Passed on", "Passed on", "Not answered"])
    finally:
        await bridge.stop()
