"""The front door, as a new user meets it: `talkbridge init | run | check | pair` as processes."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import logging
import os
import shlex
import signal
import socket
import sys
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit
from urllib.request import url2pathname

import aiohttp
import pytest
import websockets
from aiohttp import web

import talkbridge as talkbridge_package
from talkbridge.bridge import Bridge
from talkbridge.cli import build_parser
from talkbridge.config import BridgeConfig, ConnectionConfig, load_config
from talkbridge.connectors.extras import installed_direct_url
from talkbridge.message import utcnow
from talkbridge.store import Pairing, SqliteStore, public_url
from tests.conftest import require
from tests.peers.http import free_port, serve
from tests.peers.openai import ChatCompletionsPeer
from tests.peers.redis import private_redis, redis_url
from tests.peers.telegram import TelegramBotAPIPeer, private_text
from tests.support.cli import finish, talkbridge, write_config
from tests.support.talk_connector import TalkConnector, make_message

STARTING = "talkbridge: starting…"
"""What `run` says at once, before it imports the connectors' SDKs and opens the store."""


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


SDKS = ("aiogram", "slack_sdk", "discord", "aioimaplib", "aiosmtplib", "redis", "aiohttp")
"""The connectors' (and the Redis store's) client libraries: seconds to import, all told."""


def _imported(line: str) -> str | None:
    """The module a `-X importtime` line of stderr names (None for any other line)."""
    if not line.startswith("import time:"):
        return None
    return line.rpartition("|")[2].strip()


