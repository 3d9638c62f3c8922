"""Keys of a Discord connection; validated without importing discord.py."""

from __future__ import annotations

import fnmatch
import re
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from talkbridge.config import ConnectionConfig, http_base_url, without_login

if TYPE_CHECKING:
    from talkbridge.message import NormalizedMessage

DEFAULT_API_BASE = "https://discord.com/api/v10"
DEFAULT_GATEWAY = "wss://gateway.discord.gg/"
_USER_ENTRY = re.compile(r"[0-9*?\[\]!]+")
"""A user id, or a pattern of them (`*`): every other `trusted` entry names a role."""
_ROLE_ENTRY = re.compile(r"([0-9]+)/(.+)")
"""`<server id>/<role name>`: a role name alone is anyone's to make, in a server of their own."""


class DiscordIntents(BaseModel):
    """Gateway intents beyond discord.py's defaults; the privileged ones are opt-in."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    message_content: bool = True
    """Privileged: without it guild messages arrive with empty text (enable it in the portal)."""
    members: bool = False
    """Privileged: only needed for member lists; trust by role works without it."""
    presences: bool = False


class DiscordConfig(ConnectionConfig):
    channel: Literal["discord"] = "discord"
    token: SecretStr
    intents: DiscordIntents = DiscordIntents()
    api_base: str | None = None
    """REST base, e.g. `https://discord.com/api/v10` or a REST proxy. Process-wide in discord.py:
    every Discord connection of one process must use the same value."""
    gateway_url: str | None = None
    """Gateway websocket URL, e.g. `wss://gateway.discord.gg`. Process-wide like `api_base`."""
    require_mention: bool = True
    """In guild channels, answer only messages that mention the bot or reply to it. DMs always."""
    guild_ready_timeout: float = Field(default=2.0, ge=0)
    """Seconds discord.py waits for GUILD_CREATEs after READY before it reports ready."""
    max_ratelimit_wait: float = Field(default=30.0, ge=30.0)
    """A route's 429 up to this many seconds is waited out in that route's bucket only;
    longer ones are handed to the router as a rate limit (discord.py's minimum is 30)."""

    @field_validator("token")
    @classmethod
    def _token_shape(cls, value: SecretStr) -> SecretStr:
        token = value.get_secret_value()
        if not token:
            raise ValueError("is empty (an environment variable set to nothing?)")
        if any(ch.isspace() for ch in token) or token.lower().startswith("bot "):
            raise ValueError(
                "must be the bare bot token from the Developer Portal (no 'Bot ' prefix, no spaces)"
            )
        return value

    @field_validator("api_base", "gateway_url")
    @classmethod
    def _url(cls, value: str | None, info: Any) -> str | None:
        if value is None:
            return None
        if info.field_name == "api_base":
            url = http_base_url(value, "https://discord.com/api/v10").rstrip("/")
            return without_login(url, "Discord's REST API")
        if not value.startswith(("ws://", "wss://")):
            raise ValueError("must start with ws:// or wss://")
        return value

    @field_validator("trusted")
    @classmethod
    def _roles_name_their_server(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        """Anyone can add a public bot to a server of their own and give themselves a role of
        any name there: a role trusts only in the server the entry names."""
        bare = [t for t in value if not _USER_ENTRY.fullmatch(t) and not _ROLE_ENTRY.fullmatch(t)]
        if bare:
            shown = ", ".join(repr(t) for t in bare)
            raise ValueError(
                f"a role must name its server as '<server id>/<role name>' ({shown}: anyone "
                "can add the bot to a server of their own and make a role of that name there)"
            )
        return value

    def trusted_roles(self) -> tuple[tuple[str, str], ...]:
        """The `(server id, role name)` of each role entry of `trusted`."""
        found = (_ROLE_ENTRY.fullmatch(t) for t in self.trusted if not _USER_ENTRY.fullmatch(t))
        return tuple((m[1], m[2]) for m in found if m is not None)

    def trusts_sender(self, message: NormalizedMessage) -> bool:
        """A sender is trusted by id, or by holding a trusted role in the server it names."""
        if self.trusts(message.channel_user_id):
            return True
        # Both `<server id>/<role>`; a server id is digits, so a pattern's `*` stays in the name.
        wanted = [f"{server}/{role}".casefold() for server, role in self.trusted_roles()]
        return any(
            fnmatch.fnmatchcase(held.casefold(), pattern)
            for held in message.sender_roles
            for pattern in wanted
        )
