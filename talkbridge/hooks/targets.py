"""The agents and connections a hook folder's code names outright, checked against the config.

`RouteToAgent("billng")` or `Forward("support-bot")` to a name the config lacks fails only when a
message takes that path (its sender gets an apology). Where the name is written in the code as a
literal, it is known before any message comes: `talkbridge check` and the start say so. A name
computed while the bridge runs (`RouteToAgent(DESKS[topic])`) cannot be checked here; the log
names it when a message is routed there.

A warning, not an error: the line may sit on a path this deployment never takes (a hook folder
shared by several configs).
"""

from __future__ import annotations

import ast
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from talkbridge.hooks.calls import shown_path

_DECISIONS: Final[dict[str, tuple[Literal["agent", "connection"], str]]] = {
    "RouteToAgent": ("agent", "agent"),
    "Forward": ("connection", "connection_id"),
}
"""Decision class -> what its first argument names, and that argument's keyword."""


@dataclass(frozen=True, slots=True)
class Target:
    """A literal target in a hook's code: `RouteToAgent('billing')` at FILE line N."""

    kind: Literal["agent", "connection"]
    name: str
    call: str
    file: Path
    line: int


def literal_targets(folder: Path) -> Iterator[Target]:
    """Each `RouteToAgent("…")` / `Forward("…")` with a string literal in the folder's modules
    (`hook.py` and those beside it). A module that does not parse is skipped: importing it
    says what is wrong."""
    for file in sorted(folder.glob("*.py")):
        try:
            tree = ast.parse(file.read_text(encoding="utf-8"), filename=str(file))
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
            continue
        calls = sorted(
            (node for node in ast.walk(tree) if isinstance(node, ast.Call)),
            key=lambda node: (node.lineno, node.col_offset),
        )
        for node in calls:
            func = node.func
            called = (
                func.id
                if isinstance(func, ast.Name)
                else func.attr
                if isinstance(func, ast.Attribute)
                else None
            )
            if called not in _DECISIONS:
                continue
            kind, keyword = _DECISIONS[called]
            given = node.args[0] if node.args else None
            given = next((k.value for k in node.keywords if k.arg == keyword), given)
            if isinstance(given, ast.Constant) and isinstance(given.value, str):
                call = f"{called}({given.value!r})"
                yield Target(kind, given.value, call, file, node.lineno)


def unknown_targets(
    folders: Collection[Path],
    agents: Collection[str],
    connections: Collection[str],
    disabled: Collection[str] = (),
) -> list[str]:
    """One line per literal target in the folders' code that names no agent of `agents`, or no
    connection of `connections` (`disabled`: configured with `enabled: false`)."""
    problems: list[str] = []
    for folder in folders:
        for target in literal_targets(folder):
            where = f"{shown_path(str(target.file))} line {target.line}: {target.call}"
            if target.kind == "agent" and target.name not in agents:
                problem = f"no agent is named {target.name!r} (agents: {', '.join(sorted(agents))})"
            elif target.kind == "connection" and target.name in disabled:
                problem = f"connection {target.name!r} is disabled (enabled: false)"
            elif target.kind == "connection" and target.name not in connections:
                known = ", ".join(sorted(connections))
                problem = f"no connection is named {target.name!r} (connections: {known})"
            else:
                continue
            problems.append(
                f"hook folder {folder}: {where}: {problem}; a message routed there is answered "
                "with an apology"
            )
    return problems
