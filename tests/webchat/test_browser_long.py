"""The page in a long session: thousands of messages, a reader scrolled up, many conversations."""

from __future__ import annotations

import asyncio
import re
from typing import Any

from talkbridge.message import OutboundMessage
from tests.webchat.conftest import (
    ANNOUNCED,
    FRAMES,
    TIMEOUT,
    StartWebchat,
    Webchat,
    expect,
    open_chat,
)

MARKDOWN = (
    "## A long answer\n\n"
    + (
        "Some **bold**, `code` and a [link](https://example.com/).\n\n- one\n- two\n\n"
        "```\nprint('a block')\n```\n\n"
    )
    * 4
)

SHOWN = 100
"""The messages a thread opens with (the page's `PAGE`): the newest, however many it holds."""
CAP = 300
"""The messages in the document at most (the page's `MAX_SHOWN`), however far the reader goes."""

TOP_MESSAGE = """box => {
    const top = box.getBoundingClientRect().top;
    for (const node of box.querySelectorAll('.msg[data-seq]')) {
        const at = node.getBoundingClientRect();
        if (at.bottom > top) return [node.dataset.seq, at.top];
    }
}"""
"""The message at the top of the reader's view, and where it is: unchanged means not moved."""

AT_BOTTOM = """() => {
    const box = document.getElementById('messages');
    return box.scrollHeight - box.scrollTop - box.clientHeight < 2;
}"""


async def long_thread(
    start_webchat: StartWebchat, context: Any, count: int, **config: Any
) -> tuple[Webchat, Any, str]:
    """A page whose conversation holds `count` replies (each tenth a long Markdown one), opened
    once they are stored."""
    chat = await start_webchat(**config)
    page = await open_chat(context, chat)
    thread_id = await page.evaluate("localStorage.getItem('talkbridge.active')")
    await page.close()
    for n in range(1, count + 1):
        text = MARKDOWN if n % 10 == 0 else f"m{n}"
        await chat.connector.send(OutboundMessage(thread_id=thread_id, text=text))
    page = await open_chat(context, chat)
    await expect(page.locator(f'.msg[data-seq="{count}"]')).to_have_count(1)
    await expect(page.locator(".msg")).to_have_count(
        min(count, chat.connector.config.history_limit, SHOWN)
    )
    return chat, page, thread_id


async def scroll_to(page: Any, top: int) -> None:
    await page.locator("#messages").evaluate("(box, top) => { box.scrollTop = top; }", top)
    await page.evaluate(FRAMES)


async def test_a_reader_of_a_long_thread_keeps_place_selection_and_nodes_while_replies_come(
    start_webchat: StartWebchat, context: Any
) -> None:
    """Every frame rebuilt the whole thread: a streamed piece of a reply laid out 2,000
    messages again, a selection in an earlier one was lost, and a message typed on another
    device pulled a reader who had scrolled up down to the bottom."""
    chat, page, thread_id = await long_thread(start_webchat, context, 2000, history_limit=2000)
    box = page.locator("#messages")
    await scroll_to(page, 3000)
    seq, top = await box.evaluate(TOP_MESSAGE)
    earlier = page.locator(f'.msg[data-seq="{seq}"]')
    await earlier.evaluate("node => { node.__kept = true; }")
    chosen = await earlier.locator(".bubble").evaluate(
        """bubble => {
            const range = document.createRange();
            range.selectNodeContents(bubble);
            getSelection().removeAllRanges();
            getSelection().addRange(range);
            return getSelection().toString();
        }"""
    )
    assert chosen

    session_id = await page.evaluate("localStorage.getItem('talkbridge.session')")
    phone = await chat.authed(session_id=session_id)  # the same user, on another device
    chat.echo.gate = asyncio.Event()
    await phone.send(
        {"type": "send", "thread_id": thread_id, "client_id": "p1", "text": "from the phone"}
    )
    await asyncio.wait_for(chat.echo.streaming.wait(), TIMEOUT)
    streaming = page.locator(".msg.streaming")
    await expect(streaming.locator(".bubble")).to_have_text("echo: from")
    await streaming.evaluate("node => { node.__kept = true; }")
    await chat.connector.delta(thread_id, "s1", " the")
    await expect(streaming.locator(".bubble")).to_have_text("echo: from the")
    assert await streaming.evaluate("node => node.__kept") is True  # only its text changed
    chat.echo.gate.set()
    await expect(page.locator(".msg-assistant .bubble").last).to_have_text("echo: from the phone")
    await expect(streaming).to_have_count(0)

    assert await earlier.evaluate("node => node.__kept") is True
    assert await page.evaluate("getSelection().toString()") == chosen
    assert await box.evaluate(TOP_MESSAGE) == [seq, top]  # the reader was not moved
    newer = page.get_by_role("button", name="New messages")
    await expect(newer).to_be_visible()
    await newer.click()
    await page.wait_for_function(AT_BOTTOM)
    await expect(newer).to_be_hidden()
    # At the bottom, the reader stays there as replies come.
    await chat.connector.send(OutboundMessage(thread_id=thread_id, text=MARKDOWN + "the last"))
    await expect(page.locator(".msg-assistant .bubble").last).to_contain_text("the last")
    await page.wait_for_function(AT_BOTTOM)
    await expect(newer).to_be_hidden()


