"""The page as a user meets it: typing on a phone, a reply being prepared elsewhere, a lost
connection, a screen reader, and everything the bridge can refuse."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from talkbridge.message import OutboundMessage
from talkbridge.webchat import sessions
from tests.webchat.conftest import (
    ANNOUNCED,
    FRAMES,
    MS,
    TOKEN_B,
    StartWebchat,
    Webchat,
    expect,
    open_chat,
    page_swallowing_sends,
    page_url,
    say,
    say_on_a_phone,
)


async def test_on_a_phone_enter_starts_a_new_line_and_the_send_button_sends(
    webchat: Webchat, browser: Any
) -> None:
    """Enter always sent (`enterkeyhint="send"`): a phone, which has no Shift key to hand,
    could not write a message of two lines."""
    phone = await browser.new_context(
        viewport={"width": 375, "height": 667}, is_mobile=True, has_touch=True
    )
    phone.set_default_timeout(MS)
    try:
        page = await open_chat(phone, webchat)
        box = page.get_by_role("textbox", name="Message")
        await expect(box).to_have_attribute("enterkeyhint", "enter")
        await box.tap()
        await page.keyboard.type("first line")
        await page.keyboard.press("Enter")
        await page.keyboard.type("second line")
        await expect(box).to_have_value("first line\nsecond line")
        await expect(page.locator(".msg")).to_have_count(0)  # nothing went out
        await page.get_by_role("button", name="Send message").tap()
        await expect(page.locator(".msg-assistant")).to_have_count(1)
        assert await page.locator(".msg-user .bubble").inner_text() == "first line\nsecond line"
        assert [t.text for t in webchat.echo.turns] == ["first line\nsecond line"]
        await expect(box).to_have_value("")
    finally:
        await phone.close()


async def test_on_a_computer_enter_sends_and_shift_enter_starts_a_new_line(
    webchat: Webchat, context: Any
) -> None:
    page = await open_chat(context, webchat)
    box = page.get_by_role("textbox", name="Message")
    await expect(box).to_have_attribute("enterkeyhint", "send")
    await expect(page.locator("#hint")).to_have_text("Enter to send · Shift+Enter for a new line")
    await box.click()
    await page.keyboard.type("first line")
    await page.keyboard.press("Shift+Enter")
    await page.keyboard.type("second line")
    await expect(box).to_have_value("first line\nsecond line")
    await page.keyboard.press("Enter")
    await expect(page.locator(".msg-assistant")).to_have_count(1)
    assert await page.locator(".msg-user .bubble").inner_text() == "first line\nsecond line"
    assert [t.text for t in webchat.echo.turns] == ["first line\nsecond line"]
    await expect(box).to_have_value("")


async def test_a_reply_being_prepared_in_another_conversation_shows_once_it_is_opened(
    webchat: Webchat, context: Any
) -> None:
    """The typing notice of a conversation not shown was dropped: opening it while the
    assistant still prepared its reply showed nothing (the server does not say it again)."""
    page = await open_chat(context, webchat)
    await say(page, "first topic")
    await expect(page.locator(".msg-assistant .bubble")).to_have_text(["echo: first topic"])
    (turn,) = webchat.echo.turns
    await page.get_by_role("button", name="New conversation", exact=True).click()
    await expect(page.locator(".msg")).to_have_count(0)
    typing = page.locator("#typing")
    await webchat.connector.typing(turn.thread_id)
    await expect(typing).to_be_hidden()  # not in the conversation shown
    conversations = page.locator(".conversation-list .conversation")
    await conversations.filter(has_text="first topic").click()
    await expect(typing).to_be_visible()
    await conversations.filter(has_text="New conversation").click()
    await expect(typing).to_be_hidden()
    await conversations.filter(has_text="first topic").click()
    await expect(typing).to_be_visible()
    await webchat.connector.send(OutboundMessage(thread_id=turn.thread_id, text="the reply"))
    await expect(page.locator(".msg-assistant .bubble").last).to_have_text("the reply")
    await expect(typing).to_be_hidden()


async def test_reconnecting_counts_down_and_can_be_asked_at_once(
    webchat: Webchat, context: Any
) -> None:
    """ "Reconnecting in 8 s…" stayed on the screen the whole 8 s, and nothing let a user who
    knew the bridge was back try again without waiting."""
    await context.add_init_script(f"({ANNOUNCED})()")
    page = await context.new_page()
    await page.clock.install()  # the page's timers run when the test says so
    down = {"now": False}

    async def relay(ws: Any) -> None:
        if down["now"]:
            await ws.close()  # the bridge is not there: every attempt fails at once
            return
        server = ws.connect_to_server()
        ws.on_message(server.send)
        server.on_message(ws.send)

    await page.route_web_socket("**/ws", relay)
    await page.goto(page_url(webchat))
    status = page.locator("#status")
    await expect(status).to_have_attribute("data-state", "online")
    now = await page.evaluate("Date.now()")
    await page.clock.pause_at(now + 1000)  # from here on, time moves only with run_for
    down["now"] = True
    await webchat.connector.close_sockets()
    countdown = page.locator("#countdown")

    # Each failed attempt waits about twice as long as the one before: wait for one of 3 s+.
    for _ in range(10):
        await expect(countdown).to_have_text(re.compile(r"^Reconnecting in \d+ s…$"))
        seconds = int(re.findall(r"\d+", await countdown.inner_text())[0])
        if seconds >= 3:
            break
        await page.clock.run_for(seconds * 1000)  # the attempt is made (and fails)
    assert seconds >= 3, seconds
    retry = page.get_by_role("button", name="Retry now")
    await expect(retry).to_be_visible()
    for left in range(seconds - 1, seconds - 3, -1):
        await page.clock.run_for(1000)
        await expect(countdown).to_have_text(f"Reconnecting in {left} s…")
    down["now"] = False
    await page.clock.resume()
    await retry.click()
    await expect(status).to_have_attribute("data-state", "online")
    await expect(retry).to_be_hidden()
    await expect(page.get_by_role("textbox", name="Message")).to_be_focused()
    # A screen reader is told once, not every second.
    announced = await page.evaluate("window.__announced")
    assert [a for a in announced if "Reconnecting in" in a] == [], announced
    assert "Not connected; reconnecting shortly." in announced, announced


async def test_a_screen_reader_hears_the_start_of_a_long_reply_the_bubble_shows_it_all(
    webchat: Webchat, context: Any
) -> None:
    """A reply of a few pages was read out whole, unasked, holding up everything after it."""
    await context.add_init_script(f"({ANNOUNCED})()")
    page = await open_chat(context, webchat)
    thread_id = await page.evaluate("localStorage.getItem('talkbridge.active')")
    words = " ".join(f"word{n}" for n in range(400))
    await webchat.connector.send(OutboundMessage(thread_id=thread_id, text=words))
    await expect(page.locator(".msg-assistant .bubble")).to_have_text(words)
    (heard,) = [a for a in await page.evaluate("window.__announced") if "word0" in a]
    assert heard.startswith("Assistant: word0 word1 ") and heard.endswith("…"), heard
    assert len(heard) <= len("Assistant: ") + 201, heard
    assert words.startswith(heard.removeprefix("Assistant: ").removesuffix("…")), heard
    short = "a short reply is read whole"
    await webchat.connector.send(OutboundMessage(thread_id=thread_id, text=short))
    await expect(page.locator(".msg-assistant .bubble").last).to_have_text(short)
    assert f"Assistant: {short}" in await page.evaluate("window.__announced")


async def test_a_message_too_long_to_send_is_told_while_typed_and_nothing_is_lost(
    webchat: Webchat, context: Any
) -> None:
    """The page said it only once Send was pressed, in a toast gone after 6 s."""
    page = await open_chat(context, webchat)  # the test server's limit: 4,096 bytes
    box = page.get_by_role("textbox", name="Message")
    warning = page.locator("#too-long")
    await box.fill("x" * 3000)
    await expect(warning).to_be_hidden()
    long = "é" * 3000  # 6,000 bytes in UTF-8
    await box.fill(long)
    await expect(warning).to_be_visible()
    await expect(warning).to_contain_text("Too long to send: shorten it by about")
    await expect(box).to_have_attribute("aria-invalid", "true")
    await expect(box).to_have_accessible_description(re.compile("Too long to send"))
    await box.press("Enter")
    await expect(page.locator("#toast")).to_contain_text("That message is not sent")
    await expect(box).to_have_value(long)  # nothing lost
    await expect(page.locator(".msg")).to_have_count(0)
    await box.fill("é" * 1000)
    await expect(warning).to_be_hidden()
    await expect(box).not_to_have_attribute("aria-invalid", "true")
    await box.press("Enter")
    await expect(page.locator(".msg-assistant .bubble")).to_have_text(["echo: " + "é" * 1000])


def _rewrite(thread_id: str | None = None, text: Any = None, pad: int = 0) -> Any:
    def change(frame: dict[str, Any]) -> dict[str, Any]:
        if thread_id is not None:
            frame["thread_id"] = thread_id
        if text is not None:
            frame["text"] = text
        if pad:
            frame["pad"] = "x" * pad  # (unknown fields are ignored: only its size counts)
        return frame

    return change


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        ("bad_frame", "the bridge could not read it; reloading the page may help"),
        ("too_large", "it is too long for the bridge (at most 4,096 bytes)"),
        ("empty_message", "it shows nothing: only spaces or invisible characters"),
        ("forbidden", "its conversation belongs to another session"),
        ("not_found", "its conversation is no longer on the bridge"),
    ],
)
async def test_a_message_the_bridge_refuses_says_why_in_words_and_can_go_again(
    webchat: Webchat, context: Any, code: str, reason: str
) -> None:
    """The real server refuses the page's `send` (the test alters it on its way): the page
    showed the server's words for developers (`frame is 9,000 bytes…`, `bad send frame:
    text: …`, `that thread belongs to another session`) as the reason."""
    page = await context.new_page()
    other = await webchat.authed(TOKEN_B)
    changes = {
        "bad_frame": _rewrite(text=42),
        "too_large": _rewrite(pad=5000),
        "empty_message": _rewrite(text="\u200b"),
        "forbidden": _rewrite(thread_id=other.thread_id),
        "not_found": None,  # set once the session is known
    }
    altering = {"on": True}

    def relay(ws: Any) -> None:
        server = ws.connect_to_server()

        def up(message: str) -> None:
            frame = json.loads(message)
            if altering["on"] and frame.get("type") == "send":
                frame = changes[code](frame)
            server.send(json.dumps(frame))

        ws.on_message(up)
        server.on_message(ws.send)

    await page.route_web_socket("**/ws", relay)
    await page.goto(page_url(webchat))
    await expect(page.locator("#status")).to_have_attribute("data-state", "online")
    session_id = await page.evaluate("localStorage.getItem('talkbridge.session')")
    changes["not_found"] = _rewrite(thread_id=f"{session_id}.{'0' * 12}")
    await say(page, "refused once")
    failed = page.locator(".msg.failed")
    await expect(failed.locator(".meta")).to_have_text(
        re.compile(f"^Not sent: {re.escape(reason)}")
    )
    await expect(page.locator("#toast")).to_contain_text("Your message was not sent")
    assert webchat.echo.turns == []
    # The page stays usable: the same message goes again, and new ones go too.
    altering["on"] = False
    await failed.get_by_role("button", name="Send again").click()
    await expect(page.locator(".msg .bubble")).to_have_text(["refused once", "echo: refused once"])
    await say(page, "and on")
    await expect(page.locator(".msg-assistant .bubble").last).to_have_text("echo: and on")
    await expect(failed).to_have_count(0)


async def test_opening_the_link_of_another_token_shows_no_server_words(
    webchat: Webchat, context: Any
) -> None:
    """The stored session belongs to the first link's token (`forbidden`, close 4403): the page
    starts a new session at once, as it should, yet first showed the server's `that session
    belongs to another token; start a new session` in a toast."""
    page = await open_chat(context, webchat)
    await page.goto(page_url(webchat, TOKEN_B))
    await expect(page.locator("#status")).to_have_attribute("data-state", "online")
    await say(page, "with the other link")
    await expect(page.locator(".msg-assistant .bubble")).to_have_text(["echo: with the other link"])
    await expect(page.locator("#toast")).to_be_hidden()


async def test_a_new_conversation_past_the_limit_is_told_in_words_and_the_page_goes_on(
    start_webchat: StartWebchat, context: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sessions, "MAX_CONVERSATIONS", 2)  # (1,000 takes long to reach)
    chat = await start_webchat()
    page = await open_chat(context, chat)
    new = page.get_by_role("button", name="New conversation", exact=True)
    for n in range(2):
        if n:
            await new.click()
            await expect(page.locator(".msg")).to_have_count(0)
        await say(page, f"topic {n}")
        await expect(page.locator(".msg-assistant .bubble")).to_have_text([f"echo: topic {n}"])
    await new.click()
    toast = page.locator("#toast")
    await expect(toast).to_have_text(
        "No new conversation: this chat already holds as many as it can. Carry on in one of them."
    )
    await say(page, "still here")
    await expect(page.locator(".msg-assistant .bubble").last).to_have_text("echo: still here")


async def test_a_draft_stays_with_its_conversation_across_reloads_and_switches(
    webchat: Webchat, context: Any
) -> None:
    """What was typed and not sent was gone after a reload (or a crashed tab), and a switch to
    another conversation and back lost it too. It is kept per conversation in the page's own
    storage, never sent, and leaves the box and the storage once sent, sent once."""
    page = await context.new_page()
    sent: list[str] = []
    page.on("websocket", lambda ws: ws.on("framesent", lambda frame: sent.append(frame)))
    await page.goto(page_url(webchat))
    await expect(page.locator("#status")).to_have_attribute("data-state", "online")
    box = page.get_by_role("textbox", name="Message")
    conversations = page.locator(".conversation-list .conversation")
    await say(page, "first topic")
    await expect(page.locator(".msg-assistant .bubble")).to_have_text(["echo: first topic"])
    await box.fill("half a thought")
    await page.reload()
    await expect(page.locator("#status")).to_have_attribute("data-state", "online")
    await expect(box).to_have_value("half a thought")
    await page.get_by_role("button", name="New conversation", exact=True).click()
    await expect(conversations).to_have_count(2)
    await expect(box).to_have_value("")  # the new conversation's own (empty) box
    await box.fill("about something else")
    await conversations.filter(has_text="first topic").click()
    await expect(box).to_have_value("half a thought")
    await conversations.filter(has_text="New conversation").click()
    await expect(box).to_have_value("about something else")
    assert not [f for f in sent if "half a thought" in f or "something else" in f]  # local only
    await conversations.filter(has_text="first topic").click()
    await box.press("Enter")
    await expect(page.locator(".msg-assistant .bubble")).to_have_text(
        ["echo: first topic", "echo: half a thought"]
    )
    await expect(box).to_have_value("")
    await page.reload()
    await expect(page.locator("#status")).to_have_attribute("data-state", "online")
    await expect(page.locator(".msg .bubble")).to_have_count(4)
    await expect(box).to_have_value("")  # sent: not a draft any more
    assert [t.text for t in webchat.echo.turns] == ["first topic", "half a thought"]
    drafts = await page.evaluate(
        "Object.keys(localStorage).filter(k => k.startsWith('talkbridge.draft.'))"
    )
    session = await page.evaluate("localStorage['talkbridge.session']")
    (kept,) = drafts  # the other conversation's, under its session and thread
    assert kept.startswith(f"talkbridge.draft.{session}.")
    assert kept != f"talkbridge.draft.{webchat.echo.turns[0].thread_id}"
    await conversations.filter(has_text="New conversation").click()
    await expect(box).to_have_value("about something else")


async def test_a_draft_sent_before_the_bridge_acknowledged_it_comes_back_once_not_twice(
    webchat: Webchat, context: Any
) -> None:
    """Sent, then the page reloaded before the bridge took it: it waits in the outbox and goes
    out from there. Were it still a draft too, the box would offer it again, to send twice.
    A second tab of the conversation shows the draft as it is typed, and empties with it."""
    page, swallow = await page_swallowing_sends(context, webchat)
    other = await open_chat(context, webchat)
    box = page.get_by_role("textbox", name="Message")
    await box.fill("not taken yet")
    await expect(other.get_by_role("textbox", name="Message")).to_have_value("not taken yet")
    await box.press("Enter")
    await expect(page.locator(".msg.pending .bubble")).to_have_text(["not taken yet"])
    await expect(other.get_by_role("textbox", name="Message")).to_have_value("")
    swallow["sends"] = False
    await page.reload()
    await expect(page.locator(".msg .bubble")).to_have_text(
        ["not taken yet", "echo: not taken yet"]
    )
    await expect(box).to_have_value("")
    assert [t.text for t in webchat.echo.turns] == ["not taken yet"]


async def test_drafts_no_box_can_show_again_expire_the_box_s_own_goes_on(
    webchat: Webchat, context: Any
) -> None:
    """Drafts of conversations no longer on the server (a wiped store) or of another session
    (another token's link) stayed in the page's storage for good, piling up. This session's
    of a conversation the server does not list go at the next connect; another session's once
    untouched for 30 days (a tab of it may still be open). The draft in the box goes on into the
    conversation shown, and every draft of a conversation still listed stays."""
    page = await open_chat(context, webchat)
    box = page.get_by_role("textbox", name="Message")
    await say(page, "first topic")
    await expect(page.locator(".msg-assistant .bubble")).to_have_text(["echo: first topic"])
    await page.get_by_role("button", name="New conversation", exact=True).click()
    await box.fill("typed in the second")
    session = await page.evaluate("localStorage['talkbridge.session']")
    first = f"{session}.{webchat.echo.turns[0].thread_id.partition('.')[2]}"
    day = 24 * 3600 * 1000
    planted = {
        f"{session}.0123456789ab": 0,  # this session's, of a conversation the server lost
        f"{'a' * 32}.0123456789ab": 31 * day,  # another session's, a month untouched
        f"{'b' * 32}.0123456789ab": 1 * day,  # another session's, typed in yesterday
        first: 0,  # a listed conversation's, not shown
    }
    await page.evaluate(
        """planted => { for (const [thread, age] of Object.entries(planted)) {
            localStorage['talkbridge.draft.' + thread] =
                JSON.stringify({text: 'draft of ' + thread, at: Date.now() - age});
        } }""",
        planted,
    )
    await page.reload()
    await expect(page.locator("#status")).to_have_attribute("data-state", "online")
    await expect(box).to_have_value("typed in the second")
    kept = await page.evaluate(
        """Object.keys(localStorage).filter(k => k.startsWith('talkbridge.draft.'))
            .map(k => k.slice('talkbridge.draft.'.length))"""
    )
    second = next(t for t in kept if t not in planted)
    assert sorted(kept) == sorted([f"{'b' * 32}.0123456789ab", first, second])
    assert second.startswith(f"{session}.")
    conversations = page.locator(".conversation-list .conversation")
    await conversations.filter(has_text="first topic").click()
    await expect(box).to_have_value(f"draft of {first}")


SEND_IN_SIGHT = """() => {
    const send = document.getElementById('send').getBoundingClientRect();
    const input = document.getElementById('input');
    const box = input.getBoundingClientRect();
    const view = window.visualViewport;
    const inside = r => r.top >= 0 && r.left >= 0 && r.bottom <= view.height
        && r.right <= view.width;
    const hit = document.elementFromPoint(send.left + send.width / 2, send.top + send.height / 2);
    return {
        send: inside(send),
        uncovered: Boolean(hit && hit.closest('#send')),
        box: box.height >= 24 && box.top >= 0 && box.bottom <= view.height,
        end: input.scrollTop + input.clientHeight >= input.scrollHeight - 1,
    };
}"""
"""Whether the Send button is wholly in sight and not covered, and the box with it, showing
its end (without scrolling anything into view first, as a tap would)."""


IN_SIGHT = ("send", "uncovered", "box", "end")


@pytest.mark.parametrize(
    "keyboard_up",
    [{"width": 375, "height": 260}, {"width": 667, "height": 170}],
    ids=["portrait", "landscape"],
)
async def test_on_a_phone_the_send_button_stays_in_sight_when_the_keyboard_shows(
    webchat: Webchat, browser: Any, keyboard_up: dict[str, int]
) -> None:
    """On a phone Enter starts a new line, so Send is the only way to send. A message of many
    lines grew the box to 200 px, and with the keyboard up (the viewport shrinks to what is
    left above it) the box and the header took more than the screen: Send went below it, out
    of reach. The box grows only to a part of the screen left, and scrolls inside itself."""
    phone = await browser.new_context(
        viewport={"width": 375, "height": 667}, is_mobile=True, has_touch=True
    )
    phone.set_default_timeout(MS)
    try:
        page = await open_chat(phone, webchat)
        await say_on_a_phone(page, "a reply to scroll past")
        await expect(page.locator(".msg-assistant")).to_have_count(1)
        box = page.get_by_role("textbox", name="Message")
        await box.tap()
        for n in range(14):
            await page.keyboard.type(f"line {n}")
            await page.keyboard.press("Enter")
        await page.keyboard.type("the last line")
        assert await page.evaluate(SEND_IN_SIGHT) == dict.fromkeys(IN_SIGHT, True)
        await page.set_viewport_size(keyboard_up)  # the on-screen keyboard comes up
        await page.evaluate(FRAMES)
        assert await page.evaluate(SEND_IN_SIGHT) == dict.fromkeys(IN_SIGHT, True)
        await page.get_by_role("button", name="Send message").tap()
        await expect(page.locator(".msg-user .bubble").last).to_contain_text("the last line")
        assert webchat.echo.turns[-1].text.count("\n") == 14
    finally:
        await phone.close()
