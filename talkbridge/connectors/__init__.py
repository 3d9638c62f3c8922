"""Connectors by channel name, imported only when a connection of that channel exists.

Each channel names two import paths: its config model (no SDK import, so any config can be
validated without the SDK installed) and a factory `create(config, context) -> connector`.
Third-party packages add channels with `register_channel` or the `talkbridge.connectors`
entry-point group (value: `config_path|factory_path`).
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from talkbridge.config import ConnectionConfig
    from talkbridge.connectors.base import ConnectorContext


class ConnectorFactory(Protocol):
    def __call__(self, config: ConnectionConfig, context: ConnectorContext) -> Any: ...


@dataclass(frozen=True, slots=True)
class ChannelSpec:
    channel: str
    config: str
    factory: str
    extra: str | None = None
    """The pip extra that brings the SDK, named in the error when it is missing."""
    sdk: tuple[str, ...] = ()
    """The SDK's top-level modules: `require_sdk` finds them without importing them."""


_CHANNELS: dict[str, ChannelSpec] = {}
_entry_points_loaded = False


def register_channel(spec: ChannelSpec) -> None:
    _CHANNELS[spec.channel] = spec


register_channel(
    ChannelSpec(
        "telegram",
        "talkbridge.connectors.telegram.config:TelegramConfig",
        "talkbridge.connectors.telegram.transport:create",
        extra="telegram",
        sdk=("aiogram", "aiohttp", "markdown_it"),
    )
)


register_channel(
    ChannelSpec(
        "slack",
        "talkbridge.connectors.slack.config:SlackConfig",
        "talkbridge.connectors.slack.transport:create",
        extra="slack",
        sdk=("slack_sdk", "aiohttp", "markdown_it"),
    )
)
register_channel(
    ChannelSpec(
        "discord",
        "talkbridge.connectors.discord.config:DiscordConfig",
        "talkbridge.connectors.discord.transport:create",
        extra="discord",
        sdk=("discord", "aiohttp", "markdown_it"),
    )
)
register_channel(
    ChannelSpec(
        "email",
        "talkbridge.connectors.email.config:EmailConfig",
        "talkbridge.connectors.email.transport:create",
        extra="email",
        sdk=("aioimaplib", "aiosmtplib", "publicsuffixlist", "markdown_it"),
    )
)


def _load_entry_points() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for ep in entry_points(group="talkbridge.connectors"):
        config, _, factory = ep.value.partition("|")
        _CHANNELS.setdefault(ep.name, ChannelSpec(ep.name, config, factory))


def known_channels() -> set[str]:
    _load_entry_points()
    return set(_CHANNELS)


def channel_spec(channel: str) -> ChannelSpec:
    _load_entry_points()
    try:
        return _CHANNELS[channel]
    except KeyError:
        known = ", ".join(sorted(_CHANNELS))
        raise LookupError(f"unknown channel {channel!r}; known channels: {known}") from None


def load_factory(channel: str) -> ConnectorFactory:
    """Import the connector (and so its SDK) for `channel`."""
    spec = channel_spec(channel)
    module_name, _, attr = spec.factory.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:  # the SDK's modules missing, else what the import says
        raise _missing(spec, _absent(spec) or [exc.name or str(exc)]) from exc
    factory: ConnectorFactory = getattr(module, attr)
    return factory


def require_sdk(channel: str) -> None:
    """The `ConfigError` `load_factory` would raise for an SDK that is not installed, found in
    milliseconds without importing it (`talkbridge run` imports the SDKs after the webchat
    starts). A channel that names no `sdk` (a plug-in's) is only found out by the import."""
    spec = channel_spec(channel)
    absent = _absent(spec)
    if absent:
        raise _missing(spec, absent)


def _absent(spec: ChannelSpec) -> list[str]:
    """Each of the SDK's modules that is not installed: all named at once, whichever way they
    are found out (`run` and `check` say the same), so one install fixes them all."""
    absent = []
    for name in spec.sdk:
        try:
            found = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            found = None
        if found is None:
            absent.append(name)
    return absent


def _missing(spec: ChannelSpec, names: list[str]) -> Exception:
    from talkbridge.connectors.extras import install_command, installed_direct_url
    from talkbridge.errors import ConfigError

    what = f"{', '.join(names[:-1])} and {names[-1]} are" if len(names) > 1 else f"{names[0]} is"
    hint = ""
    if spec.extra:
        command = install_command(spec.extra, installed_direct_url())
        hint = f" (install {'them' if len(names) > 1 else 'it'} with: {command})"
    return ConfigError(f"the {spec.channel} connector cannot be loaded: {what} missing{hint}")
