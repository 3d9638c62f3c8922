"""One YAML file configures the bridge; every key has a default, so no file is the embedded default.

`${NAME}` in any string is replaced by that environment variable; `{file: PATH}` reads a secret
from a file. Values that came from either are secrets: `Secrets.redact` removes them from any text
before it is logged or shown. Errors name the key path and the reason, never the value.
"""

from __future__ import annotations

import difflib
import fnmatch
import importlib
import ipaddress
import os
import re
import types
import typing
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal
from urllib.parse import quote, unquote, urlsplit

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic_core import ErrorDetails

from talkbridge.errors import ConfigError

_CONNECTION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_ENV_REF = re.compile(r"(\$?)\$\{([^}]*)\}")
"""`${NAME}`, or `$${NAME}`: the text `${NAME}` itself (in a prompt, say)."""
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
PLAIN_KEYS = frozenset({"host", "port", "id", "channel", "folder", "mode", "security"})
"""Keys whose `${NAME}` values are not secrets: an error about them shows the value (which
port is in use), and the value is not blanked out of every other line either."""


class Secrets:
    """Every secret value the config holds, so any text can be scrubbed of them."""

    def __init__(self, values: Iterable[str] = ()) -> None:
        self._values: set[str] = set()
        self._longest_first: list[str] = []
        """`_values` in the order `redact` replaces them, kept as they are added: redact runs
        on every log line, adding happens while the config loads."""
        for value in values:
            self.add(value)

    def add(self, value: str) -> None:
        """`value`, and the forms a library may log it in: escaped in a quoted string (IMAP's
        `LOGIN user "pa\\"ss"`, JSON) and inside a `repr()` of a str or bytes (backslashes
        doubled), which aioimaplib's own masking of LOGIN misses."""
        if len(value) < 4:
            return
        quoted = value.replace("\\", "\\\\").replace('"', '\\"')
        for form in (value, quoted):
            self._values.add(form)
            self._values.add(form.replace("\\", "\\\\"))  # a repr() doubles each backslash
            self._values.add(repr(form)[1:-1])
            self._values.add(repr(form.encode())[2:-1])
        self._longest_first = sorted(self._values, key=len, reverse=True)

    def redact(self, text: str) -> str:
        for value in self._longest_first:
            if value in text:
                text = text.replace(value, "***")
        return _URL_USERINFO.sub(r"\1***@", text)


_URL_USERINFO = re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]*://)[^/\s@'\"<>]+@")
"""The `user:password@` of a URL (an `api_base` through an authenticating proxy, quoted by an
HTTP client's error): a credential written in the file itself, which `Secrets` does not hold."""


def http_base_url(value: str, example: str) -> str:
    """An `api_base` check shared by the channels: an http(s) URL with a host and a valid port,
    so a typo is a config error rather than a failure at the first request. The value is never
    quoted: it may hold a proxy's `user:password@`."""
    wrong = f"must be an http:// or https:// URL such as {example}"
    try:
        url = urlsplit(value)
    except ValueError:  # `http://[::1`
        raise ValueError(wrong) from None
    if url.scheme.lower() not in ("http", "https") or not url.hostname:
        raise ValueError(wrong)
    try:
        url.port  # noqa: B018 - reading it checks it (0-65535)
    except ValueError:
        raise ValueError(f"{wrong}: its port is not a port number (1-65535)") from None
    return value


def without_login(value: str, sender: str) -> str:
    """An http(s) base URL whose requests carry a token in their Authorization header (`sender`
    names the API) cannot also log in with a `user:password@`: HTTP has one such header, and the
    client refuses the request. Refused here, not at every request; the value is not quoted."""
    if has_login(value):
        raise ValueError(
            f"cannot hold a user:password@: requests to {sender} carry the token in their "
            "Authorization header, which a login in the URL needs too"
        )
    return value


