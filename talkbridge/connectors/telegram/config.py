"""Keys of a Telegram connection; validated without importing aiogram."""

from __future__ import annotations

import re
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator

from talkbridge.config import ConnectionConfig, ListenHost, ListenPort, http_base_url

_TOKEN = re.compile(r"[0-9]+:[A-Za-z0-9_-]+")


class TelegramConfig(ConnectionConfig):
    trusted_ids = ("numeric Telegram user ids (a username can change hands)", "0-9-")
    channel: Literal["telegram"] = "telegram"
    token: SecretStr
    mode: Literal["polling", "webhook"] = "polling"
    delete_webhook: bool = False
    """Polling: delete a webhook set for the bot by something else (its updates then come here).
    Unset, polling refuses to start while one is set, saying so; a webhook this connection set
    in webhook mode is deleted either way."""
    webhook_url: str | None = None
    """Public HTTPS URL Telegram posts updates to (webhook mode)."""
    webhook_secret: SecretStr | None = None
    """Sent back by Telegram in `X-Telegram-Bot-Api-Secret-Token`; anything else is rejected."""
    webhook_host: ListenHost = "127.0.0.1"
    """Where the local HTTP server listens; a reverse proxy forwards `webhook_url` to it."""
    webhook_port: ListenPort = 8443
    webhook_path: str = Field(default="/telegram/webhook", pattern=r"^/")
    """The path the local server answers; unset, the path of `webhook_url` (a proxy that keeps
    the path then needs nothing more), or `/telegram/webhook` when that URL has none."""
    api_base: str | None = None
    """Base URL of a self-hosted Bot API server, e.g. `http://127.0.0.1:8081`."""
    poll_timeout: int = Field(default=30, ge=0, le=50)
    """Seconds one `getUpdates` long poll waits for updates."""
    request_timeout: float = Field(default=60.0, gt=0)
    """Seconds any other Bot API call may take."""
    album_wait: float = Field(default=1.0, gt=0, le=60)
    """Seconds an album (photos sent together) waits for its next item before it goes on as
    one message; an update after it in the same chat (polling: any update) ends the wait."""
    max_download_bytes: int = Field(default=20 * 1024 * 1024, ge=1)
    """`inbound_media` refuses larger files (the public Bot API serves at most 20 MB)."""
    global_rate: float = Field(default=30.0, gt=0)
    """Messages per second for the whole bot (Telegram's broadcast limit)."""
    group_rate_per_minute: float = Field(default=20.0, gt=0)
    """Messages per minute into one group chat."""

    @field_validator("token")
    @classmethod
    def _token_shape(cls, value: SecretStr) -> SecretStr:
        # The value is never quoted: a half-right token is still a secret.
        if not _TOKEN.fullmatch(value.get_secret_value()):
            raise ValueError(
                "does not look like a bot token from @BotFather (digits, a colon, then letters, "
                "digits, _ or -)"
            )
        return value

    @field_validator("webhook_secret")
    @classmethod
    def _secret_shape(cls, value: SecretStr | None) -> SecretStr | None:
        allowed = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
        secret = "" if value is None else value.get_secret_value()
        if value is not None and (not 1 <= len(secret) <= 256 or not set(secret) <= allowed):
            raise ValueError(
                "must be 1-256 characters of A-Z, a-z, 0-9, _ and - (Telegram's rule for "
                "secret_token)"
            )
        return value

    @field_validator("api_base")
    @classmethod
    def _api_base_url(cls, value: str | None) -> str | None:
        return None if value is None else http_base_url(value, "http://127.0.0.1:8081")

    @model_validator(mode="before")
    @classmethod
    def _path_from_url(cls, data: Any) -> Any:
        if isinstance(data, dict) and "webhook_path" not in data:
            url = data.get("webhook_url")
            path = urlsplit(url).path if isinstance(url, str) else ""
            if path not in ("", "/"):
                return {**data, "webhook_path": path}
        return data

    @model_validator(mode="after")
    def _webhook_needs_url_and_secret(self) -> TelegramConfig:
        if self.mode == "webhook":
            missing = [
                name
                for name, value in (
                    ("webhook_url", self.webhook_url),
                    ("webhook_secret", self.webhook_secret),
                )
                if not value
            ]
            if missing:
                raise ValueError(
                    "mode 'webhook' needs "
                    + " and ".join(missing)
                    + " (the public HTTPS URL Telegram posts to, and a secret token it echoes)"
                )
            assert self.webhook_url is not None
            url = urlsplit(self.webhook_url)
            if url.scheme != "https" and not (self.api_base and url.scheme == "http"):
                raise ValueError(
                    "webhook_url must be an https:// URL: Telegram posts updates only over "
                    "HTTPS (a self-hosted Bot API server, set in api_base, also takes http://)"
                )
        return self
