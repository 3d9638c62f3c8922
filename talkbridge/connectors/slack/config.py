"""Keys of a Slack connection; validated without importing slack-sdk."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from talkbridge.config import (
    ConnectionConfig,
    ListenHost,
    ListenPort,
    http_base_url,
    without_login,
)

DEFAULT_API_BASE = "https://slack.com/api/"


class SlackConfig(ConnectionConfig):
    trusted_ids = ("Slack user ids (U012ABCDEF: a profile's 'Copy member ID')", "A-Z0-9")
    channel: Literal["slack"] = "slack"
    bot_token: SecretStr
    """The app's bot token (`xoxb-…`): every Web API call is made with it."""
    app_token: SecretStr | None = None
    """App-level token (`xapp-…`, scope `connections:write`): Socket Mode, no public URL needed."""
    signing_secret: SecretStr | None = None
    """The app's signing secret: the Events API over HTTP (Slack posts to a public URL)."""
    mode: Literal["socket", "events"] | None = None
    """Default: `socket` when `app_token` is given, else `events`."""
    events_host: ListenHost = "127.0.0.1"
    """Events API: where the local HTTP server listens (a reverse proxy forwards to it)."""
    events_port: ListenPort = 3000
    events_path: str = Field(default="/slack/events", pattern=r"^/")
    api_base: str = DEFAULT_API_BASE
    """Web API base URL (enterprise gateways, tests). Always ends with `/`: slack-sdk joins
    method names onto it with urljoin, which would otherwise drop its last path segment."""
    reply_in_thread: bool = False
    """Answer a top-level channel message in a new thread under it (DMs are never threaded)."""
    require_mention: bool = True
    """In channels and group DMs (`mpim`: several people), take only messages that mention the
    bot, or reply in a thread it is in (one it started, or one where it was mentioned).
    One-to-one direct messages always."""
    ping_interval: float = Field(default=10.0, gt=0)
    """Socket Mode: seconds between pings; a dead socket is noticed within about this long."""
    request_timeout: int = Field(default=30, ge=1)
    user_cache_seconds: float = Field(default=3600.0, ge=0)
    """How long a users.info answer is reused for display names."""
    channel_cache_seconds: float = Field(default=3600.0, ge=0)
    """How long a conversations.info answer (a conversation's name) is reused; a rename Slack
    reports ends it sooner."""
    max_download_bytes: int = Field(default=50 * 1024 * 1024, ge=1)

    @field_validator("bot_token")
    @classmethod
    def _bot_token_shape(cls, value: SecretStr) -> SecretStr:
        # Never quote the value: a half-right token is still a secret.
        if not value.get_secret_value().startswith("xoxb-"):
            raise ValueError("must be a bot token starting with 'xoxb-' (OAuth & Permissions page)")
        return value

    @field_validator("app_token")
    @classmethod
    def _app_token_shape(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not value.get_secret_value().startswith("xapp-"):
            raise ValueError(
                "must be an app-level token starting with 'xapp-' (Basic Information page, "
                "scope connections:write)"
            )
        return value

    @field_validator("api_base")
    @classmethod
    def _trailing_slash(cls, value: str) -> str:
        value = without_login(http_base_url(value, "https://slack.com/api/"), "Slack's Web API")
        return value if value.endswith("/") else value + "/"

    @model_validator(mode="after")
    def _one_inbound_route(self) -> SlackConfig:
        if self.mode is None:
            if self.app_token is None and self.signing_secret is None:
                raise ValueError(
                    "needs app_token (Socket Mode, no public URL) or signing_secret "
                    "(Events API over HTTP)"
                )
        elif self.mode == "socket" and self.app_token is None:
            raise ValueError("mode 'socket' needs app_token (an xapp- app-level token)")
        elif self.mode == "events" and self.signing_secret is None:
            raise ValueError("mode 'events' needs signing_secret (the app's signing secret)")
        return self

    @property
    def inbound(self) -> Literal["socket", "events"]:
        """The mode in effect: `mode`, else Socket Mode whenever an app token is given."""
        if self.mode is not None:
            return self.mode
        return "socket" if self.app_token is not None else "events"
