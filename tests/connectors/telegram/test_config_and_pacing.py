"""TelegramConfig validation (without aiogram) and the send pacer."""

from __future__ import annotations

import subprocess
import sys

import pytest

from talkbridge.config import parse_config
from talkbridge.connectors.telegram.pacing import Pacer, TokenBucket
from talkbridge.errors import ConfigError


def connection(**values: object) -> dict[str, object]:
    return {"connections": [{"id": "tg", "channel": "telegram", "token": "42:abc-DEF_1", **values}]}


def test_defaults_are_polling() -> None:
    config, secrets = parse_config(connection())
    [tg] = config.connections
    assert tg.mode == "polling"  # type: ignore[attr-defined]
    assert secrets.redact("token 42:abc-DEF_1") == "token ***"


def test_webhook_mode_needs_url_and_secret() -> None:
    with pytest.raises(ConfigError, match="needs webhook_url and webhook_secret"):
        parse_config(connection(mode="webhook"))
    with pytest.raises(ConfigError, match="needs webhook_secret"):
        parse_config(connection(mode="webhook", webhook_url="https://bot.example.com/hook"))


def test_a_webhook_url_must_be_https_unless_a_self_hosted_api_server_is_used() -> None:
    plain = {"mode": "webhook", "webhook_url": "http://bot.example.com/hook", "webhook_secret": "a"}
    with pytest.raises(ConfigError, match="webhook_url must be an https:// URL"):
        parse_config(connection(**plain))
    config, _ = parse_config(connection(**plain, api_base="http://127.0.0.1:8081"))
    assert config.connections[0].webhook_path == "/hook"  # type: ignore[attr-defined]


def test_bad_values_are_named_without_echoing_secrets() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(connection(token="not a token 12345"))
    assert "connections[0].token" in str(caught.value)
    assert "not a token" not in str(caught.value)
    with pytest.raises(ConfigError, match=r"connections\[0\]\.webhook_secret: must be 1-256"):
        parse_config(
            connection(mode="webhook", webhook_url="https://x.example", webhook_secret="no spaces!")
        )
    with pytest.raises(ConfigError, match=r"connections\[0\]\.polling: unknown key"):
        parse_config(connection(polling=True))


@pytest.mark.parametrize(
    ("api_base", "reason"),
    [
        ("ftp://x", "must be an http:// or https:// URL"),
        ("htp://proxyuser:SEKRIT@127.0.0.1:18925", "must be an http:// or https:// URL"),
        ("http://proxyuser:SEKRIT@127.0.0.1:99999", "port is not a port number"),
        ("http://", "must be an http:// or https:// URL"),
    ],
)
def test_a_bad_api_base_is_a_config_error_without_its_credentials(
    api_base: str, reason: str
) -> None:
    # as for Slack and Discord: named at load (exit 2), not a failed request at check or run
    with pytest.raises(ConfigError, match=r"connections\[0\]\.api_base: .*" + reason) as caught:
        parse_config(connection(api_base=api_base))
    assert "SEKRIT" not in str(caught.value)


def test_config_and_codec_import_without_aiogram() -> None:
    code = (
        "import sys, talkbridge.connectors.telegram.config, talkbridge.connectors.telegram.codec;"
        "print('aiogram' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_token_bucket_allows_a_burst_then_paces() -> None:
    clock = Clock()
    bucket = TokenBucket(rate=2.0, capacity=2, clock=clock)
    assert [bucket.reserve(), bucket.reserve()] == [0.0, 0.0]
    assert bucket.reserve() == pytest.approx(0.5)
    assert bucket.reserve() == pytest.approx(1.0)
    clock.now = 10.0  # refilled, but never beyond capacity
    assert [bucket.reserve(), bucket.reserve(), bucket.reserve()] == [0.0, 0.0, 0.5]


def test_pacer_limits_groups_per_minute_but_not_private_chats() -> None:
    clock = Clock()
    pacer = Pacer(per_second=1000, group_per_minute=20, clock=clock)
    assert all(pacer.reserve(-100) == 0.0 for _ in range(20))
    assert pacer.reserve(-100) == pytest.approx(3.0)  # the 21st waits for one refill
    assert pacer.reserve(-200) == 0.0  # another group has its own budget
    assert all(pacer.reserve(5) == 0.0 for _ in range(50))  # private chats: bot-wide only


def test_a_username_in_trusted_is_refused_since_it_would_never_match() -> None:
    with pytest.raises(
        ConfigError,
        match=r"connections\[0\]\.trusted: @bob would never match: it holds numeric Telegram",
    ):
        parse_config(connection(trusted=["42", "@bob"]))


@pytest.mark.parametrize("entry", ["bob_user", "bob", "42 ", ""])
def test_a_trusted_entry_no_numeric_id_can_match_is_refused(entry: str) -> None:
    with pytest.raises(ConfigError, match=r"connections\[0\]\.trusted: .*would never match"):
        parse_config(connection(trusted=["42", entry]))


def test_trusted_ids_and_patterns_of_numbers_are_accepted() -> None:
    config, _ = parse_config(connection(trusted=[42, "-100*", "12?4", "[1-3]*"]))
    [conn] = config.connections
    assert conn.trusts("-1001234") and conn.trusts("1234") and not conn.trusts("5")
