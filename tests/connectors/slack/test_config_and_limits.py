"""SlackConfig validation (without slack-sdk) and the per-tier rate-limit bookkeeping."""

from __future__ import annotations

from typing import Any

import pytest

from talkbridge.config import parse_config
from talkbridge.connectors.slack.config import SlackConfig
from talkbridge.connectors.slack.ratelimit import TierGate
from talkbridge.errors import ConfigError

BASE = {"id": "team", "channel": "slack", "bot_token": "xoxb-1-secret-bot"}


def make(**extra: Any) -> SlackConfig:
    return SlackConfig.model_validate({**BASE, **extra})


def test_socket_mode_is_the_default_when_an_app_token_is_given() -> None:
    config = make(app_token="xapp-1-secret-app", signing_secret="s3cret")
    assert config.inbound == "socket"
    assert config.api_base == "https://slack.com/api/"
    assert make(signing_secret="s3cret").inbound == "events"
    assert make(app_token="xapp-1-a", signing_secret="s", mode="events").inbound == "events"


def test_api_base_always_ends_with_a_slash() -> None:
    assert make(app_token="xapp-1-a", api_base="http://gw.local/slack/api").api_base == (
        "http://gw.local/slack/api/"
    )
    with pytest.raises(ValueError, match="http"):
        make(app_token="xapp-1-a", api_base="gw.local/api/")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({}, "needs app_token"),
        ({"mode": "socket", "signing_secret": "s"}, "mode 'socket' needs app_token"),
        ({"mode": "events", "app_token": "xapp-1-a"}, "mode 'events' needs signing_secret"),
        ({"app_token": "xoxb-wrong-kind"}, "starting with 'xapp-'"),
    ],
)
def test_incomplete_or_wrong_credentials_are_named(extra: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make(**extra)


def test_config_errors_name_the_key_and_never_the_token() -> None:
    data = {"connections": [{**BASE, "bot_token": "xoxp-user-token-123", "app_token": "xapp-1"}]}
    with pytest.raises(ConfigError) as caught:
        parse_config(data)
    assert "bot_token" in str(caught.value) and "xoxp-user-token-123" not in str(caught.value)


def test_a_429_pauses_only_its_tier_until_retry_after_has_passed() -> None:
    now = [100.0]
    gate = TierGate(clock=lambda: now[0])
    gate.hit("conversations.history", 30)
    assert gate.blocked("conversations.replies") == 30  # same tier (3)
    assert gate.blocked("users.info") == 0  # tier 4 carries on
    assert gate.blocked("chat.postMessage") == 0  # its own special limit
    gate.hit("conversations.history", 5)  # a shorter wait never shortens a longer one
    now[0] += 29
    assert gate.blocked("conversations.info") == pytest.approx(1)
    now[0] += 1
    assert gate.blocked("conversations.history") == 0


def test_posting_is_paused_per_channel_until_a_second_channel_is_limited_meanwhile() -> None:
    now = [100.0]
    gate = TierGate(clock=lambda: now[0])
    assert gate.hit("chat.postMessage", 1, "C1") == "thread"
    assert gate.channel_blocked("chat.postMessage", "C1") == 1
    assert gate.channel_blocked("chat.postMessage", "C2") == 0
    assert gate.blocked("chat.postMessage") == 0  # the workspace goes on posting
    assert gate.channel_blocked("conversations.history", "C1") == 0  # limited per tier only
    assert gate.hit("chat.postMessage", 1, "C1") == "thread"  # the same channel again
    now[0] += 1
    assert gate.hit("chat.postMessage", 2, "C2") == "thread"  # C1's pause was over
    assert gate.hit("chat.postMessage", 3, "C3") == "connection"  # two at once: the workspace
    assert gate.blocked("chat.postMessage") == 3
    assert gate.hit("chat.postMessage", 4) == "connection"  # no channel known: the tier


@pytest.mark.parametrize("entry", ["bob smith", "u0ada0001", "ada"])
def test_a_trusted_entry_no_slack_id_can_match_is_refused(entry: str) -> None:
    data = {"connections": [{**BASE, "id": "s", "trusted": ["U0ADA0001", "W*", entry]}]}
    with pytest.raises(ConfigError, match=rf"\.trusted: {entry!r} would never match"):
        parse_config(data)


def test_a_handle_in_trusted_is_refused_since_it_would_never_match() -> None:
    data = {"connections": [{**BASE, "id": "s", "trusted": ["U0ADA0001", "@ada"]}]}
    with pytest.raises(
        ConfigError, match=r"connections\[0\]\.trusted: @ada would never match: it holds Slack"
    ):
        parse_config(data)
