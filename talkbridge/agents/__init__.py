"""Agents answer messages: built-in `echo` and `sentinel`, and the user's own classes."""

from __future__ import annotations

import importlib
import inspect
import sys
from datetime import timedelta
from pathlib import Path

from talkbridge.agents.base import (
    Agent,
    AgentMessage,
    ChatMessages,
    Error,
    Result,
    TextDelta,
    ToolCall,
    ToolResult,
    TurnContext,
    TurnInput,
    TurnSession,
)
from talkbridge.agents.echo import EchoAgent
from talkbridge.agents.runner import AgentRunner, TurnOutcome
from talkbridge.agents.sentinel import CODE_TTL, SentinelAgent
from talkbridge.config import AgentSpec
from talkbridge.errors import ConfigError
from talkbridge.store.base import Store


def build_agent(
    name: str,
    spec: AgentSpec,
    store: Store,
    base_dir: Path | None = None,
    *,
    code_ttl: timedelta = CODE_TTL,
) -> Agent:
    """Build a configured agent (`agents.definitions.NAME`). A `python` agent's module may sit
    next to the config file (`base_dir`), as hook folders do: no PYTHONPATH needed. `code_ttl`
    is a sentinel's pairing-code lifetime (`pairing.code_ttl`)."""
    where = f"agents.definitions.{name}"
    if spec.kind == "echo":
        return EchoAgent()
    if spec.kind == "sentinel":
        return SentinelAgent(store, code_ttl=code_ttl)
    if spec.kind == "python":
        if not spec.target or ":" not in spec.target:
            raise ConfigError(f"{where}.target: give the agent class as 'module:Class'")
        module_name, _, attr = spec.target.partition(":")
        if base_dir is not None and str(base_dir.resolve()) not in sys.path:
            sys.path.append(str(base_dir.resolve()))  # after installed packages: never shadows
        try:
            factory = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"{where}.target: cannot load {spec.target}: {exc}") from None
        except Exception as exc:  # the module's own code failed (or did not compile)
            raise ConfigError(
                f"{where}.target: cannot load {spec.target}: {_one_line(exc)}"
            ) from None
        except SystemExit as exc:  # `sys.exit()` at import: not the bridge's exit to take
            raise ConfigError(
                f"{where}.target: cannot load {spec.target}: importing it called "
                f"sys.exit({exc.code!r})"
            ) from None
        if not callable(factory):
            raise ConfigError(
                f"{where}.target: {spec.target} is not a class or a function that makes the agent"
            )
        try:
            agent = factory()
        except Exception as exc:
            raise ConfigError(
                f"{where}.target: building {spec.target} failed: {_one_line(exc)}"
            ) from None
        if not isinstance(agent, Agent):
            raise ConfigError(
                f"{where}.target: {spec.target} is not an agent (it needs `name` and `stream(ctx)`)"
            )
        if inspect.iscoroutinefunction(agent.stream):  # `async def` without a `yield`
            raise ConfigError(
                f"{where}.target: {spec.target}.stream must yield its events (TextDelta…, then "
                "a Result): it is an `async def` that never yields"
            )
        if inspect.isgeneratorfunction(agent.stream):  # a `def` that yields: no `async`
            raise ConfigError(
                f"{where}.target: {spec.target}.stream must be an `async def` that yields its "
                "events (TextDelta…, then a Result): it is a plain `def`"
            )
        return agent
    if spec.kind == "openai":
        if not spec.base_url or not spec.model:
            raise ConfigError(f"{where}: an openai agent needs base_url and model")
        from talkbridge.agents.openai_compat import OpenAIChatAgent

        return OpenAIChatAgent(
            name,
            base_url=spec.base_url,
            model=spec.model,
            api_key=spec.api_key.get_secret_value() if spec.api_key else None,
            system_prompt=spec.system_prompt,
            history=spec.history,
            timeout=spec.timeout,
        )
    raise ConfigError(f"{where}.kind: {spec.kind!r} agents are not available in this version")


def _one_line(exc: Exception) -> str:
    """`RuntimeError: why`, on one line whatever the message holds."""
    return " ".join(f"{type(exc).__name__}: {exc}".split())


__all__ = [
    "Agent",
    "AgentMessage",
    "AgentRunner",
    "ChatMessages",
    "EchoAgent",
    "Error",
    "Result",
    "SentinelAgent",
    "TextDelta",
    "ToolCall",
    "ToolResult",
    "TurnContext",
    "TurnInput",
    "TurnOutcome",
    "TurnSession",
    "build_agent",
]
