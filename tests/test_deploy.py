"""What deploy/ ships must stay valid as the config grows."""

from __future__ import annotations

from pathlib import Path

import pytest

from talkbridge.config import load_config

ROOT = Path(__file__).resolve().parent.parent


def test_the_example_production_config_is_valid(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "WEBCHAT_TOKEN",
        "OPENAI_API_KEY",
        "SLACK_BOT_TOKEN",
        "SLACK_APP_TOKEN",
        "IMAP_PASSWORD",
        "SMTP_PASSWORD",
    ):
        monkeypatch.setenv(name, f"secret-{name.lower()}")
    monkeypatch.setenv("TELEGRAM_TOKEN", "123456:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA")
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-1-2-abc")
    monkeypatch.setenv("SLACK_APP_TOKEN", "xapp-1-2-abc")
    config, secrets = load_config(ROOT / "deploy" / "talkbridge.example.yaml")
    assert [c.id for c in config.connections] == ["support-bot", "team", "helpdesk"]
    assert "secret-imap_password" not in repr(config)
    assert secrets.redact("x secret-openai_api_key y") == "x *** y"
