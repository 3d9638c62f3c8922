"""ConnectionRegistry: supervision, backoff, states in plain words, credential checks."""

from __future__ import annotations

import asyncio
import logging
import socket
import subprocess
import sys

import pytest

from talkbridge.backoff import Backoff
from talkbridge.config import ConnectionConfig, Secrets, WebchatConfig
from talkbridge.connectors.base import ConnectionStatus, ConnectorContext
from talkbridge.errors import TransientError, UnauthorizedError
from talkbridge.registry import ConnectionRegistry, ConnectionState
from talkbridge.store import SqliteStore
from talkbridge.webchat import WebchatConnector
from tests.support.logs import LogWatch
from tests.support.talk_connector import TalkConnector

FAST = lambda: Backoff(base=0.001, cap=0.01)  # noqa: E731


class FlakyTransport(TalkConnector):
    """Fails `failures` times, then stays up until cancelled."""

    def __init__(self, cid: str, failures: list[BaseException]) -> None:
        super().__init__(cid)
        self.failures = failures
        self.runs = 0
        self.closed = False

    async def run(self, status: ConnectionStatus) -> None:
        self.runs += 1
        if self.failures:
            raise self.failures.pop(0)
        status.up()
        await asyncio.Event().wait()

    async def close(self) -> None:
        self.closed = True

    async def check(self) -> str:
        if self.failures:
            raise self.failures[0]
        return "@flaky_bot"


async def test_transient_failures_reconnect_with_backoff(sqlite_store: SqliteStore) -> None:
    registry = ConnectionRegistry(sqlite_store, backoff=FAST)
    transport = FlakyTransport("bot", [TransientError("502 bad gateway"), OSError("reset")])
    registry.add(transport)
    await registry.start()
    health = await registry.wait_for("bot", ConnectionState.UP)
    assert transport.runs == 3 and health.restarts == 2
    assert health.last_error == "OSError: reset"  # the last error stays visible after recovery
    await registry.stop()
    assert registry.health("bot").state is ConnectionState.STOPPED and transport.closed


async def test_rejected_credentials_stop_without_a_retry_storm(sqlite_store: SqliteStore) -> None:
    secrets = Secrets(["123:SECRET"])
    registry = ConnectionRegistry(sqlite_store, secrets, backoff=FAST)
    transport = FlakyTransport("bot", [UnauthorizedError("token 123:SECRET was revoked (401)")])
    registry.add(transport)
    await registry.start()
    health = await registry.wait_for("bot", ConnectionState.DOWN)
    assert transport.runs == 1
    assert health.last_error == "token *** was revoked (401)"
    assert registry.states()["bot"]["state"] == "down"
    await registry.stop()


async def test_pure_talk_connectors_are_up_at_once(sqlite_store: SqliteStore) -> None:
    attached: list[str] = []
    registry = ConnectionRegistry(
        sqlite_store, on_attach=lambda t: attached.append(t.connection_id)
    )
    registry.add(TalkConnector("plain"), ConnectionConfig(id="plain", channel="telegram"))
    await registry.start()
    assert registry.health("plain").state is ConnectionState.UP
    assert attached == ["plain"]
    await registry.stop()


async def test_check_reports_each_connection(sqlite_store: SqliteStore) -> None:
    registry = ConnectionRegistry(sqlite_store, Secrets(["s3cr3t-token"]))
    registry.add(FlakyTransport("good", []))
    registry.add(FlakyTransport("bad", [UnauthorizedError("s3cr3t-token rejected")]))
    registry.add(TalkConnector("plain"))
    reports = {r.connection_id: r for r in await registry.check()}
    assert reports["good"].ok and reports["good"].detail == "@flaky_bot"
    assert not reports["bad"].ok and reports["bad"].detail == "*** rejected"
    assert reports["plain"].ok


def test_backoff_is_capped_exponential_with_jitter() -> None:
    backoff = Backoff(base=1, cap=8)
    ceilings = []
    for _ in range(6):
        ceilings.append(backoff.ceiling())
        delay = backoff.next()
        assert ceilings[-1] / 2 <= delay <= ceilings[-1]
    assert ceilings == [1, 2, 4, 8, 8, 8]
    backoff.reset()
    assert backoff.ceiling() == 1