@pytest.mark.parametrize(
    ("command", "first", "exit_code"),
    [(("run", "--port", "0"), STARTING, 0), (("check",), "talkbridge: checking…", 1)],
    ids=["run", "check"],
)
async def test_a_command_says_what_it_does_before_it_imports_a_connections_sdk(
    tmp_path: Path, command: tuple[str, ...], first: str, exit_code: int
) -> None:
    """Importing aiogram alone takes seconds: `run` printed nothing until the URL (`check`
    nothing until its table), and a new user took it for a hang. The first line comes before
    any SDK is imported."""
    require(importlib.util.find_spec("aiogram") is not None, "aiogram is not installed")
    (tmp_path / "talkbridge.yaml").write_text(
        "connections: [{id: bot, channel: telegram, token: '1:x', "
        f"api_base: 'http://127.0.0.1:{free_port()}'}}]\n"  # nobody there: `check` fails it
    )
    process = await talkbridge(*command, cwd=tmp_path, env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert process.stderr is not None
    while True:  # until the first line, or an SDK imported before it
        line = (await asyncio.wait_for(process.stderr.readline(), 60)).decode().rstrip("\n")
        assert line, f"talkbridge {command[0]} ended without saying what it does"
        module = _imported(line)
        if line == first or (module and module.split(".")[0] in SDKS):
            break
    assert line == first, f"{module} was imported before `{command[0]}` said anything"
    while _imported(line) != "aiogram":  # it is imported after: the wait the line announces
        line = (await asyncio.wait_for(process.stderr.readline(), 60)).decode().rstrip("\n")
        assert line, f"talkbridge {command[0]} ended before it imported the telegram SDK"
    if command[0] == "run":
        process.send_signal(signal.SIGINT)
    code, _, err = await finish(process)
    assert code == exit_code, err


async def test_run_on_the_embedded_default_imports_no_sdk(tmp_path: Path) -> None:
    """No connection but the webchat: no connector's SDK, nor redis, is loaded."""
    process = await talkbridge(
        "run", "--port", "0", cwd=tmp_path, env={"PYTHONPROFILEIMPORTTIME": "1"}
    )
    assert process.stderr is not None
    err = asyncio.ensure_future(process.stderr.read())  # read all along: a full pipe blocks it
    await _url_of(process)
    process.send_signal(signal.SIGINT)
    assert await asyncio.wait_for(process.wait(), 60) == 0
    lines = (await err).decode().splitlines()
    assert lines[0] != STARTING  # the interpreter's own imports come first: the count works
    assert STARTING in lines
    imported = {m.split(".")[0] for m in map(_imported, lines) if m}
    assert "talkbridge" in imported and "websockets" in imported
    assert imported.isdisjoint(SDKS), sorted(imported & set(SDKS))


async def test_run_on_every_ipv6_interface_prints_a_link_that_works_and_warns(
    tmp_path: Path,
) -> None:
    try:
        socket.create_server(("::1", 0), family=socket.AF_INET6).close()
    except OSError:
        require(False, "no IPv6 loopback here")
    process = await talkbridge("run", "--host", "::", "--port", "0", cwd=tmp_path)
    url = await _url_of(process)
    assert url.startswith("http://[::1]:"), url  # `::` is IPv6 only: 127.0.0.1 finds nobody
    base, token = url.split("?token=")
    async with websockets.connect(base.replace("http://", "ws://") + "ws") as ws:
        await ws.send(json.dumps({"type": "auth", "token": token}))
        assert json.loads(await ws.recv())["type"] == "ready"
    process.send_signal(signal.SIGINT)
    code, _, err = await finish(process)
    assert code == 0, err
    assert (
        "talkbridge: warning: the webchat is served as plain HTTP on every interface (::), so "
        "its token travels in the clear: put a TLS reverse proxy in front" in err
    )


async def test_run_with_configured_tokens_says_to_add_one_and_never_prints_it(
    tmp_path: Path,
) -> None:
    (tmp_path / "talkbridge.yaml").write_text('webchat: {tokens: ["my-own-webchat-token"]}\n')
    process = await talkbridge("run", "--port", "0", cwd=tmp_path)
    url = await _url_of(process)
    assert url.endswith("/?token=<one of webchat.tokens>"), url
    process.send_signal(signal.SIGINT)
    code, out, err = await finish(process)
    assert code == 0, err
    assert "my-own-webchat-token" not in url + out + err


async def test_an_issuer_secret_empty_is_refused_and_a_short_one_is_warned_of(
    tmp_path: Path,
) -> None:
    config = "webchat: {issuer: {secret: '${ISSUER_SECRET}'}}\n"
    (tmp_path / "talkbridge.yaml").write_text(config)
    code, _, err = await finish(
        await talkbridge("run", "--port", "0", cwd=tmp_path, env={"ISSUER_SECRET": " "})
    )
    assert code == 2 and "webchat.issuer.secret: is empty" in err, err
    process = await talkbridge("run", "--port", "0", cwd=tmp_path, env={"ISSUER_SECRET": "s3cr"})
    await _url_of(process)
    process.send_signal(signal.SIGINT)
    code, _, err = await finish(process)
    assert code == 0 and "webchat.issuer.secret is shorter than 32 bytes" in err, err
    assert "s3cr" not in err


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


async def test_a_second_run_on_the_same_port_says_one_fatal_line_and_no_warning(
    tmp_path: Path,
) -> None:
    (tmp_path / "one").mkdir()  # a store of its own: only the port is shared
    first = await talkbridge("run", "--port", "0", cwd=tmp_path / "one")
    try:
        port = (await _url_of(first)).split(":")[2].split("/")[0]
        code, out, err = await finish(await talkbridge("run", "--port", port, cwd=tmp_path))
    finally:
        first.send_signal(signal.SIGINT)
        assert (await finish(first))[0] == 0
    assert code == 1 and "http://" not in out
    assert err.splitlines() == [  # the fatal line only: no registry warning (retrying) first
        STARTING,
        f"talkbridge: cannot start: webchat cannot listen on 127.0.0.1:{port}: the port is in "
        "use (another talkbridge?); choose another with --port or webchat.port",
    ]


async def test_a_second_run_on_the_same_sqlite_store_stops_at_start_naming_the_first(
    tmp_path: Path,
) -> None:
    """A second bridge on one SQLite file would take the first's messages under way for left
    over from a crash, and answer them again."""
    first = await talkbridge("run", "--port", "0", cwd=tmp_path)
    try:
        await _url_of(first)
        code, out, err = await finish(await talkbridge("run", "--port", "0", cwd=tmp_path))
        assert code == 1 and "http://" not in out, err
        assert err == (
            f"{STARTING}\n"
            "talkbridge: the store sqlite:///talkbridge.db is in use by another talkbridge run "
            f"(pid {first.pid}): a SQLite store serves one bridge at a time (several share a "
            "redis:// store)\n"
        )
        code, out, err = await finish(await talkbridge("pair", "list", cwd=tmp_path))
        assert code == 0 and out == "no pending pairings\n", err  # the store's commands work
    finally:
        first.send_signal(signal.SIGINT)
        assert (await finish(first))[0] == 0
    again = await talkbridge("run", "--port", "0", cwd=tmp_path)  # the lock went with it
    await _url_of(again)
    again.send_signal(signal.SIGINT)
    assert (await finish(again))[0] == 0


async def test_a_bridge_an_app_started_keeps_run_off_its_store_and_pair_and_check_work(
    tmp_path: Path,
) -> None:
    """The lock was `talkbridge run`'s own: a run beside an app's Bridge on the same file
    started, and answered again the messages the app had under way."""
    bridge = Bridge(
        BridgeConfig.model_validate({"store": f"sqlite:///{tmp_path / 'talkbridge.db'}"}),
        with_webchat=False,
    )
    await bridge.start()
    try:
        code, out, err = await finish(await talkbridge("run", "--port", "0", cwd=tmp_path))
        assert code == 1 and "http://" not in out, err
        assert err == (
            f"{STARTING}\n"
            "talkbridge: the store sqlite:///talkbridge.db is in use by another talkbridge run "
            f"(pid {os.getpid()}): a SQLite store serves one bridge at a time (several share a "
            "redis:// store)\n"
        )
        code, out, err = await finish(await talkbridge("check", cwd=tmp_path))
        assert code == 0 and "ok    store  sqlite:///talkbridge.db  opened and read" in out, err
        code, out, err = await finish(await talkbridge("pair", "list", cwd=tmp_path))
        assert code == 0 and out == "no pending pairings\n", err
    finally:
        await bridge.stop()


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
    hook = Path("hooks/channel-message/keyword-router")
    for name in ("talkbridge.yaml", hook / "hook.py", hook / "hook.yaml"):
        assert f"talkbridge init: {name} already exists: kept" in err  # each one, not the first
    (tmp_path / "talkbridge.yaml").unlink()
    (tmp_path / hook / "hook.py").write_text("# mine\n")
    code, out, err = await finish(await talkbridge("init", cwd=tmp_path))
    assert code == 0 and "wrote talkbridge.yaml" in out and "next:" in out  # what was missing
    assert f"{hook / 'hook.py'} already exists: kept" in err and "talkbridge.yaml" not in err
    assert (tmp_path / hook / "hook.py").read_text() == "# mine\n"
    code, out, _ = await finish(await talkbridge("init", "--force", cwd=tmp_path))
    assert code == 0 and f"wrote {hook / 'hook.py'}" in out  # --force overwrites, as before

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
        assert err.splitlines() == [  # one line per problem, under one naming the file
            "talkbridge: invalid config (talkbridge.yaml):",
            "  connections[0].mode: must be 'polling' or 'webhook'",
            "  webchat.port: must be a valid integer, unable to parse string as an integer",
        ]
        assert "s3cr3t" not in err + out and "AAAAAAAA" not in err + out


async def test_connections_that_are_no_list_are_named_with_the_file_and_the_rest(
    tmp_path: Path,
) -> None:
    (tmp_path / "talkbridge.yaml").write_text("connections: {id: bot}\nwebchat: {port: x}\n")
    code, _, err = await finish(await talkbridge("check", cwd=tmp_path))
    assert code == 2
    assert err.splitlines() == [
        "talkbridge: invalid config (talkbridge.yaml):",
        "  connections: must be a list of connections",
        "  webchat.port: must be a valid integer, unable to parse string as an integer",
    ]


async def test_missing_config_file_and_unknown_command(tmp_path: Path) -> None:
    code, _, err = await finish(await talkbridge("run", "--config", "nope.yaml", cwd=tmp_path))
    assert code == 2 and "nope.yaml" in err
    code, _, err = await finish(await talkbridge("fly", cwd=tmp_path))
    assert code == 2 and "invalid choice" in err


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        ([], "{run,check,init,pair,hooks}"),
        (["pair"], "{list,approve,revoke}"),
        (["hooks"], "{dead-letters}"),
        (["hooks", "dead-letters"], "{list,replay}"),
    ],
)
def test_a_command_given_without_its_subcommand_names_the_ones_to_choose_from(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """It said `required: pair_command`, a name of the code's that no user can type."""
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(argv)
    err = capsys.readouterr().err
    assert exited.value.code == 2 and f"the following arguments are required: {named}" in err
    assert "_command" not in err


def test_every_argument_says_what_it_is_in_help() -> None:
    """`talkbridge init --help` listed `directory` with nothing beside it."""
    parsers = [build_parser()]
    for parser in parsers:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                parsers.extend(action.choices.values())
            elif action.dest != "help":
                assert action.help, f"{parser.prog}: {action.dest} has no help text"


async def test_pair_list_is_a_table_where_a_senders_own_name_cannot_forge_a_row(
    tmp_path: Path,
) -> None:
    store = SqliteStore(tmp_path / "talkbridge.db")
    await store.open()
    forged = "Eve\nWXYZ-2345  approved  support  1  Admin\x1b[2K"
    await store.create_pairing(Pairing("ABCD-EFGH", "support", "4242", forged, utcnow(), False))
    await store.create_pairing(Pairing("JKLM-NPQR", "tg", "77", "Grace", utcnow(), False))
    await store.close()
    code, out, _ = await finish(await talkbridge("pair", "list", cwd=tmp_path))
    lines = out.splitlines()
    assert code == 0 and len(lines) == 3, out  # the header and one line per pairing
    assert lines[0].split() == ["CODE", "STATE", "CONNECTION", "SENDER", "NAME", "SINCE", "(UTC)"]
    assert "\x1b" not in out and lines[1].startswith("ABCD-EFGH  pending ")
    assert "Eve?WXYZ-2345" in lines[1]
    assert lines[2].index("77") == lines[1].index("4242")  # columns line up


async def test_pair_approve_of_something_that_is_no_code_says_what_a_code_looks_like(
    tmp_path: Path,
) -> None:
    code, out, err = await finish(await talkbridge("pair", "approve", "A" * 300, cwd=tmp_path))
    assert code == 2 and "is not a pairing code" in err and "ABCD-EFGH" in err
    assert "A" * 30 not in err + out


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
    code, out, _ = await finish(await talkbridge("pair", "approve", "abcd efgh", cwd=tmp_path))
    assert code == 0 and "now trusted" in out
    store = SqliteStore(tmp_path / "talkbridge.db")
    await store.open()
    assert await store.is_trusted("support", "4242")
    await store.close()
    code, out, _ = await finish(await talkbridge("pair", "list", cwd=tmp_path))
    assert "no pending pairings" in out


async def test_pair_approve_of_an_expired_code_says_so_and_trusts_nobody(tmp_path: Path) -> None:
    """A code asked for months ago could still be approved, by an operator who no longer knew
    who had asked for it; now it lasts an hour (`pairing.code_ttl`)."""
    store = SqliteStore(tmp_path / "talkbridge.db")
    await store.open()
    asked = utcnow() - timedelta(hours=2)
    given = (asked, False, asked + timedelta(hours=1))
    await store.create_pairing(Pairing("ABCD-EFGH", "support", "4242", "Grace", *given))
    await store.create_pairing(
        Pairing("JKLM-NPQR", "support", "77", "Ada", utcnow(), False, utcnow() + timedelta(hours=1))
    )
    await store.close()
    code, out, _ = await finish(await talkbridge("pair", "list", cwd=tmp_path))
    assert code == 0 and "JKLM-NPQR" in out and "ABCD-EFGH" not in out, out
    code, out, _ = await finish(await talkbridge("pair", "list", "--all", cwd=tmp_path))
    assert code == 0 and "ABCD-EFGH  expired " in out and "JKLM-NPQR  pending " in out, out
    code, out, err = await finish(await talkbridge("pair", "approve", "abcd-efgh", cwd=tmp_path))
    assert code == 1 and out == "", out
    assert err == (
        f"not approved: the code ABCD-EFGH of Grace (4242) on support expired at "
        f"{asked + timedelta(hours=1):%Y-%m-%d %H:%M} UTC (codes last `pairing.code_ttl`, an "
        "hour by default); they get a new code by writing again\n"
    )
    store = SqliteStore(tmp_path / "talkbridge.db")
    await store.open()
    try:
        assert not await store.is_trusted("support", "4242")
    finally:
        await store.close()


async def test_check_with_only_the_webchat(tmp_path: Path) -> None:
    code, out, _ = await finish(await talkbridge("check", cwd=tmp_path))
    assert code == 0 and "config: ok" in out and "no connections to check" in out


async def test_check_warns_of_an_agent_or_connection_a_hook_names_that_the_config_lacks(
    tmp_path: Path,
) -> None:
    """`RouteToAgent("billng")` in a hook folder was found only when a message took that path
    (its sender got an apology): `check` said "config: ok". It warns now, naming the file and
    line; targets the config has (and names computed at run time) say nothing."""
    folder = tmp_path / "hooks" / "channel-message" / "desks"
    folder.mkdir(parents=True)
    (folder / "hook.py").write_text(
        "from talkbridge import hooks\n"
        "from .desks import route\n"
        "def create_hook(deps):\n"
        "    async def on_message(msg):\n"
        "        if msg.text == 'x':\n"
        "            return hooks.Forward('webchat', thread_id='t')\n"
        "        return route(msg) or hooks.RouteToAgent(agent='echo')\n"
        "    return on_message\n"
    )
    (folder / "desks.py").write_text(  # a module beside hook.py is read too
        "from talkbridge.hooks import Forward, RouteToAgent\n"
        "DESK = 'sentinel'\n"
        "def route(msg):\n"
        "    if msg.text == 'a':\n"
        "        return RouteToAgent(DESK)\n"
        "    if msg.text == 'b':\n"
        "        return Forward('tg')\n"
        "    return RouteToAgent('billng') if msg.text == 'c' else Forward('slack-desk')\n"
    )
    (tmp_path / "talkbridge.yaml").write_text(
        "hooks: [hooks/channel-message/desks]\n"
        "connections: [{id: tg, channel: telegram, token: '1:x', enabled: false}]\n"
    )
    code, out, err = await finish(await talkbridge("check", cwd=tmp_path))
    assert code == 0, err
    where = f"hook folder {folder}: hooks/channel-message/desks/desks.py"
    apology = "a message routed there is answered with an apology"
    assert [line for line in out.splitlines() if line.startswith("warn")] == [
        f"warn  {where} line 7: Forward('tg'): connection 'tg' is disabled (enabled: false); "
        + apology,
        f"warn  {where} line 8: RouteToAgent('billng'): no agent is named 'billng' (agents: "
        f"echo, sentinel); {apology}",
        f"warn  {where} line 8: Forward('slack-desk'): no connection is named 'slack-desk' "
        f"(connections: webchat); {apology}",
    ]


async def test_check_prints_the_warnings_loading_the_hooks_and_agents_logs(tmp_path: Path) -> None:
    """`check` logs errors only, so the warnings the load logs about the user's code were never
    seen: a hook's method of another kind that is never called, what a hook's `create_hook` or
    a python agent's module logs as a warning. Each is a `warn` line now, the exit code stays 0,
    and a library's warning (imported by the hook) is not shown, nor anything logged twice."""
    folder = tmp_path / "hooks" / "channel-message" / "moderator"
    folder.mkdir(parents=True)
    (folder / "hook.py").write_text(
        "import noisylib\n"
        "class Moderator:\n"
        "    async def on_message(self, msg):\n"
        "        return None\n"
        "    async def on_turn_finished(self, event):\n"
        "        pass\n"
        "def create_hook(deps):\n"
        "    deps.logger.warning('no MODERATION_KEY: moderation is off')\n"
        "    deps.logger.info('loaded')\n"
        "    return Moderator()\n"
    )
    library = tmp_path / "site"
    library.mkdir()
    (library / "noisylib.py").write_text(
        "import logging\nlogging.getLogger('noisylib').warning('library noise')\n"
    )
    (tmp_path / "desk.py").write_text(
        "import logging\n"
        "from talkbridge.agents import Result\n"
        "logging.getLogger(__name__).warning('DESK_MODEL unset: the small model answers')\n"
        "class Desk:\n"
        "    name = 'desk'\n"
        "    async def stream(self, ctx):\n"
        "        yield Result(text='hi')\n"
    )
    (tmp_path / "talkbridge.yaml").write_text(
        "hooks: [hooks/channel-message/moderator]\n"
        "agents: {definitions: {desk: {kind: python, target: 'desk:Desk'}}}\n"
    )
    process = await talkbridge("check", cwd=tmp_path, env={"PYTHONPATH": str(library)})
    code, out, err = await finish(process)
    assert code == 0, err
    assert [line for line in out.splitlines() if line.startswith("warn")] == [
        "warn  desk: DESK_MODEL unset: the small model answers",
        "warn  talkbridge.hooks.moderator: no MODERATION_KEY: moderation is off",
        "warn  channel-message hook 'moderator': its on_turn_finished() (hooks/channel-message/"
        "moderator/hook.py line 5) is never called: the hook is registered as channel-message, "
        "and on_turn_finished() is what agent-turn-started or agent-turn-finished hooks call; "
        "to have it called, register it as that kind too (a hook folder of its own)",
    ]
    assert "noise" not in out + err and "loaded" not in out + err
    assert err == ""


async def test_a_login_in_a_url_whose_requests_carry_a_token_header_is_a_config_error(
    tmp_path: Path,
) -> None:
    """Slack's, Discord's and an openai agent's requests carry their token in the Authorization
    header, so a proxy login in the URL could never work: aiohttp refuses each request."""
    login = "http://proxyuser:proxy-pw-77@127.0.0.1:1"
    (tmp_path / "talkbridge.yaml").write_text(
        "agents:\n  definitions:\n"
        f"    ai: {{kind: openai, base_url: '{login}/v1', model: m, api_key: sk-abcd}}\n"
        "connections:\n"
        f"  - {{id: sl, channel: slack, bot_token: xoxb-1-2, app_token: xapp-1-2, "
        f"api_base: '{login}/api/'}}\n"
        f"  - {{id: dc, channel: discord, token: abc.def.ghi, api_base: '{login}/api/v10'}}\n"
    )
    code, out, err = await finish(await talkbridge("check", cwd=tmp_path))
    assert code == 2, out + err
    assert "connections[0].api_base: cannot hold a user:password@: requests to Slack's" in err
    assert "connections[1].api_base: cannot hold a user:password@: requests to Discord's" in err
    assert "agents.definitions.ai.api_key: cannot be used with a base_url holding a" in err
    assert "proxy-pw-77" not in out + err

    (tmp_path / "talkbridge.yaml").write_text(  # the login alone, or in a Bot API's path: fine
        f"agents: {{definitions: {{ai: {{kind: openai, base_url: '{login}/v1', model: m}}}}}}\n"
        f"connections: [{{id: tg, channel: telegram, token: '1:x', api_base: '{login}'}}]\n"
    )
    code, out, err = await finish(await talkbridge("check", "--timeout", "5", cwd=tmp_path))
    assert "config: ok (1 connection(s))" in out, err
    assert "proxy-pw-77" not in out + err


async def test_a_section_whose_lines_are_all_commented_out_keeps_its_defaults(
    tmp_path: Path,
) -> None:
    """Every key is optional, and `connections:` left empty was fine: so is any other section."""
    (tmp_path / "talkbridge.yaml").write_text(
        "store:\nwebchat:\n  # port: 8765\nagents:\n  # default: echo\nhooks:\n"
        "  # - hooks/channel-message/keyword-router\nrouter:\nconnections:\n"
    )
    code, out, err = await finish(await talkbridge("check", cwd=tmp_path))
    assert code == 0 and "config: ok (0 connection(s))" in out, err
    assert f"sqlite:///{tmp_path}/talkbridge.db" in out


async def test_check_tries_every_connection_at_once(tmp_path: Path) -> None:
    """Several unreachable connections cost one `--timeout` in all, not one each: this Bot API
    answers no bot until all three ask at once, so checks made one by one each time out."""
    asked: set[str] = set()
    all_asked = asyncio.Event()

    async def get_me(request: web.Request) -> web.Response:
        asked.add(request.match_info["token"])
        if len(asked) == 3:
            all_asked.set()
        await all_asked.wait()
        bot = {"id": len(request.match_info["token"]), "is_bot": True, "first_name": "b"}
        return web.json_response({"ok": True, "result": {**bot, "username": "bot"}})

    app = web.Application()
    app.router.add_post("/bot{token}/getMe", get_me)
    runner, port = await serve(app)
    try:
        (tmp_path / "talkbridge.yaml").write_text(
            "connections:\n"
            + "".join(
                f"  - {{id: b{n}, channel: telegram, token: '{n}:x', "
                f"api_base: 'http://127.0.0.1:{port}'}}\n"
                for n in (1, 2, 3)
            )
        )
        code, out, err = await finish(await talkbridge("check", "--timeout", "15", cwd=tmp_path))
    finally:
        await runner.cleanup()
    assert code == 0, out + err
    assert [line.split()[:2] for line in out.splitlines()[2:]] == [
        ["ok", "b1"],
        ["ok", "b2"],
        ["ok", "b3"],
    ]


async def test_a_reference_with_a_shell_default_is_an_error_not_a_literal_token(
    tmp_path: Path,
) -> None:
    """`${WEBCHAT_TOKEN:-x}` names no variable: taken as is, that text was the token, and the
    bridge ran with a password anyone reading the file knew."""
    (tmp_path / "talkbridge.yaml").write_text(
        'webchat: {tokens: ["${WEBCHAT_TOKEN:-changeme-pw}"]}\n'
        'agents: {definitions: {a: {kind: openai, base_url: "http://127.0.0.1:1/v1", model: m, '
        'system_prompt: "Write $${NAME:-x} as is"}}}\n'
    )
    for command in (("check",), ("run", "--port", "0")):
        code, out, err = await finish(await talkbridge(*command, cwd=tmp_path))
        assert code == 2 and "http://" not in out, err
        assert err.splitlines()[1:] == [
            "  webchat.tokens[0]: a ${...} that is no environment variable name (letters, "
            "digits and _; there are no defaults such as ${NAME:-x}); $${...} is the text itself"
        ]


async def test_a_reader_that_closed_the_output_early_gets_no_traceback(tmp_path: Path) -> None:
    """`talkbridge check | head -1`: the lines nobody reads are no internal error."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first line
    try:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "talkbridge",
            "check",
            cwd=tmp_path,
            stdout=write_end,
            stderr=asyncio.subprocess.PIPE,
        )
    finally:
        os.close(write_end)
    assert process.stderr is not None
    err = (await asyncio.wait_for(process.stderr.read(), 60)).decode()
    assert await process.wait() == 1 and err == "", err


async def test_check_names_an_empty_answer_from_a_wrong_api_base(tmp_path: Path) -> None:
    """A proxy's bare 404 (no body) was "not JSON (a proxy's error page?): " and then nothing."""

    async def bare_404(_: web.Request) -> web.Response:
        return web.Response(status=404)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", bare_404)
    runner, port = await serve(app)
    try:
        (tmp_path / "talkbridge.yaml").write_text(
            f"connections: [{{id: b, channel: telegram, token: '1:x', "
            f"api_base: 'http://127.0.0.1:{port}'}}]\n"
        )
        code, out, err = await finish(await talkbridge("check", cwd=tmp_path))
    finally:
        await runner.cleanup()
    assert code == 1, err
    assert out.splitlines()[-1] == (
        "FAIL  b  telegram  the Bot API answered with an empty body, not JSON (a proxy's error "
        "page, a wrong api_base?)"
    )


