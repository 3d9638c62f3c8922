"""The front door, as a new user meets it: `talkbridge init | run | check | pair` as processes."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
from pathlib import Path

import websockets

from talkbridge.bridge import Bridge
from talkbridge.config import ConnectionConfig, load_config
from talkbridge.message import utcnow
from talkbridge.store import Pairing, SqliteStore
from tests.support.cli import finish, talkbridge
from tests.support.talk_connector import TalkConnector, make_message


async def test_run_on_the_embedded_default_chats_and_stops_cleanly(tmp_path: Path) -> None:
    process = await talkbridge("run", "--port", "0", cwd=tmp_path)
    assert process.stdout is not None
    url = ""
    while not url:
        line = (await asyncio.wait_for(process.stdout.readline(), 60)).decode()
        assert line, "talkbridge run exited before printing the URL"
        if line.startswith("http://"):
            url = line.strip()
    assert "?token=" in url
    base, token = url.split("?token=")
    ws_url = base.replace("http://", "ws://") + "ws"
    async with websockets.connect(ws_url) as ws:
        await ws.send(json.dumps({"type": "auth", "token": token}))
        ready = json.loads(await ws.recv())
        assert ready["type"] == "ready"
        thread = ready["conversations"][0]["thread_id"]
        await ws.send(
            json.dumps({"type": "send", "thread_id": thread, "client_id": "c1", "text": "hi!"})
        )
        while True:
            frame = json.loads(await asyncio.wait_for(ws.recv(), 30))
            if frame["type"] == "message" and frame["role"] == "assistant":
                break
        assert frame["text"] == "hi!"
    process.send_signal(signal.SIGINT)
    code, _, err = await finish(process)
    assert code == 0, err
    assert "stopping" in err
    assert token not in err  # the token is printed once, on stdout, for the operator
    assert (tmp_path / "talkbridge.db").exists()  # the embedded default store


async def test_run_on_a_port_in_use_says_so_and_exits(tmp_path: Path) -> None:
    holder = socket.create_server(("127.0.0.1", 0))
    port = holder.getsockname()[1]
    try:
        code, out, err = await finish(await talkbridge("run", "--port", str(port), cwd=tmp_path))
    finally:
        holder.close()
    assert code == 1 and "http://" not in out
    assert f"cannot start: webchat cannot listen on 127.0.0.1:{port}: the port is in use" in err
    assert "choose another with --port" in err


async def test_run_with_a_port_out_of_range_is_a_usage_error(tmp_path: Path) -> None:
    code, out, err = await finish(await talkbridge("run", "--port", "99999", cwd=tmp_path))
    assert code == 2 and "http://" not in out
    assert "argument --port: 99999 is not a port: use 0-65535" in err


async def test_run_with_a_host_that_is_no_address_is_a_usage_error(tmp_path: Path) -> None:
    code, out, err = await finish(await talkbridge("run", "--host", "999.1.1.1", cwd=tmp_path))
    assert code == 2 and "http://" not in out
    assert "argument --host: '999.1.1.1' is not a host: not an IP address or host name" in err


async def test_init_writes_a_starter_whose_hook_acts_on_messages(tmp_path: Path) -> None:
    code, _, err = await finish(await talkbridge("init", cwd=tmp_path))
    assert code == 0, err
    assert (tmp_path / "talkbridge.yaml").exists()
    assert (tmp_path / "hooks/channel-message/keyword-router/hook.py").exists()
    again, _, err = await finish(await talkbridge("init", cwd=tmp_path))
    assert again == 2 and "already exists" in err

    config, secrets = load_config(tmp_path / "talkbridge.yaml")
    bridge = Bridge(config, secrets, with_webchat=False)
    conn = TalkConnector("chat")
    bridge.registry.add(conn, ConnectionConfig(id="chat", channel="webchat", trusted=("*",)))
    await bridge.start()
    await conn.inject(make_message("buy cheap spam now", connection_id="chat"))
    await conn.inject(make_message("I want a refund", connection_id="chat"))
    await conn.wait_sent(1)
    await bridge.router.join()
    await bridge.stop()
    assert conn.texts() == ["[billing] I want a refund"]


async def test_bad_config_exits_2_naming_the_key_and_hiding_secrets(tmp_path: Path) -> None:
    (tmp_path / "talkbridge.yaml").write_text(
        "webchat:\n  port: ${PORT_VALUE}\nconnections:\n  - id: bot\n    channel: telegram\n"
        "    token: ${TG}\n    mode: carrier-pigeon\n"
    )
    env = {"PORT_VALUE": "eighty-s3cr3t", "TG": "12345:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"}
    for command in ("run", "check"):
        code, out, err = await finish(await talkbridge(command, cwd=tmp_path, env=env))
        assert code == 2
        assert "webchat.port" in err and "connections[0].mode" in err
        assert "s3cr3t" not in err + out and "AAAAAAAA" not in err + out


async def test_missing_config_file_and_unknown_command(tmp_path: Path) -> None:
    code, _, err = await finish(await talkbridge("run", "--config", "nope.yaml", cwd=tmp_path))
    assert code == 2 and "nope.yaml" in err
    code, _, err = await finish(await talkbridge("fly", cwd=tmp_path))
    assert code == 2 and "invalid choice" in err


async def test_pair_list_and_approve(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "talkbridge.db")
    await store.open()
    await store.create_pairing(
        Pairing("ABCD-EFGH", "support", "4242", "Grace", utcnow(), approved=False)
    )
    await store.close()
    code, out, _ = await finish(await talkbridge("pair", "list", cwd=tmp_path))
    assert code == 0 and "ABCD-EFGH" in out and "4242" in out and "Grace" in out
    code, _, err = await finish(await talkbridge("pair", "approve", "ZZZZ-ZZZZ", cwd=tmp_path))
    assert code == 1 and "no pending pairing" in err
    code, out, _ = await finish(await talkbridge("pair", "approve", "abcd-efgh", cwd=tmp_path))
    assert code == 0 and "now trusted" in out
    store = SqliteStore(tmp_path / "talkbridge.db")
    await store.open()
    assert await store.is_trusted("support", "4242")
    await store.close()
    code, out, _ = await finish(await talkbridge("pair", "list", cwd=tmp_path))
    assert "no pending pairings" in out


async def test_check_with_only_the_webchat(tmp_path: Path) -> None:
    code, out, _ = await finish(await talkbridge("check", cwd=tmp_path))
    assert code == 0 and "config: ok" in out and "no connections to check" in out