async def test_a_reconnect_while_a_reply_streams_leaves_one_reply_and_the_reader_in_place(
    start_webchat: StartWebchat, context: Any
) -> None:
    """After a reconnect the page opened the thread again at its bottom, whatever the reader
    was reading."""
    chat, page, thread_id = await long_thread(start_webchat, context, 300)
    box = page.locator("#messages")
    await scroll_to(page, 2000)
    place = await box.evaluate(TOP_MESSAGE)
    await chat.connector.delta(thread_id, "r1", "half a")
    streaming = page.locator(".msg.streaming .bubble")
    await expect(streaming).to_have_text("half a")
    await chat.connector.close_sockets()
    await expect(page.locator("#status")).not_to_have_attribute("data-state", "online")
    await expect(page.locator("#status")).to_have_attribute("data-state", "online")
    await expect(streaming).to_have_text("half a")  # the reply so far, once
    await chat.connector.delta(thread_id, "r1", " reply")
    await expect(streaming).to_have_text("half a reply")
    final = OutboundMessage(thread_id=thread_id, text="half a reply", meta={"stream_id": "r1"})
    await chat.connector.send(final)
    await expect(page.locator(".msg .bubble", has_text="half a")).to_have_text(["half a reply"])
    await expect(page.locator(".msg.streaming")).to_have_count(0)
    assert await box.evaluate(TOP_MESSAGE) == place
    await expect(page.get_by_role("button", name="New messages")).to_be_visible()


async def test_scrolling_up_to_the_top_brings_the_earlier_messages_without_a_jump(
    start_webchat: StartWebchat, context: Any
) -> None:
    """Earlier messages came only with a click on a button at the very top."""
    _, page, _ = await long_thread(start_webchat, context, 120, history_limit=50)
    box = page.locator("#messages")
    shown = page.locator(".msg")
    first = page.locator('.msg[data-seq="71"]')
    await box.hover()
    await page.mouse.wheel(0, -100_000)  # the reader scrolls up to the top
    await expect(shown).to_have_count(100)
    # The page before went in above: what the reader was looking at stays in view.
    await expect(first).to_be_in_viewport()
    await expect(page.locator('.msg[data-seq="21"]')).not_to_be_in_viewport()
    await page.mouse.wheel(0, -100_000)
    await expect(shown).to_have_count(120)
    await expect(page.get_by_role("button", name="Show earlier messages")).to_have_count(0)
    await expect(page.locator(".msg .bubble").first).to_have_text("m1")


async def test_the_order_of_a_very_long_thread_needs_no_spread(
    webchat: Webchat, context: Any
) -> None:
    """`Math.min(...seqs)` and `replaceChildren(...nodes)` pass each item as an argument:
    past about 125,000 of them Chromium throws RangeError (call stack size exceeded)."""
    page = await open_chat(context, webchat)
    result = await page.evaluate(
        """async (total) => {
            const { insertSeqs, lowerBound, placeChildren } = await import('/static/order.js');
            const order = [];
            // Paged back from the newest, as a reader scrolling up does, then one in between.
            for (let last = total; last > 0; last -= 1000) {
                const page = [];
                for (let seq = Math.max(1, last - 999); seq <= last; seq += 1) {
                    if (seq !== 777) page.push(seq);
                }
                insertSeqs(order, page);
            }
            insertSeqs(order, [777]);
            let sorted = order.length === total;
            for (let i = 1; i < order.length && sorted; i += 1) sorted = order[i - 1] < order[i];
            const box = document.createElement('div');
            const nodes = Array.from(order, (seq) => document.createElement('p'));
            placeChildren(box, nodes);
            const kept = box.children[5];
            placeChildren(box, nodes.concat([document.createElement('hr')]));
            return {
                sorted, first: order[0], at: lowerBound(order, 150000),
                children: box.children.length, kept: box.children[5] === kept,
            };
        }""",
        200_000,
    )
    assert result == {
        "sorted": True,
        "first": 1,
        "at": 149_999,
        "children": 200_001,
        "kept": True,
    }


