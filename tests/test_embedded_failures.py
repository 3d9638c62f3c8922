"""The embedded default on an operator's bad day: a bridge killed mid-reply, a store whose disk
goes bad, two bridges on one file or port. Each as real `talkbridge run` processes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
from pathlib import Path
from typing import Any

import aiohttp
import websockets

from tests.support.cli import finish, talkbridge
from tests.test_cli import _url_of

# Answers once the test writes to the FIFO `gate` beside it (while that exists): the test holds
# a turn between the store's accepting its message and the reply.
_GATED_AGENT = """
import asyncio
from pathlib import Path

from talkbridge.agents import Result, TextDelta


class Gated:
    name = "gated"

    async def stream(self, ctx):
        gate = Path(__file__).with_name("gate")
        if gate.exists():
            yield TextDelta(text="thinking")
            await asyncio.to_thread(gate.read_text)
        yield Result(text="answer to " + ctx.message.text)
"""


async def _frames_until(ws: Any, kind: str, **match: Any) -> dict[str, Any]:
    while True:
        frame = json.loads(await asyncio.wait_for(ws.recv(), 30))
        if frame["type"] == kind and all(frame.get(k) == v for k, v in match.items()):
            return dict(frame)


async def _history(ws_url: str, token: str, session_id: str, thread: str) -> list[Any]:
    async with websockets.connect(ws_url) as ws:
        await ws.send(json.dumps({"type": "auth", "token": token, "session_id": session_id}))
        await _frames_until(ws, "ready")
        await ws.send(json.dumps({"type": "history", "thread_id": thread}))
        return list((await _frames_until(ws, "history"))["messages"])


async def test_a_bridge_killed_after_keeping_a_reply_but_before_recording_it_answers_once(
    tmp_path: Path,
) -> None:
    """`kill -9` between the reply's history entry and the record of its send (`sent`): the
    message is still pending, so the next start runs its turn again. It used to add a second
    answer to the thread; the reply is now kept once per message (20 clients x 50 messages
    killed mid-traffic showed one doubled answer per busy thread)."""
    (tmp_path / "gatedagent.py").write_text(_GATED_AGENT)
    (tmp_path / "talkbridge.yaml").write_text(
        'agents: {default: g, definitions: {g: {kind: python, target: "gatedagent:Gated"}}}\n'
    )
    gate = tmp_path / "gate"
    os.mkfifo(gate)
    process = await talkbridge("run", "--port", "0", cwd=tmp_path)
    base, token = (await _url_of(process)).split("?token=")
    ws_url = base.replace("http://", "ws://") + "ws"
    db = tmp_path / "talkbridge.db"
    async with websockets.connect(ws_url) as ws:
        await ws.send(json.dumps({"type": "auth", "token": token}))
        ready = await _frames_until(ws, "ready")
        session, thread = ready["session_id"], ready["conversations"][0]["thread_id"]
        send = {"type": "send", "thread_id": thread, "client_id": "c1", "text": "hi"}
        await ws.send(json.dumps(send))
        await _frames_until(ws, "delta")  # accepted (acked) and its turn under way
        with sqlite3.connect(db) as reader:  # what a kill -9 now leaves: the message pending
            ((message_id, body),) = reader.execute(
                "SELECT message_id, body FROM inbound WHERE body IS NOT NULL"
            ).fetchall()
        reader.close()
        gate.write_text("go")
        await _frames_until(ws, "message", role="assistant")
    process.send_signal(signal.SIGINT)
    code, _, err = await finish(process)
    assert code == 0, err
    gate.unlink()
    # The store as a kill -9 leaves it after the reply's entry was written and before the
    # record of its send and the message's completion were.
    with sqlite3.connect(db) as writer:
        writer.execute("UPDATE inbound SET body = ? WHERE message_id = ?", (body, message_id))
        writer.execute("DELETE FROM sent")
    writer.close()

    again = await talkbridge("run", "--port", "0", cwd=tmp_path)
    base, token = (await _url_of(again)).split("?token=")
    ws_url = base.replace("http://", "ws://") + "ws"
    async with websockets.connect(ws_url) as ws:
        await ws.send(json.dumps({"type": "auth", "token": token, "session_id": session}))
        await _frames_until(ws, "ready")
        # A thread runs one turn at a time, in order: once the next message is answered, the
        # turn run again after the restart is over.
        await ws.send(json.dumps({**send, "client_id": "c2", "text": "next"}))
        await _frames_until(ws, "message", role="assistant", text="answer to next")
    history = await _history(ws_url, token, session, thread)
    again.send_signal(signal.SIGINT)
    code, _, err = await finish(again)
    assert code == 0, err
    assert [(m["role"], m["text"]) for m in history] == [
        ("user", "hi"),
        ("assistant", "answer to hi"),
        ("user", "next"),
        ("assistant", "answer to next"),
    ]


async def test_a_store_another_process_locks_refuses_sends_unacknowledged_and_healthz_says_so(
    tmp_path: Path,
) -> None:
    """A `sqlite3` shell left holding the file's write lock while the bridge runs: a webchat
    send gets an `internal` error (no ack: the page keeps it and sends it again), `/healthz`
    names the file and what is wrong, and once the lock goes the resend is answered once."""
    process = await talkbridge("run", "--port", "0", cwd=tmp_path)
    try:
        base, token = (await _url_of(process)).split("?token=")
        db = tmp_path / "talkbridge.db"
        async with websockets.connect(base.replace("http://", "ws://") + "ws") as ws:
            await ws.send(json.dumps({"type": "auth", "token": token}))
            thread = (await _frames_until(ws, "ready"))["conversations"][0]["thread_id"]
            send = {"type": "send", "thread_id": thread, "client_id": "c1", "text": "hi"}
            holder = sqlite3.connect(db, isolation_level=None)
            holder.execute("BEGIN EXCLUSIVE")
            try:
                await ws.send(json.dumps(send))
                frame = json.loads(await asyncio.wait_for(ws.recv(), 30))
                assert frame["type"] == "error", frame  # not an ack
                assert (frame["code"], frame["client_id"]) == ("internal", "c1")
                assert "store is failing" in frame["message"] and str(db) not in frame["message"]
                async with aiohttp.ClientSession() as http, http.get(f"{base}healthz") as got:
                    health = await got.json()
                assert health["status"] == "degraded"
                assert health["store"] == {
                    "state": "down",
                    "error": f"writes are failing: sqlite store at {db}: database is locked",
                }
            finally:
                holder.execute("ROLLBACK")
                holder.close()
            await ws.send(json.dumps(send))  # the page's resend, same client id
            ack = await _frames_until(ws, "ack")
            assert (ack["client_id"], ack["duplicate"]) == ("c1", False)
            await _frames_until(ws, "message", role="assistant", text="hi")
            async with aiohttp.ClientSession() as http, http.get(f"{base}healthz") as got:
                assert (await got.json())["store"] == {"state": "up"}
    finally:
        process.send_signal(signal.SIGINT)
        code, _, err = await finish(process)
    assert code == 0, err
