"""talkbridge: one bridge between chat platforms, hooks and agents."""

from talkbridge.errors import (
    ConfigError,
    ConnectionNotStartedError,
    ConnectionStartFailedError,
    ConnectorError,
    FeatureUnavailableError,
    RateLimitedError,
    SendFailedError,
    TalkbridgeError,
    UnknownConnectionError,
)
from talkbridge.message import (
    KNOWN_CHANNELS,
    Attachment,
    Channel,
    MessageRouting,
    NormalizedMessage,
    OutboundMessage,
    ReplyTo,
    SendResult,
)
from talkbridge.talk import Feature, Subscription, Talk

__version__ = "0.1.0"

__all__ = [
    "KNOWN_CHANNELS",
    "Attachment",
    "Channel",
    "ConfigError",
    "ConnectionNotStartedError",
    "ConnectionStartFailedError",
    "ConnectorError",
    "Feature",
    "FeatureUnavailableError",
    "MessageRouting",
    "NormalizedMessage",
    "OutboundMessage",
    "RateLimitedError",
    "ReplyTo",
    "SendFailedError",
    "SendResult",
    "Subscription",
    "Talk",
    "TalkbridgeError",
    "UnknownConnectionError",
    "__version__",
]


def __getattr__(name: str) -> object:
    # The heavier pieces load on first use, so `import talkbridge` stays cheap.
    if name in ("TalkRouter",):
        from talkbridge.router import TalkRouter

        return TalkRouter
    if name == "ConnectionRegistry":
        from talkbridge.registry import ConnectionRegistry

        return ConnectionRegistry
    if name == "Bridge":
        from talkbridge.bridge import Bridge

        return Bridge
    raise AttributeError(f"module 'talkbridge' has no attribute {name!r}")
