"""What `Bridge.start` would refuse, found without starting anything.

`talkbridge check` runs it so that "config: ok" means `run` accepts the config too: agents are
built, hook folders imported and their hooks created, connectors constructed — by the same code
`run` uses, on a Bridge that is never started (no store opened, no connection, no listening).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from talkbridge.errors import ConfigError

if TYPE_CHECKING:
    from talkbridge.bridge import Bridge
    from talkbridge.hooks import HookDeps


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


def validate_startup(bridge: Bridge) -> None:
    """Build what `bridge.start()` builds from the config, raising its `ConfigError`s."""
    from talkbridge.agents import build_agent
    from talkbridge.hooks.loader import load_hook_folders

    config = bridge.config
    for name, spec in config.agents.definitions.items():
        bridge.runner.add_agent(build_agent(name, spec, bridge.store), name)
    check_agent_roles(bridge)
    if config.hooks:
        load_hook_folders(config.hook_folders(), _hook_deps(bridge), bridge.hooks)
    bridge.registry.build(config, bridge.context)


def _hook_deps(bridge: Bridge) -> HookDeps:
    """The deps `Bridge.start` gives hooks."""
    from talkbridge.hooks import HookDeps

    return HookDeps(
        app_id=bridge.app_id,
        logger=logging.getLogger(f"talkbridge.hooks.{bridge.app_id}"),
        router=bridge.router,
        agent_runner=bridge.runner,
        context={"config": bridge.config, "store": bridge.store, "bridge": bridge},
        hooks=bridge.hooks,
        environment=bridge.config.environment,
    )