def has_login(value: str) -> bool:
    """Whether an http(s) URL holds a `user:password@` (or just a `user@`)."""
    return "@" in urlsplit(value).netloc


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ConnectionConfig(_Model):
    """Keys every connection has; each channel's model adds its own credentials."""

    id: str

    @field_validator("id")
    @classmethod
    def _id_shape(cls, value: str) -> str:
        if not _CONNECTION_ID.fullmatch(value):
            raise ValueError(
                "use 1-64 letters, digits, '_', '.' or '-', starting with a letter or digit"
            )
        return value

    channel: str
    trusted: tuple[str, ...] = ()
    """Sender ids or shell-style patterns (`*@example.com`) trusted on this connection."""
    enabled: bool = True

    trusted_ids: ClassVar[tuple[str, str] | None] = None
    """For channels whose `trusted` holds ids: what they are, said in the error, and the
    characters an id of the channel has (a regex class body, such as `0-9-`)."""

    @field_validator("trusted", mode="before")
    @classmethod
    def _numeric_ids(cls, value: Any) -> Any:
        """Telegram and Discord ids are numbers, and YAML reads `[123456789]` as one."""
        if isinstance(value, list | tuple):
            return [str(v) if isinstance(v, int) and not isinstance(v, bool) else v for v in value]
        return value

    @field_validator("trusted")
    @classmethod
    def _no_empty_entry(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if any(not entry.strip() for entry in value):
            raise ValueError("an empty entry would never match (an unset ${VARIABLE}?)")
        if cls.trusted_ids is not None:
            cls._no_handles(value, *cls.trusted_ids)
        return value

    @staticmethod
    def _no_handles(trusted: tuple[str, ...], what: str, id_chars: str) -> None:
        """A `@name`, or any entry with a character no id of the channel has (`id_chars`,
        besides the pattern's `*?[]!`), would never match anyone."""
        handles = [t for t in trusted if t.startswith("@")]
        if handles:
            raise ValueError(f"{', '.join(handles)} would never match: it holds {what}, not @names")
        shape = re.compile(f"[{id_chars}*?\\[\\]!]+")
        odd = [t for t in trusted if not shape.fullmatch(t)]
        if odd:
            shown = ", ".join(repr(t) for t in odd)
            raise ValueError(f"{shown} would never match: it holds {what}")

    def trusts(self, channel_user_id: str) -> bool:
        if channel_user_id in self.trusted:  # an exact id: most entries, and no pattern work
            return True
        return any(fnmatch.fnmatchcase(channel_user_id, pattern) for pattern in self.trusted)

    def trusts_sender(self, message: Any) -> bool:
        """Whether the sender of `message` is trusted by config; channels with more to go on
        than the sender id (Discord roles) override this."""
        return self.trusts(message.channel_user_id)

    def trusts_message(self, message: Any) -> bool:
        """Whether config trusts everyone an answer to `message` reaches: its sender and
        `others_answered`."""
        return self.trusts_sender(message) and all(
            self.trusts(a) for a in self.others_answered(message)
        )

    def others_answered(self, message: Any) -> tuple[str, ...]:
        """Who besides its sender an answer to `message` reaches and must be trusted too (an
        email's Cc): an approved pairing trusts its sender alone. None on most channels."""
        return ()

    def secret_values(self) -> list[str]:
        found: list[str] = []
        _collect_secrets(self, found)
        return found


def _collect_secrets(value: Any, found: list[str]) -> None:
    if isinstance(value, SecretStr):
        found.append(value.get_secret_value())
    elif isinstance(value, BaseModel):
        for name in type(value).model_fields:
            _collect_secrets(getattr(value, name), found)
    elif isinstance(value, list | tuple):
        for item in value:
            _collect_secrets(item, found)


class WebchatIssuer(_Model):
    """Tokens your own app signs (JWT, HS256) for its users: `sub` names the user, `exp` is
    required; a renewed token of the same `sub` keeps the user's conversations."""

    secret: SecretStr
    audience: str | None = None
    leeway: float = Field(default=30.0, ge=0)

    MIN_SECRET_BYTES: ClassVar[int] = 32
    """RFC 7518 wants an HS256 key at least as long as the hash (256 bits)."""

    @field_validator("secret")
    @classmethod
    def _secret_not_empty(cls, secret: SecretStr) -> SecretStr:
        if not secret.get_secret_value().strip():
            raise ValueError(
                "is empty (an unset or empty ${VARIABLE}?): no token could be verified, so "
                "nobody could sign in"
            )
        return secret

    @property
    def weak_secret(self) -> bool:
        """Shorter than HS256 wants: a token could be forged by guessing the secret."""
        return len(self.secret.get_secret_value().encode("utf-8")) < self.MIN_SECRET_BYTES


_HOST_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")


def listen_host(host: str) -> str:
    """An IP address or a host name to listen on; a typo fails here, naming the key, rather
    than as a bind error at start."""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    labels = host.removesuffix(".").split(".")
    if (
        len(host) > 253
        or not all(_HOST_LABEL.fullmatch(label) for label in labels)
        or labels[-1].isdigit()  # all-numeric: meant as an IPv4 address, and not a valid one
    ):
        raise ValueError(
            "not an IP address or host name (e.g. 127.0.0.1, ::1, localhost; "
            "0.0.0.0 or :: listens on every interface)"
        )
    return host


def _not_a_bool(value: Any) -> Any:
    if isinstance(value, bool):  # YAML's `true` would pass as 1
        raise ValueError("must be a port number, not true or false")
    return value


def listen_port(port: int) -> int:
    if not 0 <= port <= 65535:
        raise ValueError("use 0-65535 (0 picks a free one)")
    return port


ListenHost = Annotated[str, AfterValidator(listen_host)]
ListenPort = Annotated[int, BeforeValidator(_not_a_bool), AfterValidator(listen_port)]


class WebchatConfig(_Model):
    host: ListenHost = "127.0.0.1"
    port: ListenPort = 8765
    tokens: tuple[SecretStr, ...] = ()
    """Accepted tokens; none given (and no issuer): one is generated at the first start, kept
    in the store and printed at every start."""
    issuer: WebchatIssuer | None = None
    trusted: tuple[str, ...] = ("*",)
    """Webchat users hold a token the operator gave them, so they are trusted by default."""
    max_frame_bytes: int = Field(default=64 * 1024, ge=1024)
    history_limit: int = Field(default=200, ge=1)
    max_sessions_per_token: int | None = Field(default=None, ge=1)
    """Sessions (browsers) one token may start, each kept in the store for good; none by
    default: a static token on a public page starts one per visitor, and a limit would turn
    away every visitor after the last it allows."""

    @field_validator("tokens")
    @classmethod
    def _tokens_not_empty(cls, tokens: tuple[SecretStr, ...]) -> tuple[SecretStr, ...]:
        for index, token in enumerate(tokens):
            if not token.get_secret_value().strip():
                raise ValueError(
                    f"token {index + 1} is empty (an unset or empty ${{VARIABLE}}?); "
                    "remove it, or leave tokens out to have one generated"
                )
        return tokens


AgentKind = Literal["echo", "sentinel", "python", "openai"]

_AGENT_KEYS: dict[str, tuple[AgentKind, ...]] = {
    "target": ("python",),
    "base_url": ("openai",),
    "model": ("openai",),
    "api_key": ("openai",),
    "system_prompt": ("openai",),
    "history": ("openai",),
    "timeout": ("openai",),
}
"""The kinds each key of an agent applies to: given to another kind, it would be ignored."""

_AGENT_NEEDS: dict[str, str] = {
    "target": "the agent class as 'module:Class'",
    "base_url": "the server's URL, such as https://api.openai.com/v1",
    "model": "the model's name, such as gpt-4o-mini",
}
"""What each required key holds, said when it is missing (the kinds needing it: `_AGENT_KEYS`)."""


class AgentSpec(_Model):
    """One of `agents.definitions`: `kind` decides which of the other keys it takes; a key of
    another kind is an error naming it, not a setting silently ignored."""

    kind: AgentKind = "echo"
    target: str | None = Field(default=None, validate_default=True)
    """`python`: `module:Class` of the user's own agent."""
    base_url: str | None = Field(default=None, validate_default=True)
    model: str | None = Field(default=None, validate_default=True)
    api_key: SecretStr | None = None
    system_prompt: str | None = None
    history: int = Field(default=20, ge=0, le=1000)
    """openai: earlier messages of the thread sent along with the prompt."""
    timeout: float = Field(default=120.0, gt=0)
    """openai: seconds to connect, and to wait for each next piece of the answer."""

    @field_validator(*_AGENT_KEYS)
    @classmethod
    def _applies_to_kind(cls, value: Any, info: ValidationInfo) -> Any:
        """Runs for each key the file gives, and for the required ones when left out (they
        validate their default, None); `history`'s default is not checked, so only a `history`
        written for another kind is refused."""
        kind = info.data.get("kind")  # absent: `kind` itself was refused, and says why
        key = info.field_name
        if kind is None or key is None:
            return value
        kinds = _AGENT_KEYS[key]
        if kind not in kinds:
            if value is None:
                return value
            raise ValueError(f"does not apply to kind {kind} (only to {', '.join(kinds)})")
        if key in _AGENT_NEEDS:
            if value is None:
                raise ValueError(f"required for kind {kind}: {_AGENT_NEEDS[key]}")
            if not value.strip():
                raise ValueError(f"is empty; kind {kind} needs {_AGENT_NEEDS[key]}")
        if key == "target" and not re.fullmatch(r"[^:\s]+:[^:\s]+", value):
            raise ValueError(f"give {_AGENT_NEEDS[key]}")
        if key == "base_url":
            return http_base_url(value, "https://api.openai.com/v1")
        if key == "api_key" and value is not None and has_login(info.data.get("base_url") or ""):
            raise ValueError(
                "cannot be used with a base_url holding a user:password@: both go in the "
                "Authorization header, and a request has one"
            )
        return value


class AgentsConfig(_Model):
    default: str = "echo"
    sentinel: str = "sentinel"
    definitions: dict[str, AgentSpec] = Field(default_factory=dict)


class RouterConfig(_Model):
    max_concurrent_threads: int = Field(default=256, ge=1)
    max_pending_messages: int = Field(default=10_000, ge=1)
    """Accepted messages waiting for their thread, in all: past this, deliveries wait."""
    send_attempts: int = Field(default=5, ge=1)
    send_retry_seconds: float = Field(default=300.0, ge=0)
    """A send failing with transient errors is retried at least `send_attempts` times and for at
    least this long: a platform or mail server down for a few minutes loses no reply."""
    send_concurrency: int = Field(default=8, ge=1)
    """Concurrent sends per connection (different threads; one thread is always in order)."""
    retry_base_delay: float = Field(default=0.5, gt=0)
    """First retry of a failed send waits about this long; later ones back off exponentially."""


RETENTION_DAYS_MAX = 36_500
"""The longest retention, in days (a century, "for good"): a retention is a date's distance,
and `.inf` or a billion days crashed `check` and `run`."""


class RetentionConfig(_Model):
    """How long the store remembers what only guards against repeats (see `Store.prune`).

    Conversation history and the id map are not affected: they are the conversation itself.
    """

    dedupe_days: float = Field(default=7.0, gt=0, le=RETENTION_DAYS_MAX, allow_inf_nan=False)
    """Ids of handled inbound messages; a platform redelivering later is taken for new."""
    sent_days: float = Field(default=7.0, gt=0, le=RETENTION_DAYS_MAX, allow_inf_nan=False)
    """Idempotency records of sends."""
    failed_sends_days: float = Field(default=30.0, gt=0, le=RETENTION_DAYS_MAX, allow_inf_nan=False)
    sweep_every: float = Field(default=3600.0, gt=0)
    """Seconds between sweeps; an entry lives up to this much longer than its retention."""


CODE_TTL_MAX = 365 * 86_400
"""The longest `pairing.code_ttl`, in seconds: a year."""


class PairingConfig(_Model):
    """The sentinel's pairing codes."""

    code_ttl: float = Field(default=3600.0, gt=0, le=CODE_TTL_MAX, allow_inf_nan=False)
    """Seconds a pending pairing code can be approved: after that the operator's approval is
    refused and the sender's next message gets a fresh code. At most a year: a code's expiry
    is a date (`.inf` crashed the start, `1e11` every sender's first message)."""


class ClusterConfig(_Model):
    """Distributed mode (a `redis://` store): leases, inbound shards, cross-node sends."""

    lease_ttl: float = Field(default=10.0, gt=0)
    """Seconds a lease (a connection's transport, an inbound shard) lives unless renewed; it is
    renewed every third of this, and a dead node's work moves to another within about this."""
    shards: int = Field(default=16, ge=1, le=1024)
    """Inbound streams; threads are hashed onto them and live nodes share them out."""
    claim_idle: float = Field(default=60.0, gt=0)
    """Seconds an inbound entry may sit unacknowledged in a held shard before its holder takes
    it over (a straggler read by a node that had just lost the shard)."""
    send_timeout: float = Field(default=30.0, gt=0)
    """Seconds a send through another node (the connection's owner) may take before it fails."""


class BridgeConfig(_Model):
    store: str = "sqlite:///talkbridge.db"
    store_prefix: str = "talkbridge"
    environment: Literal["production", "development"] = "production"
    """Production sanitizes errors shown to users; development shows the full detail."""
    webchat: WebchatConfig = WebchatConfig()
    agents: AgentsConfig = AgentsConfig()
    hooks: tuple[str, ...] = ()
    connections: tuple[ConnectionConfig, ...] = ()
    router: RouterConfig = RouterConfig()
    retention: RetentionConfig = RetentionConfig()
    pairing: PairingConfig = PairingConfig()
    cluster: ClusterConfig = ClusterConfig()
    base_dir: Path = Field(default=Path("."), exclude=True)

    @field_validator("connections")
    @classmethod
    def _unique_ids(cls, value: tuple[ConnectionConfig, ...]) -> tuple[ConnectionConfig, ...]:
        seen: set[str] = set()
        for conn in value:
            problem = _id_clash(conn.id, seen)
            if problem is not None:
                raise ValueError(problem)
            seen.add(conn.id)
        return value

    def connection(self, connection_id: str) -> ConnectionConfig | None:
        return next((c for c in self.connections if c.id == connection_id), None)

    def hook_folders(self) -> list[Path]:
        return [(self.base_dir / Path(h).expanduser()).resolve() for h in self.hooks]


def _id_clash(connection_id: str, taken: Iterable[str]) -> str | None:
    """Why `connection_id` cannot be used beside the ids already `taken`, if it cannot."""
    if connection_id == "webchat":
        return "connection id 'webchat' is reserved for the bundled webchat"
    if connection_id in taken:
        return f"connection id {connection_id!r} is used twice"
    return None


# ---- loading ----------------------------------------------------------------------------------


def _substitute(
    value: Any,
    path: str,
    secrets: Secrets,
    inside: frozenset[int] = frozenset(),
    unset: list[str] | None = None,
    base_dir: Path = Path("."),
) -> Any:
    """`value` with `${NAME}` and `{file: PATH}` resolved; `inside` holds the containers above
    it, so a YAML alias inside its own anchor (`a: &x [*x]`) is an error, not a recursion.
    Variables that are not set, and `${...}` that name none, are listed in `unset` (all of
    them, not just the first), or raise at once without it. A relative secret file is found
    in `base_dir` (the config file's folder), as hook folders and the SQLite file are: the
    same config works whatever directory the bridge is started from."""
    if isinstance(value, dict | list):
        if id(value) in inside:
            raise ConfigError(
                f"{path}: an alias of a value that contains it (a YAML anchor used inside itself)"
            )
        inside = inside | {id(value)}
    if isinstance(value, str):

        def missing(problem: str) -> str:
            if unset is None:
                raise ConfigError(problem)
            unset.append(problem)
            return ""

        def env(match: re.Match[str]) -> str:
            escaped, name = match.groups()
            if escaped:
                return "${" + name + "}"
            if not _ENV_NAME.fullmatch(name):  # `${TOKEN:-x}`, taken as is, was a password
                return missing(
                    f"{path}: a ${{...}} that is no environment variable name (letters, digits "
                    "and _; there are no defaults such as ${NAME:-x}); $${...} is the text itself"
                )
            if name not in os.environ:
                return missing(f"{path}: environment variable {name} is not set")
            if path.rpartition(".")[2] not in PLAIN_KEYS:
                secrets.add(os.environ[name])
            return os.environ[name]

        return _ENV_REF.sub(env, value)
    if isinstance(value, dict):
        if set(value) == {"file"} and isinstance(value["file"], str):
            file = base_dir / Path(_substitute(value["file"], f"{path}.file", secrets)).expanduser()
            secret = _read_text(file, f"{path}: cannot read secret file").strip()
            secrets.add(secret)
            return secret
        return {
            k: _substitute(v, _join(path, str(k)), secrets, inside, unset, base_dir)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [
            _substitute(v, f"{path}[{i}]", secrets, inside, unset, base_dir)
            for i, v in enumerate(value)
        ]
    return value


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def format_errors(
    exc: ValidationError, prefix: str = "", model: type[BaseModel] | None = None
) -> list[str]:
    """One `key.path: reason` line per problem pydantic found, never the value. With the
    `model` validated, an unknown key close to a known one (`chanel`) names it."""
    lines = []
    for error in exc.errors(include_url=False, include_input=False):
        loc = prefix
        for part in error["loc"]:
            loc = f"{loc}[{part}]" if isinstance(part, int) else _join(loc, str(part))
        reason = _config_reason(error)
        if error["type"] == "extra_forbidden" and model is not None and error["loc"]:
            *above, key = error["loc"]
            reason += near_key(str(key), _keys_at(model, above))
        lines.append(f"{loc or '(top level)'}: {reason}")
    return lines


def near_key(key: str, known: Iterable[str]) -> str:
    """`; did you mean channel?` for a misspelt key, or nothing when none is close."""
    match = difflib.get_close_matches(key, list(known), n=1, cutoff=0.7)
    return f"; did you mean {match[0]}?" if match else ""


def _keys_at(model: type[BaseModel], loc: Iterable[str | int]) -> list[str]:
    """The keys of the mapping at `loc` in `model`'s data (none when it is not a model)."""
    annotation: Any = model
    for part in loc:
        annotation = _step(annotation, part)
    for option in _options(annotation):
        if isinstance(option, type) and issubclass(option, BaseModel):
            return [name for name, f in option.model_fields.items() if not f.exclude]
    return []


def _step(annotation: Any, part: str | int) -> Any:
    """The type of the value at `part` in a value of `annotation` (None when unknown)."""
    for option in _options(annotation):
        origin = typing.get_origin(option)
        if isinstance(option, type) and issubclass(option, BaseModel):
            field = option.model_fields.get(str(part))
            if field is not None:
                return field.annotation
        elif origin in (tuple, list) and isinstance(part, int):
            return typing.get_args(option)[0]
        elif origin is dict and isinstance(part, str):
            return typing.get_args(option)[1]
    return None


def _options(annotation: Any) -> tuple[Any, ...]:
    """The members of a union (`X | None`), or the annotation alone."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return typing.get_args(annotation)
    return (annotation,)


def error_reason(error: ErrorDetails) -> str:
    """Why pydantic refused a value, in the words a user reads: our validators' own sentences
    without pydantic's "Value error, " in front."""
    if error["type"] == "extra_forbidden":
        return "unknown key"
    return error["msg"].removeprefix("Value error, ")


_SHAPES = {
    "missing": "required",
    "list_type": "must be a list",
    "tuple_type": "must be a list",
    "set_type": "must be a list",
    "frozen_set_type": "must be a list",
    "dict_type": "must be a mapping",
    "model_type": "must be a mapping",
    "model_attributes_type": "must be a mapping",
    "bool_parsing": "must be true or false",
    "bool_type": "must be true or false",
}
"""pydantic's wordings that name Python types (`a valid tuple`, `instance of WebchatConfig`,
`unable to interpret input`), in the YAML words a config's author knows."""


def _config_reason(error: ErrorDetails) -> str:
    context = error.get("ctx") or {}
    if error["type"] == "string_too_short" and context.get("min_length") == 1:
        return "must not be empty"
    if error["type"] == "string_pattern_mismatch" and context.get("pattern") == "^/":
        return "must be a path starting with / (such as /hooks/in)"
    reason = _SHAPES.get(error["type"]) or error_reason(error)
    if reason.startswith("Input should be "):
        return "must be " + reason.removeprefix("Input should be ")
    return reason


def invalid_config(problems: list[str], source: str | None = None) -> str:
    """The text of an invalid-config error: a first line naming the file, then one problem a
    line, as the CLI prints it."""
    where = f" ({source})" if source else ""
    return f"invalid config{where}:\n" + "\n".join(f"  {p}" for p in problems)


def connection_model(channel: str) -> type[ConnectionConfig]:
    from talkbridge.connectors import channel_spec

    spec = channel_spec(channel)
    module_name, _, attr = spec.config.partition(":")
    model = getattr(importlib.import_module(module_name), attr)
    if not (isinstance(model, type) and issubclass(model, ConnectionConfig)):
        raise TypeError(f"{spec.config} is not a ConnectionConfig model")
    return model


STORE_KEYS = ("store", "store_prefix")
"""What a command that only reads or writes the store (`pair`, `hooks dead-letters`) needs."""


def parse_config(
    data: Any,
    base_dir: Path | None = None,
    *,
    source: str | None = None,
    only: tuple[str, ...] | None = None,
) -> tuple[BridgeConfig, Secrets]:
    """Validate already-parsed YAML; raises `ConfigError` naming each bad key.

    `source` names the file in errors. `only` validates just those top-level keys (the rest
    keep their defaults), so a command that needs the store does not demand, say, a bot token
    from the environment."""
    from talkbridge.connectors import known_channels

    secrets = Secrets()
    if data is None:
        data = {}
    if not isinstance(data, dict):
        where = f"{source}: " if source else ""
        raise ConfigError(
            f"{where}the config file must be a mapping of keys (store, webchat, connections…)"
        )
    # A section left empty (`webchat:` with each line under it commented out) is not given.
    data = {key: value for key, value in data.items() if value is not None}
    if only is not None:
        data = {key: value for key, value in data.items() if key in only}
    unset: list[str] = []
    try:
        data = _substitute(data, "", secrets, unset=unset, base_dir=base_dir or Path("."))
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}" if source else str(exc)) from None
    if unset:  # the values they stand for are missing: checking those would only add noise
        raise ConfigError(invalid_config(unset, source))
    raw_connections = data.pop("connections", None) or []
    connections: list[ConnectionConfig] = []
    problems: list[str] = []
    if not isinstance(raw_connections, list):  # named with the file and the other problems
        problems.append("connections: must be a list of connections")
        raw_connections = []
    for index, raw in enumerate(raw_connections):
        where = f"connections[{index}]"
        if not isinstance(raw, dict):
            problems.append(f"{where}: must be a mapping with id and channel")
            continue
        channel = raw.get("channel")
        if channel is None:  # `chanel: telegram`: the key that is there is the problem
            misspelt = [k for k in raw if isinstance(k, str) and near_key(k, ["channel"])]
            if misspelt:
                problems.append(f"{where}.{misspelt[0]}: unknown key; did you mean channel?")
                continue
        if not isinstance(channel, str) or channel not in known_channels():
            problem = "required" if channel is None else f"unknown channel {channel!r}"
            problems.append(
                f"{where}.channel: {problem}; known channels: {', '.join(sorted(known_channels()))}"
            )
            continue
        try:
            connection = connection_model(channel).model_validate(raw)
        except ValidationError as exc:
            problems.extend(format_errors(exc, where, connection_model(channel)))
            continue
        clash = _id_clash(connection.id, (c.id for c in connections))
        if clash is not None:  # named here, where the index is known
            problems.append(f"{where}.id: {clash}")
            continue
        connections.append(connection)
    try:
        config = BridgeConfig.model_validate(
            {**data, "connections": connections, "base_dir": base_dir or Path(".")}
        )
    except ValidationError as exc:
        problems.extend(format_errors(exc, model=BridgeConfig))
        config = None
    if problems or config is None:
        raise ConfigError(secrets.redact(invalid_config(problems, source)))
    for conn in config.connections:
        for value in conn.secret_values():
            secrets.add(value)
    for token in config.webchat.tokens:
        secrets.add(token.get_secret_value())
    if config.webchat.issuer is not None:
        secrets.add(config.webchat.issuer.secret.get_secret_value())
    for spec in config.agents.definitions.values():
        if spec.api_key is not None:
            secrets.add(spec.api_key.get_secret_value())
    return config, secrets


_STORE_FILE_PARAMS = frozenset({"ssl_ca_certs", "ssl_ca_path", "ssl_certfile", "ssl_keyfile"})
"""Query parameters of a `rediss://` store URL that name files: redis-py opens them from the
working directory at the first connection."""


def _anchor_store_paths(config: BridgeConfig) -> BridgeConfig:
    """Every relative path in the store URL is relative to the config file (like hook folders
    and secret files): a SQLite file, and a `rediss://` URL's certificate files. So the same
    config finds the same files whatever directory the bridge is started from."""
    store, base = config.store, config.base_dir
    prefix = "sqlite:///"
    if store.startswith(prefix):
        path = store[len(prefix) :]
        if not path or path == ":memory:" or path.startswith("/"):
            return config
        file = (base / Path(path).expanduser()).resolve()
        return config.model_copy(update={"store": prefix + str(file)})
    where, question, query = store.partition("?")
    if not question or not store.lower().startswith(("redis://", "rediss://")):
        return config
    query, hash_, fragment = query.partition("#")
    params = []
    for param in re.split(r"([&;])", query):
        name, equals, value = param.partition("=")
        if equals and name in _STORE_FILE_PARAMS and value:
            file = base / Path(unquote(value)).expanduser()
            param = f"{name}={quote(str(file.resolve()), safe='/')}"
        params.append(param)
    anchored = f"{where}{question}{''.join(params)}{hash_}{fragment}"
    return config.model_copy(update={"store": anchored})


def load_config(
    path: str | Path | None, *, only: tuple[str, ...] | None = None
) -> tuple[BridgeConfig, Secrets]:
    """Load a YAML file; None (or an absent default file) gives the embedded default.

    `only`: validate just these top-level keys (see `parse_config`)."""
    if path is None:
        default = Path("talkbridge.yaml")
        if not default.exists():
            return parse_config({}, Path.cwd())
        path = default
    if not str(path).strip():
        raise ConfigError("the config file path is empty")
    file = Path(path)
    data = read_yaml(file, "cannot read config file")
    config, secrets = parse_config(data, file.resolve().parent, source=str(file), only=only)
    return _anchor_store_paths(config), secrets


def read_yaml(file: Path, what: str) -> Any:
    """A YAML file's data, or a `ConfigError` naming the file and why (`what`: how to say it
    could not be read), with the line and column of a syntax error."""
    return _parse_yaml(_read_text(file, what), file)


def _read_text(file: Path, what: str) -> str:
    """The UTF-8 text of `file`, or a `ConfigError` starting with `what` saying why not."""
    try:
        return file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{what} {file}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{what} {file}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset "
            f"{exc.start}); save it as UTF-8"
        ) from None


class _UniqueKeyLoader(yaml.SafeLoader):
    """A key given twice in one mapping is an error: YAML's rule, which PyYAML does not enforce,
    silently keeping the last (a second `connections:` pasted in would drop the first's)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"key {key!r} appears twice in this mapping; keep one",
                    key_node.start_mark,
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _load_yaml(text: str) -> Any:
    """`yaml.safe_load` that refuses a key given twice."""
    return yaml.load(text, Loader=_UniqueKeyLoader)


def _parse_yaml(text: str, file: Path) -> Any:
    try:
        return _load_yaml(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "not valid YAML"
        lines = text.splitlines()
        bad_line = lines[mark.line] if mark is not None and mark.line < len(lines) else ""
        hint = (
            ' (inside {...} a ${NAME} reference must be quoted: "${NAME}")'
            if "${" in bad_line
            else ""
        )
        raise ConfigError(f"{file}{where}: {problem}{hint}") from None