async def test_the_conversation_list_keeps_the_keyboard_where_it_is_when_messages_come(
    webchat: Webchat, context: Any
) -> None:
    """The list was rebuilt for each message in another conversation (its unread count): a
    keyboard user moving through it lost their place."""
    page = await open_chat(context, webchat)
    session_id = await page.evaluate("localStorage.getItem('talkbridge.session')")
    phone = await webchat.authed(session_id=session_id)
    threads = [phone.thread_id]
    for n in range(30):
        await phone.send({"type": "new_conversation", "ref": f"c{n}"})
        reply = await phone.expect("conversation", ref=f"c{n}")
        threads.append(reply["conversation"]["thread_id"])
    conversations = page.locator(".conversation-list .conversation")
    await expect(conversations).to_have_count(31)
    chosen = conversations.nth(3)
    await chosen.focus()
    shown = await page.evaluate("localStorage.getItem('talkbridge.active')")
    elsewhere = next(t for t in threads if t != shown)
    await webchat.connector.send(OutboundMessage(thread_id=elsewhere, text="news"))
    await expect(page.locator(".conversation-list .unread")).to_have_text(["1"])
    await expect(chosen).to_be_focused()


FIRST_SHOWN = "() => document.querySelector('.msg[data-seq]').dataset.seq"


async def test_a_thread_of_thousands_keeps_a_few_hundred_in_the_document_end_to_end(
    start_webchat: StartWebchat, context: Any
) -> None:
    """Every message of a thread went into the document and stayed there: 20,000 took 3.5 s
    to open, and each streamed piece of a reply 170 ms to lay out (the whole thread again).
    Now the document holds a window of it, wherever the reader goes, and the reader is never
    moved by what comes or goes out of sight."""
    chat, page, thread_id = await long_thread(start_webchat, context, 2000, history_limit=2000)
    shown = page.locator(".msg")
    box = page.locator("#messages")
    await box.hover()
    # Up to the very first message, a page at a time: the message at the top before each
    # step is still in view after it (the page before went in above it, the newest went out).
    while (first := await page.evaluate(FIRST_SHOWN)) != "1":
        await page.mouse.wheel(0, -100_000)
        await page.wait_for_function(f"() => ({FIRST_SHOWN})() !== {first!r}")
        await expect(page.locator(f'.msg[data-seq="{first}"]')).to_be_in_viewport()
        assert await shown.count() <= CAP
    await expect(page.get_by_role("button", name="Show earlier messages")).to_have_count(0)
    await expect(page.locator(".msg .bubble").first).to_have_text("m1")

    # A reply comes while the reader is 1,700 messages up: it waits below, and they are told.
    await chat.connector.send(OutboundMessage(thread_id=thread_id, text="news while away"))
    newer = page.get_by_role("button", name="New messages")
    await expect(newer).to_be_visible()
    assert await shown.count() <= CAP
    # Back down a page at a time, the same way, to the newest, which is followed again.
    while await page.locator('.msg[data-seq="2001"]').count() == 0:
        bottom = await page.evaluate(
            "() => [...document.querySelectorAll('.msg[data-seq]')].at(-1).dataset.seq"
        )
        await page.mouse.wheel(0, 100_000)
        await page.wait_for_function(
            "seq => [...document.querySelectorAll('.msg[data-seq]')].at(-1).dataset.seq !== seq",
            arg=bottom,
        )
        await expect(page.locator(f'.msg[data-seq="{bottom}"]')).to_be_in_viewport()
        assert await shown.count() <= CAP
    await expect(page.locator(".msg-assistant .bubble").last).to_have_text("news while away")
    await page.mouse.wheel(0, 100_000)
    await page.wait_for_function(AT_BOTTOM)
    await expect(newer).to_be_hidden()
    await chat.connector.send(OutboundMessage(thread_id=thread_id, text="and the last"))
    await expect(page.locator(".msg-assistant .bubble").last).to_have_text("and the last")
    await page.wait_for_function(AT_BOTTOM)
    assert await shown.count() <= CAP


async def test_the_new_messages_button_far_up_a_long_thread_jumps_to_the_newest(
    start_webchat: StartWebchat, context: Any
) -> None:
    chat, page, thread_id = await long_thread(start_webchat, context, 1000, history_limit=1000)
    box = page.locator("#messages")
    await box.hover()
    for _ in range(5):  # 500 messages up: the newest are out of the document
        first = await page.evaluate(FIRST_SHOWN)
        await page.mouse.wheel(0, -100_000)
        await page.wait_for_function(f"() => ({FIRST_SHOWN})() !== {first!r}")
    await expect(page.locator('.msg[data-seq="1000"]')).to_have_count(0)
    await chat.connector.send(OutboundMessage(thread_id=thread_id, text="news"))
    newer = page.get_by_role("button", name="New messages")
    await newer.click()
    await expect(page.locator(".msg-assistant .bubble").last).to_have_text("news")
    await page.wait_for_function(AT_BOTTOM)
    await expect(newer).to_be_hidden()
    assert await page.locator(".msg").count() <= CAP


