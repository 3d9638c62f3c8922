"""talkbridge's one exception family.

Connectors translate their SDK's exceptions into these at the boundary, so the core decides
retries in one place::

    TalkbridgeError
    ├── ConfigError                 bad config file or value (exit code 2)
    ├── UnknownConnectionError      a connection id nobody configured
    │   └── ConnectionNotStartedError   a configured one, not started (or still starting)
    ├── ConnectionStartFailedError  a connection started while the bridge serves failed to
    ├── FeatureUnavailableError     a connection lacks a feature
    ├── HookError                   a hook failed, timed out, or returned something unusable
    │   └── HookLoadError           a hook folder cannot be loaded (also a ConfigError: exit 2)
    ├── TurnAbortedError            a `before_*` listener or fail-closed hook stopped a turn
    ├── SendFailedError             an outbound message could not be delivered (recorded)
    ├── ConnectionMovedError        distributed mode: the send's connection is another node's now
    ├── StoreError                  the store cannot be opened or an operation on it failed
    ├── PairingExpiredError         `approve_pairing` of a pending code past its lifetime
    └── ConnectorError              what a platform said, classified
        ├── RateLimitedError        retry after `retry_after` seconds (scope: connection or thread)
        ├── UnauthorizedError       credentials rejected: do not retry
        ├── NotFoundError           the target does not exist: do not retry
        ├── TransientError          network, 5xx, dropped socket: retry with backoff
        └── PermanentError          anything else the platform refused: do not retry
"""

from __future__ import annotations

from datetime import UTC
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from talkbridge.store.base import Pairing


class TalkbridgeError(Exception):
    """Root of every error talkbridge raises on purpose."""


class ConfigError(TalkbridgeError):
    """The configuration is invalid; the message names the key path and the reason."""


class UnknownConnectionError(TalkbridgeError, LookupError):
    def __init__(self, connection_id: str, known: list[str]) -> None:
        self.connection_id = connection_id
        self.known = sorted(known)
        listed = ", ".join(self.known) if self.known else "none are configured"
        super().__init__(f"unknown connection {connection_id!r}; known connections: {listed}")


class ConnectionNotStartedError(UnknownConnectionError):
    """A connection of the config used before the bridge built it (`await bridge.start()`),
    or, `starting`, while it is still being built (`talkbridge run` imports the connections'
    SDKs once the webchat serves: what cannot wait for it, its features, says so), or after
    that `failed` (the reason)."""

    def __init__(
        self,
        connection_id: str,
        known: list[str],
        *,
        starting: bool = False,
        failed: str | None = None,
    ) -> None:
        self.connection_id = connection_id
        self.known = sorted(known)
        self.starting = starting
        if starting:
            text = (
                f"connection {connection_id!r} is still starting (its SDK is being loaded): "
                "a send to it waits until it has started; ask for its features once it has"
            )
        elif failed is not None:
            text = f"connection {connection_id!r} could not start: {failed}"
        else:
            text = (
                f"connection {connection_id!r} is not started yet: the bridge builds its "
                "connections in `await bridge.start()`; use it once that has returned "
                "(subscribing to it works before)"
            )
        TalkbridgeError.__init__(self, text)


class ConnectionStartFailedError(TalkbridgeError):
    """A connection being started while the bridge serves (`talkbridge run`) could not be
    (its SDK failed to import, its connector to build), or the bridge stopped first: what
    waited for it gets `reason`."""

    def __init__(self, connection_id: str, reason: str) -> None:
        self.connection_id = connection_id
        self.reason = reason
        super().__init__(f"connection {connection_id!r} could not start: {reason}")


class FeatureUnavailableError(TalkbridgeError):
    pass


class HookError(TalkbridgeError):
    pass


class HookLoadError(HookError, ConfigError):
    """A hook folder the config lists cannot be loaded: a config problem, so the CLI exits 2."""


class TurnAbortedError(TalkbridgeError):
    pass


class SendFailedError(TalkbridgeError):
    def __init__(self, connection_id: str, thread_id: str, reason: str) -> None:
        self.connection_id = connection_id
        self.thread_id = thread_id
        self.reason = reason
        super().__init__(f"send to {connection_id}/{thread_id} failed: {reason}")


class AgentUnavailableError(TalkbridgeError):
    """An agent's model cannot be used as configured (unreachable, a refused key, a model the
    server does not offer); the message says which, never the key."""


class LeaseLostError(TalkbridgeError):
    """Distributed mode: this node no longer surely holds the inbound shard of the message it
    was answering (a Redis outage longer than the lease), so the shard's new holder answers it;
    what this node has not sent yet, it does not send."""


class ConnectionMovedError(TalkbridgeError):
    """Distributed mode: right before a platform call, this node found it no longer holds the
    connection's lease. Nothing went out; the connection's new owner sends it (a send asked
    of this node is left on the bus for it, one made here is asked of it)."""

    def __init__(self, connection_id: str) -> None:
        super().__init__(f"connection {connection_id!r} is no longer run by this node")
        self.connection_id = connection_id


class StoreError(TalkbridgeError):
    """The store failed; the message names the store (path or host), never a credential."""


class PairingExpiredError(TalkbridgeError):
    """A pending pairing code was approved after its `expires_at`: nobody was trusted. The
    sender gets a fresh code by writing again."""

    def __init__(self, pairing: Pairing) -> None:
        self.pairing = pairing
        at = pairing.expires_at
        expired = "" if at is None else f" at {at.astimezone(UTC):%Y-%m-%d %H:%M} UTC"
        super().__init__(
            f"pairing code {pairing.code} expired{expired}, so nobody was trusted: the sender "
            "gets a new code by writing again"
        )


class ConnectorError(TalkbridgeError):
    retryable = False


class RateLimitedError(ConnectorError):
    retryable = True

    def __init__(
        self,
        message: str,
        retry_after: float,
        scope: Literal["connection", "thread"] = "connection",
    ) -> None:
        super().__init__(message)
        self.retry_after = max(0.0, retry_after)
        self.scope = scope


class UnauthorizedError(ConnectorError):
    pass


class NotFoundError(ConnectorError):
    pass


class TransientError(ConnectorError):
    retryable = True


class PermanentError(ConnectorError):
    pass
