"""Hooks: how apps decide what happens to messages and turns.

Kinds: channel-message (routing chain), turn-middleware (onion around the agent), agent-turn-started
/ agent-turn-finished (lifecycle watchers), run-listener, chat and reply. `HookRegistry` holds them
all; `load_hook_folders` fills it from the folders listed in the config.
"""

from talkbridge.hooks.channel_message import (
    ChannelMessageHook,
    ChannelMessageHooks,
    Continue,
    Decision,
    Drop,
    Forward,
    Modify,
    RouteToAgent,
    RouteToSentinel,
    Routing,
    RoutingOutcome,
)
from talkbridge.hooks.chat import ChatHooks, ReplyOutcome
from talkbridge.hooks.engine import (
    ALLOW,
    GLOBAL,
    Allow,
    Block,
    ChainOutcome,
    EventAttrs,
    HookChain,
    HookFailure,
    HookFilter,
    OnError,
    Prefetch,
    Registration,
    Scope,
)
from talkbridge.hooks.engine import Modify as ModifyEvent
from talkbridge.hooks.lifecycle import (
    LifecycleWatchers,
    TurnFinishedEvent,
    TurnStartedEvent,
)
from talkbridge.hooks.listeners import (
    FileUpload,
    ListenerRefusedError,
    MemoryWrite,
    RunListeners,
    RunResult,
    ThreadCreated,
)
from talkbridge.hooks.loader import HookSpec, LoadedHook, load_hook_folders, load_hooks
from talkbridge.hooks.middleware import TurnMiddleware, compose
from talkbridge.hooks.registry import KINDS, HookDeps, HookRegistry, RegisteredHook

__all__ = [
    "ALLOW",
    "GLOBAL",
    "KINDS",
    "Allow",
    "Block",
    "ChainOutcome",
    "ChannelMessageHook",
    "ChannelMessageHooks",
    "ChatHooks",
    "Continue",
    "Decision",
    "Drop",
    "EventAttrs",
    "FileUpload",
    "Forward",
    "HookChain",
    "HookDeps",
    "HookFailure",
    "HookFilter",
    "HookRegistry",
    "HookSpec",
    "LifecycleWatchers",
    "ListenerRefusedError",
    "LoadedHook",
    "MemoryWrite",
    "Modify",
    "ModifyEvent",
    "OnError",
    "Prefetch",
    "RegisteredHook",
    "Registration",
    "ReplyOutcome",
    "RouteToAgent",
    "RouteToSentinel",
    "Routing",
    "RoutingOutcome",
    "RunListeners",
    "RunResult",
    "Scope",
    "ThreadCreated",
    "TurnFinishedEvent",
    "TurnMiddleware",
    "TurnStartedEvent",
    "compose",
    "load_hook_folders",
    "load_hooks",
]