def test_sdk_is_imported_only_when_its_channel_is_configured() -> None:
    probe = (
        "import sys, asyncio\n"
        "from talkbridge.config import parse_config\n"
        "from talkbridge.bridge import Bridge\n"
        "config, _ = parse_config({'store': 'sqlite:///:memory:'})\n"
        "async def main():\n"
        "    b = Bridge(config, with_webchat=False)\n"
        "    await b.start(); await b.stop()\n"
        "asyncio.run(main())\n"
        "print('aiogram' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize(
    "validate",
    [
        "validate_startup(Bridge(config, with_webchat=False))",  # `check`, and `build`
        # `run`: found before anything starts, without importing the SDKs
        "Bridge(config, with_webchat=False).registry.expect(config)\n"
        "    assert 'discord' not in sys.modules, 'an SDK was imported'",
    ],
    ids=["build", "expect"],
)
def test_every_connection_whose_sdk_is_missing_is_named_not_just_the_first(
    validate: str,
) -> None:
    probe = (
        "import sys\n"
        "sys.modules['aiogram'] = None; sys.modules['slack_sdk'] = None  # as if not installed\n"
        "from talkbridge.config import parse_config\n"
        "from talkbridge.bridge import Bridge\n"
        "from talkbridge.errors import ConfigError\n"
        "from talkbridge.preflight import validate_startup\n"
        "config, _ = parse_config({'store': 'sqlite:///:memory:', 'connections': [\n"
        "    {'id': 'tg', 'channel': 'telegram', 'token': '1:x'},\n"
        "    {'id': 'sl', 'channel': 'slack', 'bot_token': 'xoxb-1', 'app_token': 'xapp-1'},\n"
        "    {'id': 'dc', 'channel': 'discord', 'token': 'x'}]})\n"
        "try:\n"
        f"    {validate}\n"
        "except ConfigError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 2, out.stdout
    assert lines[0].startswith("connections[0] (tg): the telegram connector cannot be loaded")
    assert "aiogram is missing (install it with: " in lines[0]
    assert "-m pip install" in lines[0] and "[telegram]'" in lines[0]
    assert lines[1].startswith("connections[1] (sl): the slack connector cannot be loaded")


class ReportingTransport(TalkConnector):
    """Reports trouble the way a transport retrying inside its `run` does, then recovers."""

    def __init__(self, cid: str, reports: list[str]) -> None:
        super().__init__(cid)
        self.reports = reports

    async def run(self, status: ConnectionStatus) -> None:
        for reason in self.reports:
            status.degraded(reason)
        status.up()
        await asyncio.Event().wait()


async def test_a_degraded_connection_is_logged_once_per_change_and_its_recovery_too(
    sqlite_store: SqliteStore, caplog: pytest.LogCaptureFixture
) -> None:
    reports = ["getUpdates failed: 502", "getUpdates failed: 502", "409 Conflict with s3cr3t"]
    registry = ConnectionRegistry(sqlite_store, Secrets(["s3cr3t"]), backoff=FAST)
    registry.add(ReportingTransport("bot", reports))
    with caplog.at_level(logging.INFO, logger="talkbridge.registry"):
        await registry.start()
        await registry.wait_for("bot", ConnectionState.UP)
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert lines == [
        ("WARNING", "bot: getUpdates failed: 502"),
        ("WARNING", "bot: 409 Conflict with ***"),
        ("INFO", "bot: up again"),
    ]
    await registry.stop()


async def test_send_trouble_neither_hides_nor_clears_the_transports_own(
    sqlite_store: SqliteStore,
) -> None:
    registry = ConnectionRegistry(sqlite_store, backoff=FAST)
    registry.add(ReportingTransport("bot", []))
    await registry.start()
    await registry.wait_for("bot", ConnectionState.UP)
    registry.send_trouble("bot", "sends are failing: 502")
    assert registry.health("bot").last_error == "sends are failing: 502"
    registry.send_trouble("bot", None)
    assert registry.health("bot").state is ConnectionState.UP
    registry._set_state("bot", ConnectionState.DEGRADED, "the socket was lost; reconnecting")
    registry.send_trouble("bot", "sends are failing: 502")
    registry.send_trouble("bot", None)  # a send got through, but the socket is still lost
    health = registry.health("bot")
    assert health.state is ConnectionState.DEGRADED
    assert health.last_error == "the socket was lost; reconnecting"
    await registry.stop()


@pytest.mark.parametrize("reported", [True, False])
async def test_a_webchat_failure_its_caller_reports_is_not_logged_too_but_later_ones_are(
    sqlite_store: SqliteStore, caplog: pytest.LogCaptureFixture, reported: bool
) -> None:
    # `talkbridge run` reports a port in use itself, as its one fatal line; an app that did not
    # say it reports it, and every failure after the first, still get the registry's warning.
    holder = socket.create_server(("127.0.0.1", 0))
    port = holder.getsockname()[1]
    registry = ConnectionRegistry(sqlite_store, backoff=FAST)
    webchat = WebchatConnector(
        WebchatConfig(port=port),
        ConnectorContext(sqlite_store, logging.getLogger("test.webchat")),
        ["a-webchat-token"],
        registry.states,
    )
    registry.add(webchat, caller_reports_first_failure=reported)
    try:
        with (
            caplog.at_level(logging.WARNING, logger="talkbridge.registry"),
            LogWatch("talkbridge.registry", logging.WARNING) as warned,
        ):
            await registry.start()
            with pytest.raises(TransientError, match=f"127.0.0.1:{port}: the port is in use"):
                await asyncio.wait_for(webchat.listening(), 30)
            await warned.wait_for(lambda: bool(warned.messages), 30)  # a failure that is logged
            await registry.stop()
    finally:
        holder.close()
    failures = registry.health("webchat").restarts
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == failures - (1 if reported else 0) >= 1
    assert all("the port is in use" in line for line in warnings)
