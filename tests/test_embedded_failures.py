"""The embedded default on an operator's bad day: a bridge killed mid-reply, a store whose disk
goes bad, two bridges on one file or port. Each as real `talkbridge run` processes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
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
        messages: list[Any] = []
        ask: dict[str, Any] = {"after_seq": 0}
        while True:  # the latest page, then the earlier ones
            await ws.send(json.dumps({"type": "history", "thread_id": thread, **ask}))
            page = await _frames_until(ws, "history")
            messages = page["messages"] + messages
            if not page["earlier"]:
                return messages
            ask = {"before_seq": page["messages"][0]["seq"]}


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


class _Page:
    """One webchat client as the page behaves: an outbox of client ids, resent with the same
    ids after a reconnect until each is acknowledged."""

    def __init__(self, name: str, count: int) -> None:
        self.outbox = [f"{name}-{n}" for n in range(count)]
        self.acked: set[str] = set()
        self.session: str | None = None
        self.thread = ""
        self.written = asyncio.Event()

    async def send_all(self, ws_url: str, token: str, *, until_acked: bool) -> None:
        async with websockets.connect(ws_url) as ws:
            auth = {"type": "auth", "token": token}
            if self.session is not None:
                auth["session_id"] = self.session
            await ws.send(json.dumps(auth))
            ready = await _frames_until(ws, "ready")
            self.session = ready["session_id"]
            self.thread = self.thread or ready["conversations"][0]["thread_id"]
            waiting = [c for c in self.outbox if c not in self.acked]
            for cid in waiting:
                text = f"text of {cid}"
                frame = {"type": "send", "thread_id": self.thread, "client_id": cid, "text": text}
                await ws.send(json.dumps(frame))
            self.written.set()
            try:
                while not self.acked.issuperset(waiting):
                    frame = json.loads(await asyncio.wait_for(ws.recv(), 30))
                    if frame["type"] == "ack":
                        self.acked.add(frame["client_id"])
                    assert frame["type"] != "error", frame
            except websockets.ConnectionClosed:
                assert not until_acked, "the socket closed before every send was acknowledged"

    async def last_answered(self, ws_url: str, token: str) -> None:
        async with websockets.connect(ws_url) as ws:
            await ws.send(json.dumps({"type": "auth", "token": token, "session_id": self.session}))
            await _frames_until(ws, "ready")
            text = "text of last"
            frame = {"type": "send", "thread_id": self.thread, "client_id": "last", "text": text}
            await ws.send(json.dumps(frame))
            await _frames_until(ws, "message", role="assistant", text="text of last")


async def test_a_bridge_stopped_mid_traffic_loses_nothing_and_answers_each_message_once(
    tmp_path: Path,
) -> None:
    """20 pages x 30 messages, and the bridge stopped while they send: SIGTERM, SIGINT, then
    `kill -9`. Each stop is clean (exit 0, and no error logged: the webchat's sockets went on
    reading frames after the store had closed, `webchat frame failed: ... not open`); after
    each restart the pages resend what was not acknowledged, with the same ids, and every
    message has one entry and one answer in its thread."""
    pages = [_Page(f"p{n}", 30) for n in range(20)]
    for stop in (signal.SIGTERM, signal.SIGINT, signal.SIGKILL):
        for page in pages:
            page.written.clear()
        process = await talkbridge("run", "--port", "0", cwd=tmp_path)
        base, token = (await _url_of(process)).split("?token=")
        ws_url = base.replace("http://", "ws://") + "ws"
        sending = [
            asyncio.ensure_future(p.send_all(ws_url, token, until_acked=False)) for p in pages
        ]
        await asyncio.gather(*(p.written.wait() for p in pages))  # the bridge is behind
        process.send_signal(stop)
        code, _, err = await finish(process)
        await asyncio.gather(*sending)
        if stop != signal.SIGKILL:
            assert code == 0, err
            assert "ERROR" not in err and "Traceback" not in err and "destroyed" not in err, err
            again = "a second SIGTERM" if stop == signal.SIGTERM else "Ctrl-C again"
            assert f"(up to 10 s; {again} stops at once)" in err, err  # what was sent
    process = await talkbridge("run", "--port", "0", cwd=tmp_path)
    try:
        base, token = (await _url_of(process)).split("?token=")
        ws_url = base.replace("http://", "ws://") + "ws"
        await asyncio.gather(*(p.send_all(ws_url, token, until_acked=True) for p in pages))
        # One more each, answered last: a thread runs its turns in order.
        await asyncio.gather(*(p.last_answered(ws_url, token) for p in pages))
        for page in pages:
            history = await _history(ws_url, token, page.session or "", page.thread)
            assert [m["seq"] for m in history] == list(range(1, len(history) + 1))
            users = [m["client_id"] for m in history if m["role"] == "user"]
            answers = [m["text"] for m in history if m["role"] == "assistant"]
            assert sorted(users) == sorted([*page.outbox, "last"])  # each once, none lost
            assert sorted(answers) == sorted(f"text of {c}" for c in [*page.outbox, "last"])
    finally:
        process.send_signal(signal.SIGINT)
        code, _, err = await finish(process)
    assert code == 0, err


@contextlib.contextmanager
def _read_only_folder(folder: Path) -> Iterator[str]:
    """`folder` made read-only, the way this process can: a read-only tmpfs mounted on it as
    root (whom permissions do not stop), its mode otherwise. Yields what the error says."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        try:
            yield f"the folder {folder} is not writable"
        finally:
            folder.chmod(0o755)
        return
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(folder)], capture_output=True
    )
    if mounted.returncode != 0:  # root without the right to mount (a container)
        pytest.skip(f"cannot mount a tmpfs: {mounted.stderr.decode().strip()}")
    try:
        yield f"the folder {folder} is on a read-only file system"
    finally:
        subprocess.run(["umount", str(folder)], check=True)


async def test_a_store_in_a_read_only_folder_says_so_at_start(tmp_path: Path) -> None:
    """SQLite says only "unable to open database file"; the error now says why."""
    folder = tmp_path / "data"
    folder.mkdir()
    (tmp_path / "talkbridge.yaml").write_text("store: sqlite:///data/talkbridge.db\n")
    with _read_only_folder(folder) as why:
        code, out, err = await finish(await talkbridge("run", "--port", "0", cwd=tmp_path))
    assert code == 1 and "http://" not in out, err
    assert err == (
        "talkbridge: starting…\n"
        f"talkbridge: cannot open the sqlite store at {folder}/talkbridge.db: unable to open "
        f"database file ({why})\n"
    )
