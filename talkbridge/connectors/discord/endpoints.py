"""discord.py keeps its REST base and gateway URL process-wide; this shares them safely.

`discord.http.Route.BASE` and `discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY` are class
attributes, read by every client in the process. A connection takes a lease on the values it
needs; leases with the same values coexist, a lease with different values is refused with an
error that says why (two Discord connections in one process must share `api_base` and
`gateway_url`), and the originals come back when the last lease is released.
"""

from __future__ import annotations

from dataclasses import dataclass

import yarl

from talkbridge.connectors.discord.sdk import discord
from talkbridge.errors import PermanentError


@dataclass(frozen=True, slots=True)
class Endpoints:
    api_base: str | None
    gateway_url: str | None


_holders: dict[int, Endpoints] = {}
_original: tuple[str, yarl.URL] | None = None


def _effective(wanted: Endpoints) -> tuple[str, yarl.URL]:
    assert _original is not None
    base = wanted.api_base or _original[0]
    gateway = yarl.URL(wanted.gateway_url) if wanted.gateway_url else _original[1]
    return base, gateway


def acquire(owner: object, wanted: Endpoints) -> None:
    """Point discord.py at `wanted` for `owner`, or refuse if another owner needs others."""
    global _original
    if _original is None:
        _original = (discord.http.Route.BASE, discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY)
    target = _effective(wanted)
    for key, held in _holders.items():
        if key != id(owner) and _effective(held) != target:
            raise PermanentError(
                "discord.py uses one REST base and gateway URL per process: this connection "
                f"needs {target[0]} and {target[1]}, another Discord connection in this process "
                f"uses {_effective(held)[0]} and {_effective(held)[1]}; give them the same "
                "api_base and gateway_url, or run them in separate processes"
            )
    _holders[id(owner)] = wanted
    discord.http.Route.BASE, discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = target


def release(owner: object) -> None:
    """Drop `owner`'s lease; the last one out restores discord.py's own values."""
    global _original
    if _holders.pop(id(owner), None) is None:
        return
    if not _holders and _original is not None:
        discord.http.Route.BASE, discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = _original
        _original = None
