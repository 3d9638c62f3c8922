"""Persistence behind one contract (`Store`), chosen by the config's `store:` URL."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlsplit

from talkbridge.errors import ConfigError
from talkbridge.store.base import (
    Appended,
    FailedSend,
    HistoryEntry,
    HookDelivery,
    Pairing,
    Pruned,
    Retention,
    Role,
    Store,
)
from talkbridge.store.sqlite import MEMORY, SqliteStore

__all__ = [
    "Appended",
    "FailedSend",
    "HistoryEntry",
    "HookDelivery",
    "Pairing",
    "Pruned",
    "Retention",
    "Role",
    "SqliteStore",
    "Store",
    "open_store",
    "public_url",
    "sqlite_file",
]

_SQLITE_FORMS = "sqlite:///relative.db, sqlite:////absolute/path.db or sqlite:///:memory:"


_SECRET_PARAM = re.compile(r"pass|pwd|secret|key|token|auth|cred", re.IGNORECASE)
"""Query parameters whose value is a credential: redis-py passes `?password=` (and
`ssl_password`, `ssl_keyfile`...) on to the connection, and an encrypted SQLite build reads
`?key=`."""


def public_url(url: str) -> str:
    """`url` without its user and password (`redis://:pw@host/0` -> `redis://host/0`) and with
    the value of every password-like query parameter masked (`?password=***`): the form of a
    store URL that may be printed or logged. The authority ends at the first `/`, so a password
    holding `?` or `#` is dropped too."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    authority, slash, path = rest.partition("/")
    where, question, query = f"{authority.rpartition('@')[2]}{slash}{path}".partition("?")
    query, hash_, fragment = query.partition("#")
    params = [_masked_param(param) for param in re.split(r"([&;])", query)]
    return f"{scheme}{sep}{where}{question}{''.join(params)}{hash_}{fragment}"


def _masked_param(param: str) -> str:
    name, equals, value = param.partition("=")
    return f"{name}=***" if equals and value and _SECRET_PARAM.search(name) else param


def sqlite_file(url: str) -> Path | None:
    """The database file a `sqlite:///` URL names (None for other stores and `:memory:`), so a
    command can tell a store that was never created from an empty one without creating it."""
    url = url.strip()
    if _scheme(url) != "sqlite":
        return None
    path = url.partition("://")[2].removeprefix("/")
    return None if path in ("", MEMORY) else Path(path)


def _scheme(url: str) -> str:
    scheme, sep, _ = url.partition("://")
    return scheme.lower() if sep else ""


def _sqlite_store(url: str, *, short_lived: bool) -> Store:
    rest = url.partition("://")[2]
    if not rest.startswith("/"):
        raise ConfigError(
            f"store URL {public_url(url)!r} has a host part; write it as {_SQLITE_FORMS}"
        )
    path = rest[1:]
    if not path or path.endswith("/"):
        raise ConfigError(
            f"store URL {public_url(url)!r} names no database file; write it as {_SQLITE_FORMS}"
        )
    if "?" in path or "#" in path:
        raise ConfigError(
            f"store URL {public_url(url)!r}: query parameters are not supported for sqlite"
        )
    return SqliteStore(path, writer="thread" if short_lived else None)


def open_store(url: str, *, prefix: str = "talkbridge", short_lived: bool = False) -> Store:
    """Build (not yet open) the store a `store:` URL names; `prefix` namespaces Redis keys.

    `short_lived`: for a command that makes a few calls and ends (`talkbridge pair`): SQLite
    then writes from a thread, not from a process of its own, which would cost more to start
    than the command's whole work.

    The URL is never echoed for schemes that can carry a password (redis), only its scheme.
    """
    scheme = _scheme(url.strip())
    if scheme == "sqlite":
        return _sqlite_store(url.strip(), short_lived=short_lived)
    if scheme in ("redis", "rediss"):
        try:
            from talkbridge.store.redis import RedisStore  # the redis extra: only when asked for
        except ImportError as exc:
            raise ConfigError(
                "store: a redis:// store needs redis-py; install talkbridge[redis]"
            ) from exc

        _check_redis_url(url.strip())
        return RedisStore(url.strip(), prefix=prefix)
    shown = repr(scheme) if scheme else "missing (expected sqlite:// or redis://)"
    raise ConfigError(f"store: unsupported URL scheme {shown}; use {_SQLITE_FORMS} or redis://")


def _check_redis_url(url: str) -> None:
    """What redis-py would only stumble on later (a traceback at start, or database 0 taken in
    silence for `/abc`), named now; never quoting the URL, which may hold a password."""
    from redis.asyncio.connection import parse_url

    try:
        parts = urlsplit(url)
    except ValueError as exc:  # `[::1:6379`: "Invalid IPv6 URL"
        raise ConfigError(f"store: the redis URL is not valid: {exc}") from None
    try:
        parts.port  # noqa: B018 - reading it checks it (0-65535)
    except ValueError:
        raise ConfigError("store: the redis URL's port is not a port number (1-65535)") from None
    try:
        parse_url(url)  # its query parameters (`?socket_timeout=abc`), as the client reads them
    except ValueError as exc:  # its words name the parameter, never a value
        raise ConfigError(f"store: the redis URL is not valid: {exc}") from None
    _check_redis_parameters(url)
    database = parts.path.strip("/")
    if database and not database.isdigit():
        raise ConfigError(
            "store: the part after the host of a redis URL is the database number "
            "(redis://host:6379/0), not a name"
        )


_UNKNOWN_ARGUMENT = re.compile(r"unexpected keyword argument '(\w+)'")


def _check_redis_parameters(url: str) -> None:
    """A query parameter redis-py does not know (`?sockettimeout=5`) is handed on to its
    connection class, which refuses it only at the first command: a traceback at start. The
    connection is built here (it opens nothing) so the parameter is named now, not its value."""
    from redis.asyncio import ConnectionPool
    from redis.exceptions import RedisError

    try:
        pool = ConnectionPool.from_url(url)
        pool.connection_class(**pool.connection_kwargs)
    except RedisError as exc:  # a value it refuses (`?protocol=9`), named in its own words
        raise ConfigError(f"store: the redis URL is not valid: {exc}") from None
    except TypeError as exc:
        found = _UNKNOWN_ARGUMENT.search(str(exc))
        name = found.group(1) if found else ""
        hint = " (ssl_ parameters are for rediss://)" if name.startswith("ssl_") else ""
        raise ConfigError(
            f"store: the redis URL has a parameter {name!r} the redis client does not take{hint}"
        ) from None
