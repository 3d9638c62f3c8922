"""What `Bridge.start` would refuse, found without starting anything.

`talkbridge check` runs it so that "config: ok" means `run` accepts the config too: agents are
built, hook folders imported and their hooks created, connectors constructed — by the same code
`run` uses, on a Bridge that is never started (no store opened, no connection, no listening).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from talkbridge.errors import ConfigError

if TYPE_CHECKING:
    from talkbridge.bridge import Bridge


def check_agent_roles(bridge: Bridge) -> None:
    """`agents.default` and `agents.sentinel` name an agent the bridge has or the config
    defines; a ConfigError (exit 2) before anything starts, not a failure at start."""
    agents = bridge.config.agents
    known = sorted({*bridge.runner.agent_names, *agents.definitions})
    for role, name in (("default", agents.default), ("sentinel", agents.sentinel)):
        if name not in known:
            raise ConfigError(
                f"agents.{role}: unknown agent {name!r}; known agents: {', '.join(known)}"
            )


def validate_startup(bridge: Bridge) -> list[str]:
    """Build what `bridge.start()` builds from the config, raising its `ConfigError`s; returns
    what the start would warn of (hook code naming an agent or connection the config lacks)."""
    from talkbridge.hooks.loader import load_hook_folders

    config = bridge.config
    bridge.add_configured_agents()
    bridge.registry.build(config, bridge.context)
    if config.hooks:
        connection_ids = [*bridge.registry.ids(), "webchat"]  # `run` always serves the webchat
        load_hook_folders(config.hook_folders(), bridge.hook_deps(), bridge.hooks, connection_ids)
        return bridge.unknown_hook_targets(connection_ids)
    return []