async def test_a_screen_reader_hears_what_is_new_not_the_history_the_page_draws(
    start_webchat: StartWebchat, context: Any
) -> None:
    """The messages' log was live: a screen reader read out the whole history page when the
    conversation opened, and every page of earlier messages the reader scrolled to."""
    await context.add_init_script(f"({ANNOUNCED})()")
    chat, page, thread_id = await long_thread(start_webchat, context, 250, history_limit=100)
    box = page.locator("#messages")
    await box.hover()
    while (first := await page.evaluate(FIRST_SHOWN)) != "1":
        await page.mouse.wheel(0, -100_000)
        await page.wait_for_function(f"() => ({FIRST_SHOWN})() !== {first!r}")
    await chat.connector.typing(thread_id)
    await chat.connector.send(OutboundMessage(thread_id=thread_id, text="a reply for the ear"))
    await expect(page.get_by_role("button", name="New messages")).to_be_visible()
    announced = await page.evaluate("window.__announced")
    old = [text for text in announced if re.search(r"\bm\d+\b|A long answer", text)]
    assert old == [], old[:3]
    assert "The assistant is typing…" in announced  # (shown by unhiding a live region: unsaid)
    assert any("a reply for the ear" in text for text in announced), announced


SELECT_FROM_TO = """([from, to]) => {
    const bubble = seq => document.querySelector(`.msg[data-seq="${seq}"] .bubble`);
    const range = document.createRange();
    range.setStart(bubble(from).firstChild, 0);
    range.setEnd(bubble(to).lastChild, 1);
    getSelection().removeAllRanges();
    getSelection().addRange(range);
    return getSelection().toString();
}"""
"""Select from the start of message `from` into message `to`, as a reader dragging does."""


async def test_a_selection_in_the_messages_is_kept_while_the_window_moves_then_it_moves_on(
    start_webchat: StartWebchat, context: Any
) -> None:
    """The window of 300 messages moved under a selection: a reply coming took the oldest out
    from under a select-all, and scrolling up while selecting (or after) took the messages the
    selection started in out of the document: the selection was cut, or lost. While a
    selection reaches into the messages, none leave the document (more may come in); once it
    is gone, the window goes back to 300 around the reader, who is not moved."""
    chat, page, thread_id = await long_thread(start_webchat, context, 600, history_limit=600)
    shown = page.locator(".msg")
    box = page.locator("#messages")
    await box.hover()
    while (first := await page.evaluate(FIRST_SHOWN)) != "301":  # the window at its 300
        await page.mouse.wheel(0, -100_000)
        await page.wait_for_function(f"() => ({FIRST_SHOWN})() !== {first!r}")
    await page.mouse.wheel(0, 100_000)
    await page.wait_for_function(AT_BOTTOM)
    await expect(shown).to_have_count(CAP)

    # Everything selected at the bottom: replies come, and the oldest stay in.
    await page.evaluate("document.activeElement.blur()")  # out of the message box
    await page.keyboard.press("Control+A")
    everything = await page.evaluate("getSelection().toString()")
    assert "\nm301\n" in everything
    for n in range(3):
        await chat.connector.send(OutboundMessage(thread_id=thread_id, text=f"new {n}"))
    await expect(page.locator(".msg-assistant .bubble").last).to_have_text("new 2")
    assert await page.evaluate(FIRST_SHOWN) == "301"
    still = await page.evaluate("getSelection().toString()")
    assert still.startswith(everything.partition("Message\n")[0])  # all that was, and more
    await page.mouse.click(5, 5)  # a click beside it ends the selection
    await expect(shown).to_have_count(CAP)
    assert await page.evaluate(FIRST_SHOWN) == "304"
    await page.wait_for_function(AT_BOTTOM)  # the reader at the bottom stays there

    # From the newest message up into the one above it: the reader starts selecting there...
    chosen = await page.evaluate(SELECT_FROM_TO, [602, 603])
    assert chosen.startswith("new 1")
    # ... and scrolls up, far past the 300 the window holds.
    await box.hover()
    while (first := await page.evaluate(FIRST_SHOWN)) != "104":
        await page.mouse.wheel(0, -100_000)
        await page.wait_for_function(f"() => ({FIRST_SHOWN})() !== {first!r}")
    assert await page.evaluate("getSelection().toString()") == chosen
    await expect(shown).to_have_count(500)  # none went: the limit, while selecting
    place = await box.evaluate(TOP_MESSAGE)
    await page.evaluate("getSelection().removeAllRanges()")
    await expect(shown).to_have_count(CAP)  # the newest left, far from the reader
    await expect(page.locator('.msg[data-seq="603"]')).to_have_count(0)
    assert await box.evaluate(TOP_MESSAGE) == place
