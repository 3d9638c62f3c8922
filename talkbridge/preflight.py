"""What `Bridge.start` would refuse, found without starting anything.

`talkbridge check` runs it so that "config: ok" means `run` accepts the config too: agents are
built, hook folders imported and their hooks created, connectors constructed — by the same code
`run` uses, on a Bridge that is never started (no store opened, no connection, no listening).
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Final

from talkbridge.errors import ConfigError

if TYPE_CHECKING:
    from talkbridge.bridge import Bridge

_OWN_CODE: Final = Path(__file__).resolve().parent
"""talkbridge's own modules: a warning they log while loading the user's code is about it."""


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
    what the start would warn of: the warnings the log's level hides that loading the python
    agents and the hook folders logs (talkbridge's about them, and their own code's), then hook
    code naming an agent or connection the config lacks."""
    from talkbridge.hooks.loader import hook_folders, load_hook_folders

    config = bridge.config
    with _hidden_warnings() as agent_records:
        bridge.add_configured_agents()
    bridge.registry.build(config, bridge.context)
    warnings = _about(agent_records, _agent_code(bridge))
    if config.hooks:
        connection_ids = [*bridge.registry.ids(), "webchat"]  # `run` always serves the webchat
        with _hidden_warnings() as hook_records:
            load_hook_folders(
                config.hook_folders(), bridge.hook_deps(), bridge.hooks, connection_ids
            )
        warnings += _about(hook_records, hook_folders(config.hook_folders()))
        warnings += bridge.unknown_hook_targets(connection_ids)
    return warnings


class _Hidden(logging.Handler):
    """Keeps the warnings a log at `level` would not show."""

    def __init__(self, level: int) -> None:
        super().__init__(logging.WARNING)
        self.level_shown = level
        self.records: list[logging.LogRecord] = []

    def hides(self, record: logging.LogRecord) -> bool:
        """Whether the log did not show `record` before: below its logger's own level, or
        the root's for one without."""
        logger: logging.Logger | None = logging.getLogger(record.name)
        while logger is not None and logger.parent is not None and not logger.level:
            logger = logger.parent
        own = logger.level if logger is not None and logger.parent is not None else 0
        return record.levelno < (own or self.level_shown)

    def emit(self, record: logging.LogRecord) -> None:
        if self.hides(record):
            self.records.append(record)


@contextlib.contextmanager
def _hidden_warnings() -> Iterator[list[logging.LogRecord]]:
    """The warnings logged meanwhile that the log's level hides (`check` logs errors only):
    collected instead, while the log shows what it showed before, nothing more."""
    root = logging.getLogger()
    level = root.level
    if level <= logging.WARNING:  # the log shows them itself
        yield []
        return
    keeper = _Hidden(level)
    handlers = list(root.handlers)

    def shown(record: logging.LogRecord) -> bool:
        return not keeper.hides(record)

    for handler in handlers:
        handler.addFilter(shown)
    root.addHandler(keeper)
    root.setLevel(logging.WARNING)
    try:
        yield keeper.records
    finally:
        root.setLevel(level)
        root.removeHandler(keeper)
        for handler in handlers:
            handler.removeFilter(shown)


def _about(records: list[logging.LogRecord], code: list[Path]) -> list[str]:
    """The lines of the records about the user's `code` (files and folders): talkbridge's own
    (they name the hook or agent), and its own code's, after its logger's name as the log
    writes it; a library's are not about it."""
    lines: list[str] = []
    for record in records:
        file = Path(record.pathname).resolve()
        if file.is_relative_to(_OWN_CODE):
            lines.append(record.getMessage())
        elif any(file.is_relative_to(place) for place in code):
            lines.append(f"{record.name}: {record.getMessage()}")
    return lines


def _agent_code(bridge: Bridge) -> list[Path]:
    """The files (a module) and folders (a package) of the python agents' code: the module
    the config names and the agent's class's."""
    places: list[Path] = []
    for name, spec in bridge.config.agents.definitions.items():
        if spec.kind != "python" or not spec.target:
            continue
        agent = bridge.runner.agent(name)
        for module_name in (spec.target.partition(":")[0], type(agent).__module__):
            top = sys.modules.get(module_name.split(".")[0])
            folders = getattr(top, "__path__", None)
            if folders is not None:
                places += [Path(folder).resolve() for folder in folders]
            elif (file := getattr(top, "__file__", None)) is not None:
                places.append(Path(file).resolve())
    return places
