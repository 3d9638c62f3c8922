"""What Discord's REST API answered, seen through aiohttp's request tracing.

discord.py hides two things an error message needs. It retries a 500, 502, 504 or 524 by
itself, five times over about 25 s, saying nothing: a `check` whose time runs out meanwhile
could only say "no answer". And it reads an answer's JSON straight into its models, so JSON of
the wrong shape meets it as a TypeError, KeyError or ValueError that names no request. The
client's documented `http_trace` option (an `aiohttp.TraceConfig`) shows each request start and
each answer's status as they go by, without touching discord.py: enough to say which request
got which answer.

Requests are told apart only by order: read `last` and `server_error` around calls made one at
a time (logging in, `check`), not while sends run alongside.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace

import aiohttp
import yarl

from talkbridge.connectors.boundary import scrub
from talkbridge.connectors.discord.ratelimit import GlobalLimit
from talkbridge.connectors.discord.sdk import discord
from talkbridge.errors import TransientError

_WHAT = {
    "/users/@me": "a user object",
    "/oauth2/applications/@me": "an application object",
    "/users/@me/guilds": "a list of servers",
}
"""What the answers to the requests of logging in and `check` hold, as an error names it."""


@dataclass(frozen=True, slots=True)
class Answer:
    method: str
    route: str
    """The path under `api_base`, e.g. `/users/@me`."""
    status: int
    reason: str

    @property
    def request(self) -> str:
        return f"{self.method} {self.route}"

    @property
    def http(self) -> str:
        return f"HTTP {self.status} {self.reason}".rstrip()

    @property
    def server_side(self) -> bool:
        return self.status >= 500


class Answers:
    """The last answer Discord gave, and the server error discord.py is retrying, if any."""

    def __init__(self, token: str, global_limit: GlobalLimit | None = None) -> None:
        self._token = token
        self.global_limit = global_limit
        """Told of every answer: it keeps the global 429s discord.py hands back."""
        self.last: Answer | None = None
        """The answer to the latest request; None while a request is on its way."""
        self.server_error: Answer | None = None
        """The latest 5xx, until an answer that is not one: what discord.py is retrying."""
        self.server_errors = 0
        """How many 5xx in a row."""
        self.on_server_error: Callable[[str], None] | None = None
        """Called with `describe_server_error()` on each 5xx."""

    def trace(self) -> aiohttp.TraceConfig:
        """For discord.py's `http_trace`: one per client."""
        config = aiohttp.TraceConfig()
        config.on_request_start.append(self._started)
        config.on_request_end.append(self._ended)
        return config

    def forget(self) -> None:
        """Start reading afresh: what failed next is read against later answers only."""
        self.last = None

    async def _started(
        self,
        session: aiohttp.ClientSession,
        context: SimpleNamespace,
        params: aiohttp.TraceRequestStartParams,
    ) -> None:
        self.last = None

    async def _ended(
        self,
        session: aiohttp.ClientSession,
        context: SimpleNamespace,
        params: aiohttp.TraceRequestEndParams,
    ) -> None:
        response = params.response
        if self.global_limit is not None:
            self.global_limit.answered(response.status, response.headers)
        answer = Answer(params.method, _route(params.url), response.status, response.reason or "")
        self.last = answer
        if not answer.server_side:
            self.server_error, self.server_errors = None, 0
            return
        self.server_error = answer
        self.server_errors += 1
        if self.on_server_error is not None:
            self.on_server_error(self._described(answer))

    def describe_server_error(self) -> str | None:
        """The 5xx being retried in plain words, e.g. `Discord answered GET /users/@me with
        HTTP 500 Internal Server Error (2 times in a row): a server-side error, transient`."""
        return None if self.server_error is None else self._described(self.server_error)

    def _described(self, answer: Answer) -> str:
        times = f" ({self.server_errors} times in a row)" if self.server_errors > 1 else ""
        text = (
            f"Discord answered {answer.request} with {answer.http}{times}: "
            "a server-side error, transient"
        )
        return scrub(text, self._token)

    def unreadable(self, exc: Exception) -> TransientError | None:
        """The error for `exc`, raised by discord.py reading the latest answer into its models;
        None when no answer came since the last request started (`exc` is not about one).

        A TransientError, as `not_the_api` gives: Discord's API does not answer a request with
        JSON of another shape, so the answer came from something else at `api_base` (a proxy
        in trouble, a service that is not Discord's); nothing is wrong with the credentials,
        and such a thing may answer properly later. `check` never retries, so the class only
        decides `run`: it tries again with backoff, saying why each time.
        """
        answer = self.last
        if answer is None:
            return None
        if isinstance(exc, UnicodeDecodeError):
            what = "a body that is not UTF-8 text"
        elif isinstance(exc, json.JSONDecodeError):
            what = "a body that is not JSON"
        else:
            noun = _WHAT.get(answer.route)
            what = f"JSON that is not {noun}" if noun else "JSON of a shape discord.py cannot read"
            if isinstance(exc, KeyError) and exc.args and isinstance(exc.args[0], str):
                what += f" (it has no {exc.args[0]!r})"  # other errors speak of Python, not JSON
        status = "" if 200 <= answer.status < 300 else f"{answer.http} and "
        text = f"Discord answered {answer.request} with {status}{what}: is api_base its API?"
        return TransientError(scrub(text, self._token))


def _route(url: yarl.URL) -> str:
    """The path of `url` under discord.py's REST base (the whole path when not under it)."""
    base = yarl.URL(discord.http.Route.BASE).path.rstrip("/")
    path = url.path
    return path[len(base) :] if base and path.startswith(base + "/") else path
