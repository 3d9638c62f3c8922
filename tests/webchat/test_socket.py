"""The webchat protocol over a real socket: auth, turns, dedupe, resume, limits, isolation."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed

from talkbridge.errors import NotFoundError, StoreError, TransientError
from talkbridge.message import Attachment, OutboundMessage
from talkbridge.store.base import HistoryEntry
from tests.webchat.conftest import TIMEOUT, TOKEN_A, TOKEN_B, StartWebchat, Webchat


async def test_auth_then_a_turn_streams_and_stores(webchat: Webchat) -> None:
    client = await webchat.authed()
    ready = client.ready
    assert ready["protocol"] == 1 and ready["new_session"] is True
    assert len(ready["session_id"]) == 32  # 128 random bits, hex
    assert ready["limits"]["max_frame_bytes"] == 4096
    [conv] = ready["conversations"]
    assert conv["thread_id"] == f"{ready['session_id']}.{conv['id']}"

    frames = await client.turn("hello **there**", "c1")
    kinds = [f["type"] for f in frames]
    # The user's own message comes back with its seq (every tab shows it), then the ack.
    assert kinds[:2] == ["message", "ack"], kinds
    user, ack = frames[0], frames[1]
    assert user["role"] == "user" and user["client_id"] == "c1" and user["seq"] == 1
    assert ack == {
        "type": "ack",
        "thread_id": client.thread_id,
        "client_id": "c1",
        "id": f"{client.thread_id}:c1",
        "seq": 1,
        "duplicate": False,
    }
    assert "typing" in kinds
    # The harness answers at once: the final message beats any delta, so none is sent.
    assert [f for f in frames if f["type"] == "delta"] == []
    final = frames[-1]
    assert final["seq"] == 2 and final["stream_id"] == "s1" and final["markup"] == "markdown"
    assert final["text"] == "echo: hello **there**"

    # The router sees one normalized message with the contract's ids.
    [msg] = webchat.echo.turns
    assert msg.channel == "webchat" and msg.connection_id == "webchat"
    assert msg.id == f"{client.thread_id}:c1" and msg.thread_id == client.thread_id
    assert msg.channel_user_id == client.session_id and msg.thread_type == "private"
    entries = await webchat.store.history(msg.thread_key)
    assert [(e.seq, e.role, e.text) for e in entries] == [
        (1, "user", "hello **there**"),
        (2, "assistant", "echo: hello **there**"),
    ]
    # The first message names the conversation, and every socket of the session hears it.
    [renamed] = [f for f in frames if f["type"] == "conversation"]
    assert renamed["conversation"]["title"] == "hello there"  # without its Markdown marks
    await client.close()


async def test_resending_a_client_id_never_makes_a_second_turn(webchat: Webchat) -> None:
    client = await webchat.authed()
    await client.turn("only once", "same-id")
    for _ in range(3):
        await client.send(
            {"type": "send", "thread_id": client.thread_id, "client_id": "same-id", "text": "x"}
        )
        ack = await client.expect("ack")
        assert ack["seq"] == 1 and ack["duplicate"] is True
    # The resend was answered by an ack only: no message, no delta, no second reply.
    leftovers = await client.drain_until_pong()
    assert [f["type"] for f in leftovers if f["type"] != "conversation"] == []
    assert len(webchat.echo.turns) == 1
    entries = await webchat.store.history(webchat.echo.turns[0].thread_key)
    assert [e.text for e in entries] == ["only once", "echo: only once"]


async def test_resend_from_a_new_socket_after_a_drop_is_deduplicated(webchat: Webchat) -> None:
    first = await webchat.authed()
    await first.send(
        {"type": "send", "thread_id": first.thread_id, "client_id": "k1", "text": "hi"}
    )
    await webchat.echo.turned.wait()
    first.ws.transport.abort()
    again = await webchat.authed(session_id=first.session_id)
    await again.send(
        {"type": "send", "thread_id": first.thread_id, "client_id": "k1", "text": "hi"}
    )
    ack = await again.expect("ack")
    assert ack["duplicate"] is True and ack["seq"] == 1
    assert len(webchat.echo.turns) == 1


async def test_resume_after_a_dropped_connection_loses_and_repeats_nothing(
    webchat: Webchat,
) -> None:
    client = await webchat.authed()
    thread_id = client.thread_id
    seen: dict[int, str] = {}
    for i in range(2):
        for frame in await client.turn(f"m{i}", f"c{i}"):
            if frame["type"] == "message":
                seen[frame["seq"]] = frame["text"]
    assert sorted(seen) == [1, 2, 3, 4]

    client.ws.transport.abort()  # the network drops; no close handshake
    # While the page is away the bridge keeps talking to this thread.
    for text in ("while away 1", "while away 2"):
        await webchat.connector.send(OutboundMessage(thread_id=thread_id, text=text))

    back = await webchat.authed(session_id=client.session_id)
    assert back.ready["new_session"] is False and back.thread_id == thread_id
    await back.send({"type": "history", "thread_id": thread_id, "after_seq": max(seen)})
    batch = await back.expect("history")
    assert batch["more"] is False
    missed = [(m["seq"], m["text"]) for m in batch["messages"]]
    assert missed == [(5, "while away 1"), (6, "while away 2")]
    assert not set(seen) & {seq for seq, _ in missed}

    # A page that lost everything (a reload) asks for the latest page and gets it all in order.
    await back.send({"type": "history", "thread_id": thread_id, "after_seq": 0, "ref": "r"})
    full = await back.expect("history", ref="r")
    assert [m["seq"] for m in full["messages"]] == [1, 2, 3, 4, 5, 6]
    assert full["earlier"] is False


async def test_history_pages_say_when_more_remain(start_webchat: StartWebchat) -> None:
    chat = await start_webchat(history_limit=3)
    client = await chat.authed()
    for i in range(7):
        await chat.connector.send(OutboundMessage(thread_id=client.thread_id, text=f"n{i}"))
    await client.send({"type": "history", "thread_id": client.thread_id, "after_seq": 0})
    latest = await client.expect("history")
    assert [m["seq"] for m in latest["messages"]] == [5, 6, 7] and latest["earlier"] is True
    await client.send({"type": "history", "thread_id": client.thread_id, "after_seq": 1})
    page = await client.expect("history")
    assert [m["seq"] for m in page["messages"]] == [2, 3, 4] and page["more"] is True
    assert page["earlier"] is True  # seq 1 is older than the first one returned

    # Paging back from the oldest shown reaches the first message, then says there is no more.
    back = {"type": "history", "thread_id": client.thread_id, "before_seq": 5, "ref": "b"}
    await client.send(back)
    page = await client.expect("history", ref="b")
    assert [m["seq"] for m in page["messages"]] == [2, 3, 4] and page["before_seq"] == 5
    assert page["earlier"] is True
    assert "after_seq" not in page  # `after_seq: 0` is how a first load is answered
    await client.send({**back, "before_seq": 2})
    page = await client.expect("history", ref="b")
    assert [m["seq"] for m in page["messages"]] == [1] and page["earlier"] is False

    # A page that is exactly full with nothing newer says so: no extra round trip.
    await client.send({"type": "history", "thread_id": client.thread_id, "after_seq": 4})
    page = await client.expect("history")
    assert [m["seq"] for m in page["messages"]] == [5, 6, 7] and page["more"] is False


async def test_seqs_that_no_store_holds_are_a_bad_frame_not_a_crash(webchat: Webchat) -> None:
    client = await webchat.authed()
    for after_seq in (2**63, 10**30, "1", True, 1.5):
        frame = {"type": "history", "thread_id": client.thread_id, "after_seq": after_seq}
        await client.send({**frame, "ref": "h"})
        error = await client.expect("error")
        assert error["code"] == "bad_frame" and error["ref"] == "h", error
        assert "after_seq" in error["message"]


@pytest.mark.parametrize(
    ("payload", "code", "says"),
    [
        ("x" * 5000, "too_large", "limit is 4096 bytes"),
        ("{not json", "bad_frame", "not valid JSON"),
        ("[1, 2]", "bad_frame", "JSON object"),
        (json.dumps({"type": "shout"}), "bad_frame", "unknown frame type 'shout'"),
        (json.dumps({"type": 5}), "bad_frame", "'type' must be a string"),
        (json.dumps({"type": "send", "text": "hi"}), "bad_frame", "thread_id: Field required"),
        (b"\x00\x01", "bad_frame", "not binary"),
        ("[" * 2000 + "]" * 2000, "bad_frame", "nested too deeply"),  # was internal + traceback
        ('{"type":"ping","x":' + "[" * 1990 + "]" * 1990 + "}", "bad_frame", "nested too deeply"),
        (
            json.dumps({"type": "send", "thread_id": "abc", "client_id": "c1", "text": "hi"}),
            "bad_frame",
            "thread_id must be",
        ),
        (
            json.dumps(
                {"type": "send", "thread_id": "x.y.z", "client_id": "no spaces", "text": "a"}
            ),
            "bad_frame",
            "client_id",
        ),
    ],
)
async def test_bad_frames_get_an_error_and_the_socket_stays_usable(
    webchat: Webchat, payload: str | bytes, code: str, says: str
) -> None:
    client = await webchat.authed()
    await client.send(payload)
    error = await client.expect("error")
    assert error["code"] == code and says in error["message"], error
    # Still usable: a ping is answered and a real message makes a turn.
    await client.send({"type": "ping", "ref": "p"})
    assert (await client.expect("pong"))["ref"] == "p"
    frames = await client.turn("still here", "after-error")
    assert frames[-1]["text"] == "echo: still here"


async def test_replies_to_frames_without_a_ref_carry_none(webchat: Webchat) -> None:
    """A client that gave no `ref` gets no `ref` back: not `"ref": null`, which a client
    matching replies by `"ref" in frame` (or a strict schema) takes for a ref of its own."""
    client = await webchat.authed()  # `ready` answered an auth frame without a ref
    thread_id = client.thread_id
    asked: list[tuple[dict[str, Any], str]] = [
        ({"type": "ping"}, "pong"),
        ({"type": "ping", "ref": None}, "pong"),
        ({"type": "history", "thread_id": thread_id}, "history"),
        ({"type": "new_conversation"}, "conversation"),
        ({"type": "send", "thread_id": thread_id, "client_id": "no-ref", "text": "hi"}, "ack"),
        ({"type": "send", "thread_id": thread_id, "client_id": "no-ref", "text": "hi"}, "ack"),
        ({"type": "history", "thread_id": "nope"}, "error"),
    ]
    replies = [client.ready]
    for frame, answer in asked:
        await client.send(frame)
        replies.append(await client.expect(answer))
    assert [r["type"] for r in replies[-3:]] == ["ack", "ack", "error"]
    assert replies[-2]["duplicate"] is True
    assert [r for r in replies if "ref" in r] == []
    await client.send({"type": "ping", "ref": ""})  # an empty ref is still a ref: echoed
    assert await client.expect("pong") == {"type": "pong", "ref": ""}


async def test_a_send_over_the_limit_is_named_in_its_error(webchat: Webchat) -> None:
    client = await webchat.authed()
    big = {"type": "send", "thread_id": client.thread_id, "client_id": "big", "text": "x" * 5000}
    await client.send({**big, "ref": "r"})
    error = await client.expect("error")
    assert error["code"] == "too_large" and error["client_id"] == "big" and error["ref"] == "r"
    assert error["thread_id"] == client.thread_id


async def test_a_frame_far_over_the_limit_is_answered_and_an_absurd_one_closes(
    webchat: Webchat,
) -> None:
    client = await webchat.authed()
    await client.send("y" * 40_000)  # ~10x the limit: we answer it, the library does not close
    error = await client.expect("error")
    assert error["code"] == "too_large" and "40000 bytes" in error["message"]
    await client.send({"type": "ping"})
    await client.expect("pong")
    # Beyond 16x the limit (at least 1 MiB) the library refuses to buffer it: close 1009.
    await client.send("z" * (1 << 20) + "z")
    with pytest.raises(ConnectionClosed) as closed:
        await asyncio.wait_for(client.ws.recv(), TIMEOUT)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009


async def test_an_auth_frame_without_a_token_or_cookie_says_so(webchat: Webchat) -> None:
    client = await webchat.client()
    await client.send({"type": "auth", "ref": "a"})
    error = await client.recv()
    assert error["code"] == "unauthorized" and error["ref"] == "a"
    assert error["message"] == "no token: give one in the auth frame, or open the link first"


async def test_auth_must_come_first(webchat: Webchat) -> None:
    client = await webchat.client()
    await client.send({"type": "ping"})
    error = await client.recv()
    assert error["code"] == "unauthorized" and "first frame must be auth" in error["message"]
    with pytest.raises(ConnectionClosed) as closed:
        await asyncio.wait_for(client.ws.recv(), TIMEOUT)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 4401


async def test_a_deeply_nested_first_frame_is_refused_with_4401_not_a_crash(
    webchat: Webchat,
) -> None:
    client = await webchat.client()
    await client.send("[" * 2000 + "]" * 2000)  # the socket used to close with 1011, no frame
    error = await client.recv()
    assert error["code"] == "unauthorized" and "nested too deeply" in error["message"]
    with pytest.raises(ConnectionClosed) as closed:
        await asyncio.wait_for(client.ws.recv(), TIMEOUT)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 4401


@pytest.mark.parametrize("token", ["", "wrong-token", TOKEN_A + "x"])
async def test_a_missing_or_wrong_token_is_refused_with_4401(webchat: Webchat, token: str) -> None:
    client = await webchat.client()
    await client.send({"type": "auth", "token": token})
    error = await client.recv()
    assert error["type"] == "error" and error["code"] == "unauthorized"
    assert TOKEN_A not in json.dumps(error)
    with pytest.raises(ConnectionClosed) as closed:
        await asyncio.wait_for(client.ws.recv(), TIMEOUT)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 4401


async def test_two_sessions_are_isolated(webchat: Webchat) -> None:
    alice = await webchat.authed(TOKEN_A)
    bob = await webchat.authed(TOKEN_A)  # same token, second browser: its own session
    carol = await webchat.authed(TOKEN_B)
    assert len({alice.session_id, bob.session_id, carol.session_id}) == 3

    await alice.turn("alice's secret", "a1")
    # Nothing of alice's conversation reached the others.
    assert await bob.drain_until_pong() == []
    assert await carol.drain_until_pong() == []

    for intruder in (bob, carol):
        await intruder.send(
            {"type": "send", "thread_id": alice.thread_id, "client_id": "x1", "text": "hi"}
        )
        error = await intruder.expect("error")
        assert error["code"] == "forbidden" and error["client_id"] == "x1"
        await intruder.send({"type": "history", "thread_id": alice.thread_id, "after_seq": 0})
        assert (await intruder.expect("error"))["code"] == "forbidden"
    assert len(webchat.echo.turns) == 1

    # A conversation id that does not exist in one's own session is not found.
    fake = f"{bob.session_id}.000000000000"
    await bob.send({"type": "history", "thread_id": fake, "after_seq": 0})
    assert (await bob.expect("error"))["code"] == "not_found"


async def test_a_session_id_presented_with_another_token_is_refused(webchat: Webchat) -> None:
    alice = await webchat.authed(TOKEN_A)
    await alice.turn("mine", "a1")
    thief = await webchat.client()
    await thief.send({"type": "auth", "token": TOKEN_B, "session_id": alice.session_id})
    error = await thief.recv()
    assert error["code"] == "forbidden" and "another token" in error["message"]
    with pytest.raises(ConnectionClosed) as closed:
        await asyncio.wait_for(thief.ws.recv(), TIMEOUT)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 4403
    # The rightful token joins the same session and sees its conversation.
    again = await webchat.authed(TOKEN_A, alice.session_id)
    assert again.session_id == alice.session_id and again.thread_id == alice.thread_id


@pytest.mark.parametrize("stale", ["0" * 32, "zzz", "A" * 32])
async def test_an_unknown_session_id_gets_a_fresh_session(webchat: Webchat, stale: str) -> None:
    client = await webchat.authed(TOKEN_A, stale)
    assert client.session_id != stale and client.ready["new_session"] is True


async def test_a_token_starts_at_most_max_sessions_per_token(
    start_webchat: StartWebchat,
) -> None:
    # Each unknown session id (or none) made a new session, kept in the store for good: a
    # client looping over auth filled the store.
    chat = await start_webchat(max_sessions_per_token=2)
    first = await chat.authed(TOKEN_A)
    await chat.authed(TOKEN_A, "0" * 32)
    refused = await chat.client()
    await refused.send({"type": "auth", "token": TOKEN_A, "session_id": "1" * 32, "ref": "a"})
    error = await refused.recv()
    assert error["code"] == "too_many_sessions" and error["ref"] == "a"
    assert "max_sessions_per_token" in error["message"]
    with pytest.raises(ConnectionClosed) as closed:
        await asyncio.wait_for(refused.ws.recv(), TIMEOUT)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 4429
    # The browsers that have a session go on (a reload, a new conversation), and another
    # token counts its own.
    again = await chat.authed(TOKEN_A, first.session_id)
    assert again.session_id == first.session_id
    await again.send({"type": "new_conversation", "ref": "n"})
    assert (await again.expect("conversation", ref="n"))["conversation"]["title"] == ""
    assert (await chat.authed(TOKEN_B)).ready["new_session"] is True


async def test_a_message_that_shows_nothing_is_refused_in_words_with_its_own_code(
    webchat: Webchat,
) -> None:
    client = await webchat.authed()
    for text in ("", " \n\t", "\u200b\u200b", "\u00a0\u2060\u200d\ufeff"):
        frame = {"type": "send", "thread_id": client.thread_id, "client_id": "c1", "text": text}
        await client.send(frame)
        error = await client.expect("error")
        assert error["code"] == "empty_message", text
        assert error["message"].startswith("the message is only spaces or invisible characters")
        assert "bad send frame" not in error["message"] and error["client_id"] == "c1"
    assert webchat.echo.turns == []


async def test_every_socket_of_a_session_gets_every_message(webchat: Webchat) -> None:
    tab1 = await webchat.authed()
    tab2 = await webchat.authed(session_id=tab1.session_id)
    phone = await webchat.authed(session_id=tab1.session_id)
    await tab1.turn("from tab one", "t1")
    for other in (tab2, phone):
        user = await other.expect("message", role="user")
        assert user["text"] == "from tab one" and user["client_id"] == "t1"
        reply = await other.expect("message", role="assistant")
        assert reply["text"] == "echo: from tab one" and reply["seq"] == 2
        assert (await other.expect("conversation"))["conversation"]["title"] == "from tab one"

    # A new conversation started in one tab shows up in the others, and works.
    await tab2.send({"type": "new_conversation", "ref": "n1"})
    made = await tab2.expect("conversation", ref="n1")
    new_thread = made["conversation"]["thread_id"]
    assert new_thread != tab1.thread_id and new_thread.startswith(tab1.session_id + ".")
    told = await tab1.expect("conversation")
    assert told["conversation"]["thread_id"] == new_thread
    assert "ref" not in told  # the ref is the asking tab's own
    assert told["conversation"]["created_at"].endswith("Z")
    frames = await tab1.turn("second topic", "t2", thread_id=new_thread)
    assert frames[-1]["thread_id"] == new_thread and frames[-1]["seq"] == 2
    assert (await phone.expect("message", role="assistant", thread_id=new_thread))["seq"] == 2

    # Another tab that reconnects later lists both conversations.
    later = await webchat.authed(session_id=tab1.session_id)
    assert {c["thread_id"] for c in later.ready["conversations"]} == {tab1.thread_id, new_thread}


async def test_floods_are_rate_limited_and_the_socket_survives(webchat: Webchat) -> None:
    webchat.connector.frame_rate = 0.01  # effectively no refill during the test
    webchat.connector.frame_burst = 3
    client = await webchat.authed()
    for i in range(5):
        await client.send({"type": "ping", "ref": str(i)})
    replies = [await client.recv() for _ in range(5)]
    assert [r["type"] for r in replies] == ["pong", "pong", "pong", "error", "error"]
    assert replies[3]["code"] == "rate_limited" and replies[3]["retry_after"] > 0
    # Each error names the frame it dropped, and its text says the same wait as retry_after.
    assert [r.get("ref") for r in replies] == ["0", "1", "2", "3", "4"]
    assert f"wait {replies[3]['retry_after']:.2f} s" in replies[3]["message"]


async def test_a_dropped_send_is_named_by_its_client_id(webchat: Webchat) -> None:
    webchat.connector.frame_rate = 0.01
    webchat.connector.frame_burst = 0
    client = await webchat.authed()
    await client.send(
        {"type": "send", "thread_id": client.thread_id, "client_id": "late", "text": "x"}
    )
    error = await client.expect("error")
    assert error["code"] == "rate_limited" and error["client_id"] == "late"
    assert error["thread_id"] == client.thread_id and error["retry_after"] >= 0.01


async def test_send_to_a_foreign_thread_id_raises_not_found(webchat: Webchat) -> None:
    with pytest.raises(NotFoundError):
        await webchat.connector.send(OutboundMessage(thread_id="telegram-chat-1", text="hi"))


async def test_history_feature_returns_normalized_messages(webchat: Webchat) -> None:
    client = await webchat.authed()
    for i in range(3):
        await client.turn(f"q{i}", f"h{i}")
    history = webchat.connector.feature("history")
    assert history is not None
    fetched = await history.fetch(client.thread_id, limit=10)
    assert [m.text for m in fetched] == ["q0", "echo: q0", "q1", "echo: q1", "q2", "echo: q2"]
    before = await history.fetch(client.thread_id, limit=2, before=f"{client.thread_id}:h2")
    assert [m.text for m in before] == ["q1", "echo: q1"]
    early = await history.fetch(client.thread_id, limit=10, before=f"{client.thread_id}:h1")
    assert [m.text for m in early] == ["q0", "echo: q0"]


async def test_stopping_closes_sockets_as_going_away(webchat: Webchat) -> None:
    client = await webchat.authed()
    webchat.task.cancel()
    await asyncio.gather(webchat.task, return_exceptions=True)
    with pytest.raises(ConnectionClosed) as closed:
        await asyncio.wait_for(client.ws.recv(), TIMEOUT)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1001
    assert not webchat.connector.ready.is_set()


async def test_a_slow_reply_streams_its_first_part_before_the_end(webchat: Webchat) -> None:
    client = await webchat.authed()
    webchat.echo.gate = asyncio.Event()  # the reply stops half-way until the gate opens
    await client.send(
        {"type": "send", "thread_id": client.thread_id, "client_id": "slow", "text": "abcdef"}
    )
    delta = await client.expect("delta")
    assert delta["text"] == "echo: abcdef"[: len("echo: abcdef") // 2]
    webchat.echo.gate.set()
    final = await client.expect("message", role="assistant")
    assert final["text"] == "echo: abcdef" and final["stream_id"] == delta["stream_id"]


async def test_a_tab_joining_mid_stream_gets_the_reply_so_far(webchat: Webchat) -> None:
    client = await webchat.authed()
    webchat.echo.gate = asyncio.Event()
    await client.send(
        {"type": "send", "thread_id": client.thread_id, "client_id": "mid", "text": "abcdef"}
    )
    first = await client.expect("delta")
    # A tab that opens now (or a reload) asks for the thread's history.
    late = await webchat.authed(session_id=client.session_id)
    await late.send({"type": "history", "thread_id": client.thread_id})
    assert [m["role"] for m in (await late.expect("history"))["messages"]] == ["user"]
    caught_up = await late.expect("delta")
    assert caught_up["from_start"] is True and caught_up["text"] == first["text"]
    assert caught_up["stream_id"] == first["stream_id"]
    webchat.echo.gate.set()
    final = await late.expect("message", role="assistant")
    assert final["text"] == "echo: abcdef" and final["stream_id"] == first["stream_id"]
    # Once the final message is out, nothing is left to catch up on.
    await late.send({"type": "history", "thread_id": client.thread_id, "ref": "h2"})
    await late.expect("history", ref="h2")
    await late.send({"type": "ping", "ref": "after"})
    assert (await late.recv())["type"] == "pong"  # not a delta of the finished stream


async def test_a_stream_ended_without_its_final_message_is_ended_on_every_tab(
    webchat: Webchat,
) -> None:
    """A turn that streamed but whose final message does not go out from it (the reply went
    out before, from the turn's earlier run; its send failed; the turn was cut off): each tab
    is told (`stream_end`), and one that joins later is not caught up on it."""
    client = await webchat.authed()
    other_tab = await webchat.authed(session_id=client.session_id)
    thread, connector = client.thread_id, webchat.connector
    await connector.delta(thread, "t-2", "Once upon ")
    for tab in (client, other_tab):
        assert (await tab.expect("delta"))["stream_id"] == "t-2"
    await connector.end(thread, "t-2")
    for tab in (client, other_tab):
        assert await tab.expect("stream_end") == {
            "type": "stream_end",
            "thread_id": thread,
            "stream_id": "t-2",
        }
    late = await webchat.authed(session_id=client.session_id)
    await late.send({"type": "history", "thread_id": thread})
    await late.expect("history")
    assert await late.drain_until_pong() == []  # no delta of the stream that ended


async def test_a_stream_whose_final_message_went_out_or_that_showed_nothing_ends_silently(
    webchat: Webchat,
) -> None:
    client = await webchat.authed()
    thread, connector = client.thread_id, webchat.connector
    await connector.delta(thread, "t-3", "Once upon ")
    await client.expect("delta")
    final = {"stream_id": "t-3"}
    await connector.send(OutboundMessage(thread_id=thread, text="Once upon a time", meta=final))
    await client.expect("message", role="assistant")
    await connector.end(thread, "t-3")  # the page replaced the stream with the message already
    await connector.delta(thread, "t-4", "Quick")  # within the first window: not shown yet
    await connector.end(thread, "t-4")
    assert await client.drain_until_pong() == []


async def test_a_message_is_answered_even_if_its_tab_closed_right_after_sending(
    webchat: Webchat,
) -> None:
    """It is saved before the ack: closing the tab must not leave it unanswered until a resend
    that may never come. The session's other tab sees the answer."""
    tab1 = await webchat.authed()
    tab2 = await webchat.authed(session_id=tab1.session_id)
    await tab1.send({"type": "send", "thread_id": tab1.thread_id, "client_id": "c1", "text": "bye"})
    await tab1.close()
    assert (await tab2.expect("message", role="user"))["text"] == "bye"
    assert (await tab2.expect("message", role="assistant"))["text"] == "echo: bye"


async def test_a_message_the_router_cannot_take_is_not_acked_and_its_resend_is(
    webchat: Webchat,
) -> None:
    refusals = [RuntimeError("the store is busy")]

    async def refuse_once(msg: object) -> None:
        if refusals:
            raise refusals.pop()

    webchat.connector.subscribe(refuse_once)
    client = await webchat.authed()
    send = {"type": "send", "thread_id": client.thread_id, "client_id": "m1", "text": "hi"}
    await client.send(send)
    error = await client.expect("error")
    assert error["code"] == "internal" and error["client_id"] == "m1" and error["retry_after"] > 0
    # No ack: the page keeps the message in its outbox and sends it again, as told.
    await client.send({"type": "ping", "ref": "p"})
    await client.expect("pong", ref="p")
    assert not [
        f for f in client.inbox if f["type"] in ("ack", "message") and f.get("role") != "assistant"
    ]

    other_tab = await webchat.authed(session_id=client.session_id)
    await client.send(send)  # the page's resend, same client id
    ack = await client.expect("ack")
    assert ack["client_id"] == "m1" and ack["duplicate"] is True and ack["seq"] == 1
    assert (await client.expect("message", role="assistant"))["text"] == "echo: hi"
    assert len(webchat.echo.turns) == 1
    # The session's other tab never got the message from the failed try: it gets it now,
    # with the title it gave the conversation.
    mine = await other_tab.expect("message", role="user")
    assert mine["client_id"] == "m1" and mine["seq"] == 1 and mine["text"] == "hi"
    assert (await other_tab.expect("conversation"))["conversation"]["title"] == "hi"
    # A later resend (the message is published) is an ack again, nothing more.
    await client.send(send)
    assert (await client.expect("ack"))["duplicate"] is True
    await other_tab.send({"type": "ping", "ref": "q"})
    await other_tab.expect("pong", ref="q")
    assert [f for f in other_tab.inbox if f.get("client_id") == "m1"] == []  # not again


async def test_a_frame_the_server_fails_on_gets_an_error_naming_it_and_when_to_send_again(
    webchat: Webchat, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = webchat.connector.context.store
    append = store.append_history_once
    failures = [StoreError("redis store at 127.0.0.1:6379/0: Connection refused")]

    async def store_down_once(*args: Any, **kwargs: Any) -> Any:
        if failures:
            raise failures.pop()
        return await append(*args, **kwargs)

    monkeypatch.setattr(store, "append_history_once", store_down_once)
    client = await webchat.authed()
    send = {
        "type": "send",
        "thread_id": client.thread_id,
        "client_id": "m7",
        "text": "hi",
        "ref": "r1",
    }
    await client.send(send)
    error = await client.expect("error")
    assert error["code"] == "internal" and error["retry_after"] > 0
    assert (error["ref"], error["client_id"], error["thread_id"]) == ("r1", "m7", client.thread_id)
    await client.send(send)  # sent again, as told
    assert (await client.expect("ack"))["client_id"] == "m7"


class _OtherNodes:
    """Stands in for the Redis fan-out (`WebchatFanout`): what other nodes publish arrives
    through the receiver the connector registers."""

    def __init__(self) -> None:
        self.receiver: Any = None

    def set_receiver(self, receiver: Any) -> None:
        self.receiver = receiver

    async def publish(self, session_id: str, frame_text: str) -> None:
        pass


async def test_a_tab_joining_here_is_caught_up_on_a_reply_streaming_on_another_node(
    webchat: Webchat,
) -> None:
    others = _OtherNodes()
    webchat.connector.use_fanout(others)  # type: ignore[arg-type]
    client = await webchat.authed()
    thread, session = client.thread_id, client.session_id

    def from_other_node(frame: dict[str, Any]) -> None:
        others.receiver(session, json.dumps(frame, separators=(",", ":")))

    for piece in ("Once upon ", "a time"):
        from_other_node({"type": "delta", "thread_id": thread, "stream_id": "t-9", "text": piece})
    await client.send({"type": "history", "thread_id": thread, "ref": "h"})
    await client.expect("history", ref="h")
    caught_up = await client.expect("delta", from_start=True)
    assert caught_up["text"] == "Once upon a time" and caught_up["stream_id"] == "t-9"

    # The node running the turn stopped; the turn runs again under a new stream: only that
    # one is caught up on, and the final message ends it.
    from_other_node({"type": "delta", "thread_id": thread, "stream_id": "t-10", "text": "Once"})
    await client.send({"type": "history", "thread_id": thread, "ref": "h2"})
    await client.expect("history", ref="h2")
    again = await client.expect("delta", from_start=True)
    assert (again["stream_id"], again["text"]) == ("t-10", "Once")
    final = {"type": "message", "thread_id": thread, "seq": 2, "role": "assistant"}
    from_other_node({**final, "text": "Once more", "stream_id": "t-10"})
    await client.send({"type": "history", "thread_id": thread, "ref": "h3"})
    await client.expect("history", ref="h3")
    await client.send({"type": "ping", "ref": "p"})
    assert [f for f in client.inbox if f.get("from_start")] == []
    await client.expect("pong", ref="p")
    assert [f for f in client.inbox if f.get("from_start")] == []


async def test_a_stream_another_node_ended_is_not_caught_up_on_here(webchat: Webchat) -> None:
    others = _OtherNodes()
    webchat.connector.use_fanout(others)  # type: ignore[arg-type]
    client = await webchat.authed()
    thread, session = client.thread_id, client.session_id

    def from_other_node(frame: dict[str, Any]) -> None:
        others.receiver(session, json.dumps(frame, separators=(",", ":")))

    from_other_node({"type": "delta", "thread_id": thread, "stream_id": "t-9", "text": "Once"})
    from_other_node({"type": "stream_end", "thread_id": thread, "stream_id": "t-9"})
    assert (await client.expect("stream_end"))["stream_id"] == "t-9"  # passed on to the tab
    await client.send({"type": "history", "thread_id": thread, "ref": "h"})
    await client.expect("history", ref="h")
    assert [f for f in await client.drain_until_pong() if f.get("from_start")] == []


@pytest.mark.parametrize("authed", [False, True])
async def test_a_lone_surrogate_is_a_bad_frame_and_the_socket_lives(
    webchat: Webchat, authed: bool
) -> None:
    # JSON's "\\ud800" escape decodes to a string that is not text: echoed in an error, it
    # used to break the socket's write (closed with 1006, a traceback in the log).
    if not authed:
        stranger = await webchat.client()
        await stranger.send('{"type":"auth","token":"' + TOKEN_A + '","ref":"\\ud800"}')
        refused = await stranger.recv()
        assert refused["code"] == "unauthorized" and "surrogate" in refused["message"]
        assert "ref" not in refused
        return
    client = await webchat.authed()
    await client.send('{"type":"ping","ref":"\\ud800"}')
    error = await client.expect("error")
    assert error["code"] == "bad_frame" and "surrogate" in error["message"]
    assert "ref" not in error
    ids = f'"thread_id":"{client.thread_id}","client_id":"s1"'
    await client.send('{"type":"send",' + ids + ',"text":"a\\udc00"}')
    error = await client.expect("error")
    assert error["code"] == "bad_frame" and error["client_id"] == "s1"
    frames = await client.turn("still usable 😀", "s2")  # a proper pair is fine
    assert frames[-1]["text"] == "echo: still usable 😀"


async def test_the_conversation_limit_error_carries_the_ref(
    webchat: Webchat, monkeypatch: pytest.MonkeyPatch
) -> None:
    from talkbridge.webchat import sessions

    monkeypatch.setattr(sessions, "MAX_CONVERSATIONS", 1)
    client = await webchat.authed()
    await client.send({"type": "new_conversation", "ref": "over"})
    error = await client.expect("error", ref="over")
    assert error["code"] == "too_large" and "at most 1 conversations" in error["message"]


async def test_a_long_frame_dropped_by_the_rate_limit_is_still_named(
    start_webchat: StartWebchat,
) -> None:
    chat = await start_webchat(max_frame_bytes=16384)
    chat.connector.frame_rate = 0.01
    chat.connector.frame_burst = 0
    client = await chat.authed()
    send = {"type": "send", "thread_id": client.thread_id, "client_id": "long", "text": "x" * 5000}
    await client.send(send)
    error = await client.expect("error")
    assert error["code"] == "rate_limited" and error["client_id"] == "long"
    assert error["thread_id"] == client.thread_id


async def test_a_socket_that_stops_reading_is_cut_instead_of_buffered_without_end(
    start_webchat: StartWebchat,
) -> None:
    chat = await start_webchat(history_limit=1)
    chat.connector.slow_socket_bytes = 64 * 1024
    stalled = await chat.authed()
    stalled.ws.transport.pause_reading()  # a tab whose network died without a close
    thread = stalled.thread_id
    big = "x" * (1 << 20)
    for n in range(1, 65):  # far more than the kernel's socket buffers take
        await chat.connector.send(OutboundMessage(thread_id=thread, text=f"{n} {big}"))
        if chat.connector.socket_count() == 0:
            break
    # It was buffering every frame of its session in the server's memory, without end.
    assert chat.connector.socket_count() == 0
    stalled.ws.transport.resume_reading()
    with pytest.raises(ConnectionClosed):
        while True:
            await asyncio.wait_for(stalled.ws.recv(), TIMEOUT)
    # The page reconnects and resumes from history: nothing is lost.
    again = await chat.authed(session_id=stalled.session_id)
    await again.send({"type": "history", "thread_id": thread, "after_seq": n - 1})
    [last] = (await again.expect("history"))["messages"]
    assert last["seq"] == n and last["text"].startswith(f"{n} ")


async def test_a_token_in_a_frame_never_reaches_the_debug_log(
    start_webchat: StartWebchat, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="test.webchat")
    caplog.set_level(logging.DEBUG, logger="test.webchat.webchat.sockets")
    chat = await start_webchat()
    signed = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.c2lnbmF0dXJlLXRhaWwtc2VjcmV0"
    for token in (TOKEN_A, signed):
        client = await chat.client()
        # The token last: websockets' debug line keeps a frame's end, without the key.
        await client.send('{"type":"auth","session_id":"' + "f" * 32 + f'","token":"{token}"}}')
        await client.recv()
        await client.ws.close()
    assert '< TEXT \'{"type":' in caplog.text.replace(": ", ":")  # the frames are logged
    assert TOKEN_A[-10:] not in caplog.text and signed[-10:] not in caplog.text


async def test_a_file_sent_with_a_caption_is_named_after_it_not_dropped(
    webchat: Webchat,
) -> None:
    """The page shows no files: each attachment is a line of its own after the text (a photo
    forwarded from Telegram with its caption lost the photo without a word)."""
    client = await webchat.authed()
    photo = Attachment(kind="image", name="beach.jpg", data=b"jpeg")
    await webchat.connector.send(
        OutboundMessage(thread_id=client.thread_id, text="Holiday", attachments=(photo,))
    )
    await webchat.connector.send(
        OutboundMessage(
            thread_id=client.thread_id, attachments=(Attachment(kind="document", data=b"%PDF"),)
        )
    )
    texts = [(await client.expect("message"))["text"] for _ in range(2)]
    assert texts == ["Holiday\n\n[attachment: beach.jpg]", "[attachment: document]"]


async def test_a_store_failure_while_a_reply_is_kept_is_a_passing_one(
    webchat: Webchat, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The webchat's send is its store write: an outage of the store (Redis down, the SQLite
    writer restarting) is retried by the send queue like a platform's 503, not failed at once
    as a connector bug (the reply was lost)."""
    client = await webchat.authed()
    keep = webchat.store.append_history
    calls = 0

    async def outage_once(*args: Any, **kwargs: Any) -> HistoryEntry:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise StoreError("redis 127.0.0.1:6390 is unreachable")
        return await keep(*args, **kwargs)

    monkeypatch.setattr(webchat.store, "append_history", outage_once)
    reply = OutboundMessage(thread_id=client.thread_id, text="hello")
    with pytest.raises(TransientError, match=r"could not be kept: redis 127\.0\.0\.1:6390"):
        await webchat.connector.send(reply)
    await webchat.connector.send(reply)  # the queue's next try
    assert (await client.expect("message"))["text"] == "hello"