async def test_check_fails_a_sqlite_store_that_the_first_run_could_not_create(
    tmp_path: Path,
) -> None:
    """`check` creates no store, but it must not call one `ok` that `run` then cannot open."""
    (tmp_path / "talkbridge.yaml").write_text("store: sqlite:///talkbridge.yaml/bridge.db\n")
    code, out, err = await finish(await talkbridge("check", cwd=tmp_path))
    assert code == 1, err
    assert (
        f"FAIL  store  sqlite:///{tmp_path}/talkbridge.yaml/bridge.db  cannot be created: "
        f"{tmp_path}/talkbridge.yaml is a file, not a folder"
    ) in out
    code, _, err = await finish(await talkbridge("run", "--port", "0", cwd=tmp_path))
    assert code == 1 and "cannot open the sqlite store" in err, err

    (tmp_path / "talkbridge.yaml").write_text("store: sqlite:///new/folder/bridge.db\n")
    code, out, err = await finish(await talkbridge("check", cwd=tmp_path))
    assert code == 0 and "not created yet: the first run creates it" in out, err
    assert not (tmp_path / "new").exists()


# -- the review's findings: each test failed on the code before its fix ----------------------------


async def _url_of(process: asyncio.subprocess.Process) -> str:
    """The webchat link `talkbridge run` prints once it listens."""
    assert process.stdout is not None
    while True:
        line = (await asyncio.wait_for(process.stdout.readline(), 60)).decode()
        assert line, "talkbridge run exited before printing the URL"
        if line.startswith("http://"):
            return line.strip()


def test_store_urls_are_shown_without_credentials() -> None:
    assert public_url("redis://:pw@127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
    assert public_url("rediss://user:p#?w@cache.example:6380") == "rediss://cache.example:6380"
    assert public_url("sqlite:////data/talkbridge.db") == "sqlite:////data/talkbridge.db"
    assert (
        public_url("redis://127.0.0.1:6379/0?password=pw&socket_timeout=5&ssl_password=pw2")
        == "redis://127.0.0.1:6379/0?password=***&socket_timeout=5&ssl_password=***"
    )
    assert public_url("redis://cache?Token=t#x") == "redis://cache?Token=***#x"
    assert public_url("sqlite:///x.db?key=k") == "sqlite:///x.db?key=***"


async def test_check_tries_the_store_and_never_shows_its_password(tmp_path: Path) -> None:
    require(importlib.util.find_spec("redis") is not None, "redis-py is not installed")
    closed = free_port()
    config = tmp_path / "talkbridge.yaml"
    config.write_text(f'store: "redis://:${{REDIS_PW}}@127.0.0.1:{closed}/0"\n')
    env = {"REDIS_PW": "s3cr3t-redis-pw"}
    code, out, err = await finish(
        await talkbridge("check", "--timeout", "5", cwd=tmp_path, env=env)
    )
    assert code == 1, err
    assert f"FAIL  store  redis://127.0.0.1:{closed}/0  cannot open the redis store" in out
    assert "s3cr3t" not in out + err

    live = redis_url()
    require(live is not None, "no redis-server")
    assert live is not None
    port = live.rsplit(":", 1)[1].split("/")[0]
    config.write_text(f'store: "redis://:${{REDIS_PW}}@127.0.0.1:{port}/0"\n')
    code, out, err = await finish(await talkbridge("check", cwd=tmp_path, env=env))
    assert code == 0, err
    assert f"ok    store  redis://127.0.0.1:{port}/0  opened and read" in out
    assert "s3cr3t" not in out + err


async def test_check_tries_each_model_agent_and_never_shows_its_key(tmp_path: Path) -> None:
    """Per agent that calls a model: its server, its key and its model, as `GET /models`
    answers; agents that answer in process (echo, sentinel) have nothing to try."""
    key = "sk-check-0123456789abcdef"
    async with ChatCompletionsPeer(key) as peer:
        agents = {
            "good": {"model": "tiny-1", "api_key": "${KEY}"},
            "wrong-key": {"model": "tiny-1", "api_key": "sk-wrong-0123456789abcdef"},
            "no-such-model": {"model": "tiny-9", "api_key": "${KEY}"},
        }
        definitions = {
            name: {"kind": "openai", "base_url": peer.base_url, **spec}
            for name, spec in agents.items()
        }
        definitions["unreachable"] = {
            "kind": "openai",
            "base_url": f"http://127.0.0.1:{free_port()}/v1",
            "model": "tiny-1",
        }
        (tmp_path / "talkbridge.yaml").write_text(
            json.dumps({"agents": {"default": "good", "definitions": definitions}})
        )
        code, out, err = await finish(
            await talkbridge("check", "--timeout", "10", cwd=tmp_path, env={"KEY": key})
        )
        assert code == 1, err
        lines = {line.split()[2]: line for line in out.splitlines() if " agent " in line}
        assert sorted(lines) == ["good", "no-such-model", "unreachable", "wrong-key"]
        assert lines["good"] == f"ok    agent good  model 'tiny-1' is offered at {peer.base_url}"
        assert lines["wrong-key"].startswith("FAIL  agent wrong-key  the key was refused: ")
        assert "HTTP 401" in lines["wrong-key"]
        assert lines["no-such-model"] == (
            f"FAIL  agent no-such-model  {peer.base_url} does not offer model 'tiny-9' "
            "(it offers: tiny-1)"
        )
        assert lines["unreachable"].startswith("FAIL  agent unreachable  the model server at ")
        assert "could not be read" in lines["unreachable"]
        assert "0123456789abcdef" not in out + err

        peer.models = None  # a server without the endpoint: reachable, the model unverified
        definitions = {"good": definitions["good"]}
        (tmp_path / "talkbridge.yaml").write_text(
            json.dumps({"agents": {"default": "good", "definitions": definitions}})
        )
        code, out, err = await finish(await talkbridge("check", cwd=tmp_path, env={"KEY": key}))
        assert code == 0, err
        assert f"ok    agent good  {peer.base_url} answers, but lists no models" in out


async def test_a_secret_in_a_hook_error_or_a_start_failure_is_not_printed(tmp_path: Path) -> None:
    hook = tmp_path / "hooks" / "channel-message"
    hook.mkdir(parents=True)
    (hook / "hook.py").write_text('import os\nraise RuntimeError("no " + os.environ["TG"])\n')
    (tmp_path / "talkbridge.yaml").write_text(
        "hooks: [hooks/channel-message]\n"
        "connections:\n  - id: bot\n    channel: telegram\n    token: ${TG}\n"
    )
    env = {"TG": "12345:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"}
    for command in ("check", "run"):
        code, out, err = await finish(
            await talkbridge(command, "-c", "talkbridge.yaml", cwd=tmp_path, env=env)
        )
        assert code == 2, err  # a hook folder that does not load is a config error
        assert "importing hook.py failed" in err and "RuntimeError: no ***" in err
        assert "AAAAAAAA" not in out + err

    # A start failure names what failed: a host from the environment is not a secret (which
    # address could not be bound is the point), while a secret in the same run stays out.
    (tmp_path / "bind.yaml").write_text(
        'webchat: {host: "${BIND_HOST}", tokens: ["${CHAT_TOKEN}"]}\n'
    )
    env = {"BIND_HOST": "192.0.2.1", "CHAT_TOKEN": "chat-token-SEKRIT"}  # TEST-NET-1 address
    code, out, err = await finish(
        await talkbridge("run", "-c", "bind.yaml", "--port", "0", cwd=tmp_path, env=env)
    )
    assert code == 1 and "talkbridge: cannot start: webchat cannot listen on 192.0.2.1:0" in err
    assert "SEKRIT" not in out + err


async def test_a_log_level_that_does_not_exist_is_a_usage_error(tmp_path: Path) -> None:
    for args, env in ((("--log-level", "bogus"), {}), ((), {"TALKBRIDGE_LOG": "bogus"})):
        code, out, err = await finish(await talkbridge("run", *args, cwd=tmp_path, env=env))
        assert code == 2 and "http://" not in out and "Traceback" not in err
        assert "'bogus' is not a log level" in err
        assert "debug, info, warning, error, critical" in err
    assert build_parser().parse_args(["run", "--log-level", "WARNING"]).log_level == "warning"


async def test_a_dead_letter_limit_or_id_out_of_range_is_a_usage_error(tmp_path: Path) -> None:
    for args in (("list", "--limit", "-5"), ("list", "--limit", "x"), ("replay", "9" * 23)):
        code, _, err = await finish(await talkbridge("hooks", "dead-letters", *args, cwd=tmp_path))
        assert code == 2 and "Traceback" not in err, err
        assert f"{args[-1]!r} is not a whole number from 1 to" in err
    parsed = build_parser().parse_args(["hooks", "dead-letters", "replay", "7", "12"])
    assert parsed.ids == [7, 12]


async def test_ctrl_c_during_check_exits_130_saying_so(tmp_path: Path) -> None:
    require(importlib.util.find_spec("redis") is not None, "redis-py is not installed")
    reached = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        reached.set()  # the check is under way: it waits for an answer that never comes
        await reader.read()
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    (tmp_path / "talkbridge.yaml").write_text(f"store: redis://127.0.0.1:{port}/0\n")
    try:
        process = await talkbridge("check", "--timeout", "50", cwd=tmp_path)
        await asyncio.wait_for(reached.wait(), 30)
        process.send_signal(signal.SIGINT)
        code, _, err = await finish(process)
    finally:
        server.close()
    assert code == 130, err
    assert err == "talkbridge check: interrupted\n"


async def test_one_ctrl_c_while_run_waits_for_a_store_that_never_answers_stops_it(
    tmp_path: Path,
) -> None:
    require(importlib.util.find_spec("redis") is not None, "redis-py is not installed")
    reached = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        reached.set()  # `run` is connecting to the store: it waits for an answer never sent
        await reader.read()
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    # The store's timeout is far longer than `finish` waits: a Ctrl-C that only took effect
    # once the store gave up would fail there.
    store = f"redis://127.0.0.1:{port}/0?socket_timeout=600"
    (tmp_path / "talkbridge.yaml").write_text(f"store: {store}\n")
    process = await talkbridge("run", "--port", "0", cwd=tmp_path)
    try:
        await asyncio.wait_for(reached.wait(), 30)
        process.send_signal(signal.SIGINT)  # one, not two
        code, out, err = await finish(process)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        server.close()
    assert code == 130, err
    assert "http://" not in out
    assert err == (
        f"{STARTING}\n"
        f"talkbridge: interrupted while connecting to the store {store}; nothing was started\n"
    )


async def test_check_with_every_connection_disabled(tmp_path: Path) -> None:
    (tmp_path / "talkbridge.yaml").write_text(
        "connections:\n  - id: bot\n    channel: telegram\n    token: '1:x'\n    enabled: false\n"
    )
    code, out, err = await finish(await talkbridge("check", cwd=tmp_path))
    assert code == 0, err
    assert "no enabled connections to check (1 with enabled: false)" in out


async def test_store_commands_need_only_the_store_from_the_environment(tmp_path: Path) -> None:
    (tmp_path / "talkbridge.yaml").write_text(
        "store: sqlite:///${DB_NAME}\n"
        "connections:\n  - id: bot\n    channel: telegram\n    token: ${TELEGRAM_TOKEN}\n"
    )
    store = SqliteStore(tmp_path / "bridge.db")
    await store.open()
    await store.create_pairing(
        Pairing("ABCD-EFGH", "bot", "4242", "Grace", utcnow(), approved=False)
    )
    await store.close()
    env = {"DB_NAME": "bridge.db"}  # TELEGRAM_TOKEN is not set: `pair` does not need it
    code, out, err = await finish(await talkbridge("pair", "list", cwd=tmp_path, env=env))
    assert code == 0 and "ABCD-EFGH" in out, err
    code, out, err = await finish(
        await talkbridge("hooks", "dead-letters", "list", cwd=tmp_path, env=env)
    )
    assert code == 0 and "no dead letters" in out, err
    code, _, err = await finish(await talkbridge("pair", "list", cwd=tmp_path))
    assert code == 2 and "store: environment variable DB_NAME is not set" in err


async def test_configs_that_cannot_be_read_are_one_line_errors(tmp_path: Path) -> None:
    (tmp_path / "latin1.yaml").write_bytes("store: sqlite:///caf\xe9.db\n".encode("latin-1"))
    (tmp_path / "loop.yaml").write_text("webchat: &a [*a]\n")
    for name, why in (
        ("latin1.yaml", "not UTF-8 text (byte 0xe9 at offset 20)"),
        ("loop.yaml", "webchat[0]: an alias of a value that contains it"),
    ):
        code, _, err = await finish(await talkbridge("check", "-c", name, cwd=tmp_path))
        assert code == 2 and len(err.splitlines()) == 1, err
        assert name in err and why in err


async def test_init_into_a_file_or_where_nothing_can_be_written(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("")
    code, _, err = await finish(await talkbridge("init", "afile", cwd=tmp_path))
    assert code == 2 and err == "talkbridge init: afile is a file, not a folder\n"
    code, _, err = await finish(await talkbridge("init", "afile/sub", cwd=tmp_path))
    assert code == 1 and len(err.splitlines()) == 1 and "cannot write afile/sub" in err, err


_BROKEN = {
    "a missing hook folder": (
        "hooks: [nothere]\n",
        {},
        "hook folder {dir}/nothere: does not exist",
    ),
    "a hook with a syntax error": (
        "hooks: [h/channel-message]\n",
        {"h/channel-message/hook.py": "def create_hook(:\n"},
        "syntax error in {dir}/h/channel-message/hook.py, line 1",
    ),
    "an unknown key in hook.yaml": (
        "hooks: [h/channel-message]\n",
        {
            "h/channel-message/hook.py": "def create_hook(deps): ...\n",
            "h/channel-message/hook.yaml": "ordr: 1\n",
        },
        "hook.yaml: ordr: unknown key; did you mean order?",
    ),
    "a misspelt channel key": (
        "connections: [{id: bot, chanel: telegram, token: '1:abc'}]\n",
        {},
        "connections[0].chanel: unknown key; did you mean channel?",
    ),
    "a Telegram username in trusted": (
        "connections: [{id: bot, channel: telegram, token: '1:abc', trusted: [bob]}]\n",
        {},
        "connections[0].trusted: 'bob' would never match",
    ),
    "a hook filter naming a channel that does not exist": (
        "hooks: [h]\n",
        {
            "h/channel-message/hook.py": "def create_hook(deps):\n    return lambda m: None\n",
            "h/channel-message/hook.yaml": "filter: {channels: [webchatt]}\n",
        },
        "filter.channels: webchatt matches nothing here",
    ),
    "a hook filter naming a connection that is not configured": (
        "hooks: [h]\n",
        {
            "h/channel-message/hook.py": "def create_hook(deps):\n    return lambda m: None\n",
            "h/channel-message/hook.yaml": "filter: {connection_ids: [support-bot]}\n",
        },
        "filter.connection_ids: support-bot matches nothing here",
    ),
    "a hook filter for outbound messages, which hooks never see": (
        "hooks: [h]\n",
        {
            "h/channel-message/hook.py": "def create_hook(deps):\n    return lambda m: None\n",
            "h/channel-message/hook.yaml": "filter: {direction: outbound}\n",
        },
        "filter.direction: outbound matches nothing: hooks see the messages that come in",
    ),
    "an unknown default agent": (
        "agents: {default: nobody}\n",
        {},
        "agents.default: unknown agent 'nobody'; known agents: echo, sentinel",
    ),
    "an agent class that cannot be imported": (
        'agents: {definitions: {mine: {kind: python, target: "nomod.x:Y"}}}\n',
        {},
        "agents.definitions.mine.target: cannot load nomod.x:Y",
    ),
    "an agent module that raises at import": (
        'agents: {definitions: {a: {kind: python, target: "boom:A"}}}\n',
        {"boom.py": 'raise RuntimeError("x")\n'},
        "agents.definitions.a.target: cannot load boom:A: RuntimeError: x",
    ),
    "an agent module with a syntax error": (
        'agents: {definitions: {a: {kind: python, target: "boom:A"}}}\n',
        {"boom.py": "class A(:\n"},
        "agents.definitions.a.target: cannot load boom:A: SyntaxError: ",
    ),
    "an agent target that is not callable": (
        'agents: {definitions: {a: {kind: python, target: "boom:A"}}}\n',
        {"boom.py": "A = 5\n"},
        "agents.definitions.a.target: boom:A is not a class or a function that makes the agent",
    ),
    "an agent class whose __init__ raises": (
        'agents: {definitions: {a: {kind: python, target: "boom:A"}}}\n',
        {"boom.py": "class A:\n    def __init__(self):\n        raise ValueError('no key')\n"},
        "agents.definitions.a.target: building boom:A failed: ValueError: no key",
    ),
    "an agent key that does not apply to its kind": (
        "agents: {definitions: {helper: {kind: echo, model: gpt-4o}}}\n",
        {},
        "agents.definitions.helper.model: does not apply to kind echo (only to openai)",
    ),
    "an openai agent without its model": (
        "agents: {definitions: {bot: {kind: openai, base_url: 'http://127.0.0.1:1/v1'}}}\n",
        {},
        "agents.definitions.bot.model: required for kind openai",
    ),
    "an agent module that calls sys.exit at import": (
        'agents: {definitions: {a: {kind: python, target: "boom:A"}}}\n',
        {"boom.py": "import sys\nsys.exit(3)\n"},
        "agents.definitions.a.target: cannot load boom:A: importing it called sys.exit(3)",
    ),
    "an agent whose stream returns instead of yielding": (
        'agents: {definitions: {a: {kind: python, target: "boom:A"}}}\n',
        {
            "boom.py": "class A:\n    name = 'a'\n"
            "    async def stream(self, ctx):\n        return 'hello'\n"
        },
        "agents.definitions.a.target: boom:A.stream must yield its events",
    ),
    "an agent whose stream is a plain generator": (
        'agents: {definitions: {a: {kind: python, target: "boom:A"}}}\n',
        {
            "boom.py": "class A:\n    name = 'a'\n"
            "    def stream(self, ctx):\n        yield 'hello'\n"
        },
        "agents.definitions.a.target: boom:A.stream must be an `async def` that yields its "
        "events (TextDelta…, then a Result): it is a plain `def`",
    ),
    "an openai agent whose base_url is no http URL": (
        "agents: {definitions: {a: {kind: openai, base_url: ftp://models.example, model: m}}}\n",
        {},
        "agents.definitions.a.base_url: must be an http:// or https:// URL",
    ),
    "a store nobody supports": (
        "store: postgres://x\n",
        {},
        "store: unsupported URL scheme 'postgres'",
    ),
    "a redis store URL with a parameter redis-py does not take": (
        'store: "redis://:pw@127.0.0.1:1/0?sockettimeout=5"\n',
        {},
        "store: the redis URL has a parameter 'sockettimeout' the redis client does not take",
    ),
    "a redis store URL with a parameter value redis-py refuses": (
        'store: "redis://:pw@127.0.0.1:1/0?protocol=9"\n',
        {},
        "store: the redis URL is not valid: protocol must be either 2 or 3",
    ),
}


@pytest.mark.parametrize("case", list(_BROKEN))
async def test_check_refuses_what_run_refuses_and_both_exit_2(tmp_path: Path, case: str) -> None:
    config, files, reason = _BROKEN[case]
    (tmp_path / "talkbridge.yaml").write_text(config)
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    for command in ("check", "run"):
        extra = ("--port", "0") if command == "run" else ()
        code, out, err = await finish(await talkbridge(command, *extra, cwd=tmp_path))
        assert code == 2, (command, err)
        assert "config: ok" not in out and "http://" not in out
        assert reason.format(dir=tmp_path) in err


async def test_run_and_check_name_every_missing_module_and_how_to_install_it_here(
    tmp_path: Path,
) -> None:
    """Both said one module each, not the same one (`check` aiosmtplib, `run` aioimaplib), and
    `pip install 'talkbridge[email]'`, which for the README's install from a clone fetches
    whatever PyPI calls talkbridge; `check` even crashed on the email config without the SDK."""
    installed = json.loads(installed_direct_url() or "{}")
    require(
        installed.get("dir_info", {}).get("editable", False),
        "talkbridge is not installed editable (pip install -e '.[dev]')",
    )
    root = url2pathname(urlsplit(installed["url"]).path)
    config = write_config(
        tmp_path,
        "  - id: mail\n    channel: email\n    address: bot@example.com\n"
        "    imap: {host: 127.0.0.1, username: u, password: pw}\n"
        "    smtp: {host: 127.0.0.1, username: u, password: pw}\n",
    )
    without_sdk = (  # as if the email extra were not installed
        "import sys\n"
        "for name in ('aioimaplib', 'aiosmtplib', 'publicsuffixlist'): sys.modules[name] = None\n"
        "from talkbridge.cli import main\n"
        "sys.exit(main())\n"
    )
    command = shlex.join([sys.executable, "-m", "pip", "install", "-e", f"{root}[email]"])
    said = (
        "talkbridge: connections[0] (mail): the email connector cannot be loaded: aioimaplib, "
        f"aiosmtplib and publicsuffixlist are missing (install them with: {command})"
    )
    for args in (("check",), ("run", "--port", "0")):
        process = await asyncio.create_subprocess_exec(  # in the clone: its egg-info is found
            sys.executable, "-c", without_sdk, *args, "--config", str(config), cwd=root,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        code, _, err = await finish(process)
        assert code == 2, err
        assert said in err.splitlines(), err


async def _ask(url: str, text: str) -> str:
    """Send `text` on the webchat `talkbridge run` printed; the reply's text."""
    base, token = url.split("?token=")
    async with websockets.connect(base.replace("http://", "ws://") + "ws") as ws:
        await ws.send(json.dumps({"type": "auth", "token": token}))
        thread = json.loads(await ws.recv())["conversations"][0]["thread_id"]
        await ws.send(
            json.dumps({"type": "send", "thread_id": thread, "client_id": "c", "text": text})
        )
        while True:
            frame = json.loads(await asyncio.wait_for(ws.recv(), 30))
            if frame["type"] == "message" and frame["role"] == "assistant":
                return str(frame["text"])


async def test_a_hook_filtered_on_the_webchat_channel_loads_and_sees_its_messages(
    tmp_path: Path,
) -> None:
    """`filter: {channels: [webchat]}` was refused at start as a channel that does not exist."""
    hook = tmp_path / "hooks/channel-message/web-only"
    hook.mkdir(parents=True)
    (hook / "hook.py").write_text(
        "from talkbridge.hooks import Modify\n\n"
        "def create_hook(deps):\n"
        "    async def on_message(msg):\n"
        "        return Modify(msg.model_copy(update={'text': '[web] ' + msg.text}))\n"
        "    return on_message\n"
    )
    (hook / "hook.yaml").write_text("filter: {channels: [webchat]}\n")
    (tmp_path / "talkbridge.yaml").write_text("hooks: [hooks/channel-message]\n")
    code, out, err = await finish(await talkbridge("check", cwd=tmp_path))
    assert code == 0 and "config: ok" in out, err
    process = await talkbridge("run", "--port", "0", cwd=tmp_path)
    assert await _ask(await _url_of(process), "hi") == "[web] hi"
    process.send_signal(signal.SIGINT)
    assert (await finish(process))[0] == 0


async def test_a_new_token_replaces_the_old_one_only_once_the_bridge_runs(tmp_path: Path) -> None:
    first = await talkbridge("run", "--port", "0", cwd=tmp_path)
    old = (await _url_of(first)).split("?token=")[1]
    first.send_signal(signal.SIGINT)
    assert (await finish(first))[0] == 0

    holder = socket.create_server(("127.0.0.1", 0))
    try:
        busy = str(holder.getsockname()[1])
        code, _, err = await finish(
            await talkbridge("run", "--new-token", "--port", busy, cwd=tmp_path)
        )
    finally:
        holder.close()
    assert code == 1 and "cannot start" in err

    again = await talkbridge("run", "--port", "0", cwd=tmp_path)
    assert (await _url_of(again)).endswith(f"?token={old}")  # the old link still works
    again.send_signal(signal.SIGINT)
    assert (await finish(again))[0] == 0

    renewed = await talkbridge("run", "--new-token", "--port", "0", cwd=tmp_path)
    new = (await _url_of(renewed)).split("?token=")[1]
    renewed.send_signal(signal.SIGINT)
    assert (await finish(renewed))[0] == 0
    last = await talkbridge("run", "--port", "0", cwd=tmp_path)
    assert new != old and (await _url_of(last)).endswith(f"?token={new}")
    last.send_signal(signal.SIGINT)
    assert (await finish(last))[0] == 0


async def test_version_timeout_and_empty_config_path(tmp_path: Path) -> None:
    code, out, _ = await finish(await talkbridge("--version", cwd=tmp_path))
    assert code == 0 and out == f"talkbridge {talkbridge_package.__version__}\n"
    for bad in ("0", "-1", "nan", "inf", "soon"):
        code, _, err = await finish(await talkbridge("check", "--timeout", bad, cwd=tmp_path))
        assert code == 2 and f"{bad!r} is not a positive number of seconds" in err
    code, _, err = await finish(await talkbridge("check", "--config", "", cwd=tmp_path))
    assert code == 2 and "argument --config/-c: the path is empty" in err


_SLOW_AGENT = """
import asyncio
import contextlib

from talkbridge.agents import Result, TextDelta


class Slow:
    name = "slow"

    async def stream(self, ctx):
        yield TextDelta(text="thinking")
        await asyncio.Event().wait()  # never answers: stopping waits for it
        yield Result(text="never")
"""


@contextlib.asynccontextmanager
async def _turn_under_way(
    tmp_path: Path, module: str, source: str, agent_class: str
) -> AsyncIterator[asyncio.subprocess.Process]:
    """`talkbridge run` with the `python` agent `module:agent_class` as the default, a webchat
    message sent, and its turn streaming (the socket stays open inside the block)."""
    (tmp_path / f"{module}.py").write_text(source)
    (tmp_path / "talkbridge.yaml").write_text(
        f"agents: {{default: a, definitions: {{a: {{kind: python, target: "
        f'"{module}:{agent_class}"}}}}}}\n'
    )
    process = await talkbridge("run", "--port", "0", cwd=tmp_path)
    base, token = (await _url_of(process)).split("?token=")
    async with websockets.connect(base.replace("http://", "ws://") + "ws") as ws:
        await ws.send(json.dumps({"type": "auth", "token": token}))
        thread = json.loads(await ws.recv())["conversations"][0]["thread_id"]
        await ws.send(
            json.dumps({"type": "send", "thread_id": thread, "client_id": "c", "text": "hi"})
        )
        while json.loads(await asyncio.wait_for(ws.recv(), 30))["type"] != "delta":
            pass  # the turn is under way
        yield process


async def test_a_second_ctrl_c_stops_without_waiting(tmp_path: Path) -> None:
    async with _turn_under_way(tmp_path, "slowagent", _SLOW_AGENT, "Slow") as process:
        process.send_signal(signal.SIGINT)
        assert process.stderr is not None
        while b"stopping" not in await asyncio.wait_for(process.stderr.readline(), 30):
            pass
        process.send_signal(signal.SIGINT)
        code, _, err = await asyncio.wait_for(finish(process), 5)  # not the 10 s drain
    assert code == 130
    assert "stopped at once, without waiting for the replies under way" in err


_STUBBORN_AGENT = """
import asyncio
import contextlib

from talkbridge.agents import Result, TextDelta


class Stubborn:
    name = "stubborn"

    async def stream(self, ctx):
        yield TextDelta(text="thinking")
        while True:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                pass  # swallows every cancel: stopping must not wait for it for ever
        yield Result(text="never")
"""


async def test_ctrl_c_stops_even_when_a_hook_observer_or_turn_watcher_hangs(
    tmp_path: Path,
) -> None:
    """A channel-message observer (timeout 600 s in its hook.yaml) or a turn watcher that never
    returns held the stop for its whole timeout, after the replies were out: the bridge cuts
    them off after a grace and says so."""
    for kind, spec in (
        ("channel-message", "observer: true\ntimeout: 600\n"),
        ("agent-turn-finished", ""),
    ):
        hook = tmp_path / "hooks" / kind / "stuck"
        hook.mkdir(parents=True)
        (hook / "hook.py").write_text(
            "import asyncio\n\n"
            "def create_hook(deps):\n"
            "    async def stuck(event):\n"
            "        await asyncio.Event().wait()\n"
            "    return stuck\n"
        )
        (hook / "hook.yaml").write_text(f"name: stuck-{kind}\n{spec}")
    (tmp_path / "talkbridge.yaml").write_text(
        "hooks: [hooks/channel-message/stuck, hooks/agent-turn-finished/stuck]\n"
    )
    process = await talkbridge("run", "--port", "0", cwd=tmp_path)
    assert await _ask(await _url_of(process), "hi") == "hi"
    process.send_signal(signal.SIGINT)
    code, _, err = await finish(process)
    assert code == 0, err
    assert "2 hook observers or turn watchers did not finish within 5 s; cancelled" in err


async def test_ctrl_c_stops_even_when_an_agent_ignores_being_cancelled(tmp_path: Path) -> None:
    async with _turn_under_way(tmp_path, "stubborn", _STUBBORN_AGENT, "Stubborn") as process:
        process.send_signal(signal.SIGINT)  # once: the operator waits for the stop
        try:  # the 10 s drain, then 5 s for the cancel to take: never for ever
            code, _, err = await asyncio.wait_for(finish(process), 40)
        finally:
            if process.returncode is None:
                process.kill()
    assert code == 0, err
    assert "1 turn did not stop within 5 s of being cancelled; left behind" in err


async def test_ctrl_c_while_starting_stops_and_a_second_one_stops_at_once(
    tmp_path: Path,
) -> None:
    # A start that holds the loop (a slow import: aiogram's takes seconds on a small VM): the
    # hook's import blocks on a socket this test holds, and says when it has read each byte.
    connected: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = asyncio.Queue()

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await connected.put((reader, writer))

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    hook = tmp_path / "hooks" / "slow"
    hook.mkdir(parents=True)
    (hook / "hook.yaml").write_text("kind: channel-message\nname: slow\n")
    (hook / "hook.py").write_text(
        "import socket\n"
        f"held = socket.create_connection(('127.0.0.1', {port}))\n"
        "while held.recv(1):  # until the test lets go; each byte is acknowledged\n"
        "    held.sendall(b'k')\n"
        "class Hook:\n    async def on_message(self, msg):\n        return None\n"
        "def create_hook(deps):\n    return Hook()\n"
    )
    (tmp_path / "talkbridge.yaml").write_text("hooks: [hooks/slow]\n")
    try:
        process = await talkbridge("run", "--port", "0", cwd=tmp_path)
        reader, writer = await asyncio.wait_for(connected.get(), 30)
        process.send_signal(signal.SIGINT)  # taken: the start is not cut at an odd place...
        # Two signals sent back to back may reach the process as one (the kernel keeps one
        # pending SIGINT). A signal is delivered at the latest when the blocked read returns,
        # so once the hook has read a byte sent after the first, the second is a signal of
        # its own.
        writer.write(b"x")
        await writer.drain()
        assert await asyncio.wait_for(reader.readexactly(1), 30) == b"k"
        process.send_signal(signal.SIGINT)  # ...unless the operator insists
        writer.close()  # the start goes on, and meets both
        code, out, err = await finish(process)
    finally:
        server.close()
    assert code == 130, err
    assert "stopped at once" in err and "Open the webchat" not in out


async def test_pair_revoke_undoes_an_approval_and_drops_a_pending_code(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "talkbridge.db")
    await store.open()
    for code, user in (("ABCD-EFGH", "4242"), ("WXYZ-2345", "777")):
        await store.create_pairing(Pairing(code, "support", user, "Grace", utcnow(), False))
    await store.approve_pairing("ABCD-EFGH")
    await store.close()
    code, _, err = await finish(await talkbridge("pair", "revoke", "ZZZZ-ZZZZ", cwd=tmp_path))
    assert code == 1 and err == (
        "no pairing has the code ZZZZ-ZZZZ; `talkbridge pair list --all` shows the codes\n"
    )
    (tmp_path / "talkbridge.yaml").write_text("store: sqlite:///talkbridge.db\n")
    args = ("pair", "approve", "zzzz-zzzz", "--config", "talkbridge.yaml")
    code, out, err = await finish(await talkbridge(*args, cwd=tmp_path))
    assert (code, out) == (1, "")
    assert err == (
        "no pending pairing has the code zzzz-zzzz; `talkbridge pair list --config "
        "talkbridge.yaml` shows the codes\n"
    )
    code, out, err = await finish(await talkbridge("pair", "revoke", "abcd-efgh", cwd=tmp_path))
    assert code == 0, err
    assert out.startswith("revoked: Grace (4242) on support is no longer trusted by pairing")
    code, out, err = await finish(await talkbridge("pair", "revoke", "WXYZ-2345", cwd=tmp_path))
    assert code == 0 and out.startswith("dropped the pending pairing of Grace (777)"), err
    store = SqliteStore(tmp_path / "talkbridge.db")
    await store.open()
    try:
        assert not await store.is_trusted("support", "4242")
        assert list(await store.pairings(include_approved=True)) == []
    finally:
        await store.close()


async def test_pair_approve_twice_and_pair_list_without_a_store(tmp_path: Path) -> None:
    code, out, err = await finish(await talkbridge("pair", "list", cwd=tmp_path))
    assert code == 0 and "no pending pairings" in out and "does not exist yet" in err
    assert not (tmp_path / "talkbridge.db").exists()  # looking creates nothing

    store = SqliteStore(tmp_path / "talkbridge.db")
    await store.open()
    await store.create_pairing(
        Pairing("ABCD-EFGH", "support", "4242", "Grace", utcnow(), approved=False)
    )
    await store.close()
    code, out, _ = await finish(await talkbridge("pair", "approve", "ABCD-EFGH", cwd=tmp_path))
    assert code == 0 and "approved: Grace (4242) on support is now trusted" in out
    code, out, _ = await finish(await talkbridge("pair", "approve", "abcd-efgh", cwd=tmp_path))
    assert code == 0 and out == "already approved: Grace (4242) on support is trusted\n"


def test_tokens_a_client_presents_never_reach_the_log() -> None:
    from talkbridge.cli import _RedactingFilter
    from talkbridge.config import Secrets

    record = logging.LogRecord(
        "websockets.server",
        logging.DEBUG,
        __file__,
        1,
        "< TEXT %r [%d bytes]",
        ('{"type":"auth","token":"mistyped-real-token"}', 46),
        None,
    )
    assert _RedactingFilter(Secrets()).filter(record)
    assert "mistyped-real-token" not in record.getMessage()
    assert '"token":"***"' in record.getMessage()
    socket_url = (
        "Received: {'ok': True, 'url': 'wss://wss.slack.com/link/?ticket=8f1c-a2&app_id=A1'}"
    )
    record = logging.LogRecord(
        "talkbridge.slack.web", logging.DEBUG, __file__, 1, socket_url, (), None
    )
    assert _RedactingFilter(Secrets()).filter(record)
    assert "8f1c-a2" not in record.getMessage() and "ticket=***&app_id=A1" in record.getMessage()
    cookie = "talkbridge_token_18937=SEKRIT-wrong-one; theme=dark"
    record = logging.LogRecord(
        "websockets.server", logging.DEBUG, __file__, 1, "< %s: %s", ("Cookie", cookie), None
    )
    assert _RedactingFilter(Secrets()).filter(record)
    assert record.getMessage() == "< Cookie: talkbridge_token_18937=***; theme=dark"


def test_a_senders_terminal_escapes_reach_the_log_as_visible_text() -> None:
    from talkbridge.cli import _RedactingFilter
    from talkbridge.config import Secrets

    subject = "refund\x1b[2K\rINFO all good\x9b"  # erase the line, overwrite it
    try:
        raise ValueError(subject)
    except ValueError:
        exc_info = sys.exc_info()
    record = logging.LogRecord(
        "talkbridge.email",
        logging.WARNING,
        __file__,
        1,
        "not answering %r:\n%s",
        (1, subject),
        exc_info,
    )
    assert _RedactingFilter(Secrets()).filter(record)
    line = logging.Formatter().format(record)
    assert "\x1b" not in line and "\r" not in line and "\x9b" not in line
    assert "not answering 1:\nrefund\\x1b[2K\\rINFO all good\\x9b" in line
    assert "ValueError: refund\\x1b[2K" in line  # the traceback's text too


async def test_an_agent_module_next_to_the_config_is_found_from_anywhere(tmp_path: Path) -> None:
    folder = tmp_path / "mybridge"
    folder.mkdir()
    (folder / "myagent.py").write_text(_SLOW_AGENT)
    (folder / "talkbridge.yaml").write_text(
        'agents: {default: slow, definitions: {slow: {kind: python, target: "myagent:Slow"}}}\n'
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    code, out, err = await finish(
        await talkbridge("check", "--config", str(folder / "talkbridge.yaml"), cwd=elsewhere)
    )
    assert code == 0 and "config: ok" in out, err


async def test_init_says_how_to_run_talkbridge_as_it_was_run(tmp_path: Path) -> None:
    script = Path(sys.executable).parent / "talkbridge"  # the venv's console script
    require(script.exists(), "no talkbridge console script next to this python")
    path = os.pathsep.join(
        p for p in os.environ["PATH"].split(os.pathsep) if p != str(script.parent)
    )
    process = await asyncio.create_subprocess_exec(
        str(script),
        "init",
        "bot",
        cwd=tmp_path,
        env={**os.environ, "PATH": path},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    code, out, _ = await finish(process)
    # Not on PATH (a venv not activated): the next step names the script itself.
    assert code == 0 and f"next: cd bot && {script.resolve()} run --config talkbridge.yaml" in out


async def test_every_relative_path_in_the_config_is_found_from_any_working_directory(
    tmp_path: Path,
) -> None:
    """A `{file: x}` secret was read from the working directory, though hook folders and the
    SQLite file are found beside the config: `check -c tb/talkbridge.yaml` failed from above."""
    folder = tmp_path / "tb"
    (folder / "secrets").mkdir(parents=True)
    (folder / "secrets/webchat").write_text("a-token-from-a-secret-file\n")
    (folder / "ca.pem").write_text("")  # no certificate in it: the client says so
    (folder / "talkbridge.yaml").write_text(
        "webchat: {tokens: [{file: secrets/webchat}]}\nhooks: [hooks/channel-message]\n"
    )
    hook = folder / "hooks/channel-message/mark"
    hook.mkdir(parents=True)
    (hook / "hook.py").write_text("def create_hook(deps):\n    return lambda msg: None\n")
    code, out, err = await finish(
        await talkbridge("check", "-c", "tb/talkbridge.yaml", cwd=tmp_path)
    )
    assert code == 0 and "config: ok" in out, err

    port = free_port()
    (folder / "redis.yaml").write_text(
        f'store: "rediss://127.0.0.1:{port}/0?ssl_ca_certs=ca.pem"\n'
    )
    code, out, err = await finish(
        await talkbridge("check", "-c", "tb/redis.yaml", "--timeout", "5", cwd=tmp_path)
    )
    assert code == 1 and "FAIL  store" in out, err
    assert "No such file" not in out and "certificate" in out  # ca.pem was found, and read


async def test_check_warns_when_redis_keeps_nothing_on_disk(tmp_path: Path) -> None:
    # Distributed mode keeps its bus, its records of replies sent and its dedupe keys in Redis:
    # a restart of a Redis without persistence loses them, silently.
    require(importlib.util.find_spec("redis") is not None, "redis-py is not installed")
    import redis.asyncio as aioredis

    with private_redis() as url:  # started with `--save "" --appendonly no`
        require(url is not None, "redis-server is not installed")
        assert url is not None
        (tmp_path / "talkbridge.yaml").write_text(f"store: {url}\n")
        code, out, err = await finish(await talkbridge("check", cwd=tmp_path))
        assert code == 0, err
        assert f"warn  store  {url}  redis keeps nothing on disk (appendonly no)" in out
        assert "set appendonly yes" in out
        client = aioredis.Redis.from_url(url)
        await client.config_set("save", "3600 1")  # (no AOF here: it would write one)
        try:
            code, out, err = await finish(await talkbridge("check", cwd=tmp_path))
        finally:  # else it writes a snapshot into the working directory as it stops
            await client.config_set("save", "")
            await client.aclose()
        assert code == 0, err
        assert "redis keeps only snapshots (save '3600 1') (appendonly no)" in out
        assert "loses what came since the last snapshot" in out


async def test_run_serves_the_webchat_while_a_connection_is_still_starting(
    tmp_path: Path,
) -> None:
    """The connections' SDKs were imported before the webchat started (aiogram alone takes
    seconds): with a few connections the URL came 6-11 s after "starting…". The URL comes
    before any SDK is imported now; the Telegram connection, whose getMe is held, shows as
    `starting` meanwhile, the webchat answers, and the connection works once let go."""
    require(importlib.util.find_spec("aiogram") is not None, "aiogram is not installed")
    async with TelegramBotAPIPeer() as peer:
        getme = peer.hold("getMe")
        bot_token = next(iter(peer.bots))
        write_config(tmp_path, _telegram_bot(bot_token, peer))
        process = await talkbridge(
            "run", "--port", "0", cwd=tmp_path, env={"PYTHONPROFILEIMPORTTIME": "1"}, merged=True
        )
        assert process.stdout is not None
        before_url: set[str] = set()  # the SDKs imported before the URL (stderr and stdout
        while True:  # share the pipe: what was written first is read first)
            line = (await asyncio.wait_for(process.stdout.readline(), 60)).decode()
            assert line, "talkbridge run exited before printing the URL"
            module = _imported(line)
            if module and module.split(".")[0] in SDKS:
                before_url.add(module.split(".")[0])
            if line.startswith("http://"):
                url = line.strip()
                break
        assert not before_url, f"imported before the URL was printed: {sorted(before_url)}"
        rest = asyncio.ensure_future(process.stdout.read())  # a full pipe would block it
        await peer.wait_for(lambda: bool(peer.calls_of("getme", answered=None)), timeout=60)

        http = url.split("?token=")[0]
        assert await _connection_state(http, "bot") == "starting"  # getMe is held
        assert await _ask(url, "hi while the bot starts") == "hi while the bot starts"
        assert await _connection_state(http, "bot") == "starting"

        getme.set()
        peer.push_update(private_text(42, "hello bot"))
        await peer.wait_for(lambda: bool(peer.sent_messages), timeout=30)
        assert peer.sent_messages[0]["text"] == "hello bot"
        assert await _connection_state(http, "bot") == "up"
        process.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(process.wait(), 60) == 0, (await rest).decode()[-3000:]
        await rest


def _plugin_channel(folder: Path, channel: str, transport: str) -> Path:
    """A third-party package adding `channel` (the `talkbridge.connectors` entry point), as
    pip would install it, in `folder` (to put on PYTHONPATH): its config model imports at
    once, its transport module is `transport` (the SDK's import)."""
    info = folder / f"{channel}_plugin-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {channel}-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        f"[talkbridge.connectors]\n{channel} = {channel}_config:Config|{channel}_transport:create\n"
    )
    (folder / f"{channel}_config.py").write_text(
        "from typing import Literal\n"
        "from talkbridge.config import ConnectionConfig\n"
        f"class Config(ConnectionConfig):\n    channel: Literal['{channel}'] = '{channel}'\n"
    )
    (folder / f"{channel}_transport.py").write_text(transport)
    return folder


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
async def test_a_stop_while_a_connections_sdk_imports_does_not_wait_for_the_import(
    tmp_path: Path, sig: signal.Signals
) -> None:
    """The SDKs are imported once the URL is out, while the operator may already stop the
    bridge: a Ctrl-C (or SIGTERM) during the import waited for it to end (aiogram: seconds on
    a small VM) before the process exited. Here the import never ends by itself."""
    connected: asyncio.Queue[asyncio.StreamWriter] = asyncio.Queue()

    async def accept(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await connected.put(writer)

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    plugin = _plugin_channel(
        tmp_path / "site",
        "slowchat",
        "import socket\n"
        f"held = socket.create_connection(('127.0.0.1', {port}))\n"
        "held.recv(1)  # an import that takes as long as the test wants\n"
        "def create(config, context):\n    raise RuntimeError('not reached')\n",
    )
    (tmp_path / "talkbridge.yaml").write_text("connections: [{id: slow, channel: slowchat}]\n")
    try:
        process = await talkbridge(
            "run", "--port", "0", cwd=tmp_path, env={"PYTHONPATH": str(plugin)}
        )
        await _url_of(process)
        writer = await asyncio.wait_for(connected.get(), 30)  # the import is under way
        process.send_signal(sig)
        code, out, err = await finish(process)  # the import still holds: it is not waited for
        writer.close()
    finally:
        server.close()
    assert code == 0, err
    assert "talkbridge: stopping" in err
    assert "Traceback" not in err and "Traceback" not in out


_GATED_TRANSPORT = """
import socket

from talkbridge.message import SendResult
from talkbridge.talk import Subscription

held = socket.create_connection(("127.0.0.1", {port}))
held.recv(1)  # the SDK's import: as long as the test wants


class Gated:
    channel = "gatedchat"

    def __init__(self, connection_id):
        self.connection_id = connection_id

    def subscribe(self, handler):
        return Subscription(lambda: None)

    def feature(self, name):
        return None

    async def send(self, message):  # what the platform gets, the test reads
        held.sendall(message.text.encode() + b"\\n")
        return SendResult(message_ids=("1",))


def create(config, context):
    return Gated(config.id)
"""


async def test_a_hooks_send_to_a_connection_still_starting_waits_for_it(tmp_path: Path) -> None:
    """`router.talk(id).send(...)`, as docs/hooks.md shows it, to a connection whose SDK is
    still being imported: it raised `ConnectionNotStartedError` ("not started yet: the bridge
    builds its connections in `await bridge.start()`"), so a relay hook lost its message for
    the seconds after every start. It waits for the connection now, as `router.send` does."""
    connected: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = asyncio.Queue()

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await connected.put((reader, writer))

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    plugin = _plugin_channel(tmp_path / "site", "gatedchat", _GATED_TRANSPORT.format(port=port))
    hook = tmp_path / "hooks" / "relay"
    hook.mkdir(parents=True)
    (hook / "hook.yaml").write_text("kind: channel-message\nname: relay\n")
    (hook / "hook.py").write_text(
        "from talkbridge.message import OutboundMessage\n\n"
        "def create_hook(deps):\n"
        "    async def on_message(msg):\n"
        "        deps.logger.info('relaying %s', msg.text)  # no await from here to the talk()\n"
        "        ops = deps.router.talk('ops')\n"
        "        await ops.send(OutboundMessage(thread_id='room', text=msg.text))\n"
        "    return on_message\n"
    )
    (tmp_path / "talkbridge.yaml").write_text(
        "connections: [{id: ops, channel: gatedchat}]\nhooks: [hooks/relay]\n"
    )
    try:
        process = await talkbridge(
            "run", "--port", "0", cwd=tmp_path, env={"PYTHONPATH": str(plugin)}
        )
        url = await _url_of(process)
        reader, writer = await asyncio.wait_for(connected.get(), 30)  # the import is under way
        asked = asyncio.ensure_future(_ask(url, "deploy done"))
        assert process.stderr is not None
        while b"relaying deploy done" not in await asyncio.wait_for(process.stderr.readline(), 30):
            pass  # the hook has asked for the connection, still importing
        writer.write(b"x")  # the import ends
        assert await asyncio.wait_for(reader.readline(), 30) == b"deploy done\n"
        assert await asyncio.wait_for(asked, 30) == "deploy done"  # the echo agent's answer
        process.send_signal(signal.SIGINT)
        code, _, err = await finish(process)
        writer.close()
    finally:
        server.close()
    assert code == 0, err
    assert "Traceback" not in err


def _telegram_bot(bot_token: str, peer: TelegramBotAPIPeer) -> str:
    """The `connections:` entry of a Telegram bot on `peer` that trusts user 42."""
    return (
        f"  - {{id: bot, channel: telegram, token: '{bot_token}', "
        f"api_base: '{peer.base_url}', trusted: ['42']}}\n"
    )


async def _replying_on_held_telegram(
    tmp_path: Path, peer: TelegramBotAPIPeer
) -> tuple[asyncio.subprocess.Process, asyncio.Event]:
    """`talkbridge run` with a Telegram connection whose peer holds every sendMessage: a
    trusted user's message is answered, its reply in flight once this returns."""
    gate = peer.hold("sendMessage")
    bot_token = next(iter(peer.bots))
    write_config(tmp_path, _telegram_bot(bot_token, peer))
    process = await talkbridge("run", "--port", "0", cwd=tmp_path)
    peer.push_update(private_text(42, "are you there?"))
    await peer.wait_for(lambda: bool(peer.calls_of("sendmessage", answered=None)), timeout=60)
    return process, gate


async def test_ctrl_c_waits_for_a_reply_in_flight_and_it_goes_out_once(tmp_path: Path) -> None:
    """The promise of the README: Ctrl-C stops the bridge once the replies under way are sent
    (up to 10 s). Telegram answers the reply's sendMessage only after the Ctrl-C."""
    require(importlib.util.find_spec("aiogram") is not None, "aiogram is not installed")
    async with TelegramBotAPIPeer() as peer:
        process, gate = await _replying_on_held_telegram(tmp_path, peer)
        process.send_signal(signal.SIGINT)
        assert process.stderr is not None
        while b"talkbridge: stopping" not in await asyncio.wait_for(process.stderr.readline(), 30):
            pass
        gate.set()
        code, _, err = await finish(process)
        assert code == 0, err
        assert [c.status for c in peer.calls_of("sendmessage", answered=None)] == [200]
        assert "did not finish" not in err and "cut off" not in err


async def test_a_reply_still_in_flight_when_the_stop_gives_up_is_kept_and_counted(
    tmp_path: Path,
) -> None:
    """Telegram does not answer the reply within the stop's 10 s. The connection was closed
    under the send first, which logged it as failing and being retried ("send failed (cannot
    reach the Telegram Bot API …), retrying") as the bridge stopped; no line said which sends
    were cut off. Now one line counts them by connection, and the message is answered at the
    next start."""
    require(importlib.util.find_spec("aiogram") is not None, "aiogram is not installed")
    async with TelegramBotAPIPeer() as peer:
        process, gate = await _replying_on_held_telegram(tmp_path, peer)
        process.send_signal(signal.SIGINT)
        code, _, err = await finish(process)
        assert code == 0, err
        assert "1 turn did not finish within 10 s; it runs again on the next start" in err
        assert "stopping: 1 send to bot cut off" in err
        assert "retrying" not in err and "giving up" not in err and "Traceback" not in err

        gate.set()  # Telegram answers again: the next start sends the reply
        calls = len(peer.calls_of("sendmessage", answered=None))
        again = await talkbridge("run", "--port", "0", cwd=tmp_path)
        await peer.wait_for(
            lambda: len(peer.calls_of("sendmessage", answered=None)) > calls, timeout=60
        )
        again.send_signal(signal.SIGINT)
        code, _, err = await finish(again)
        assert code == 0, err
        assert peer.sent_messages[-1]["text"] == "are you there?"


async def _connection_state(http: str, connection_id: str) -> str:
    """The connection's state as the webchat's /healthz shows it."""
    async with aiohttp.ClientSession() as session, session.get(f"{http}healthz") as resp:
        body = await resp.json()
    return str(body["connections"][connection_id]["state"])
