"""The plain-HTTP side of the webchat port: the page, its assets, `/healthz` and the 401 page.

websockets calls `HttpRoutes.__call__` (its `process_request` hook) for every request; returning
None lets the `/ws` handshake go on. Assets are read from the package once, at start, and served
from a fixed table, so no request path ever reaches the file system.
"""

from __future__ import annotations

import dataclasses
import email.utils
import hmac
import html
import http
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

from websockets.asyncio.server import ServerConnection
from websockets.datastructures import Headers
from websockets.http11 import Request, Response

from talkbridge.webchat.auth import TokenAuth

WS_PATH = "/ws"
ALLOWED_METHODS = ("GET", "HEAD")
TOKEN_COOKIE_AGE = 30 * 24 * 3600
_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".ico": "image/x-icon",
}
# The page runs only its own script and talks only to its own origin; even if a message ever
# slipped HTML past the renderer, an inline handler or a foreign script would not run.
_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)

log = logging.getLogger("talkbridge.webchat")


@dataclass(frozen=True, slots=True)
class Asset:
    body: bytes
    content_type: str


def load_assets() -> dict[str, Asset]:
    """Every file of `talkbridge/webchat/static`, keyed by its name."""
    assets: dict[str, Asset] = {}
    for item in resources.files("talkbridge.webchat").joinpath("static").iterdir():
        suffix = "." + item.name.rpartition(".")[2]
        if item.is_file() and suffix in _TYPES:
            assets[item.name] = Asset(item.read_bytes(), _TYPES[suffix])
    return assets


def header(headers: Headers, name: str, joiner: str = ", ") -> str:
    """A header's value, '' when absent, its lines joined when it came more than once
    (`headers.get` raises then: a 500, or a socket's handler failing, with a traceback logged
    for any client that repeats a header)."""
    return joiner.join(headers.get_all(name))


def token_cookie_name(headers: Headers) -> str:
    """One cookie per port: browsers share a host's cookies across ports, and two bridges on
    one machine must not overwrite each other's."""
    port = header(headers, "Host").rpartition(":")[2]
    return f"talkbridge_token_{port}" if port.isdigit() else "talkbridge_token"


def cookie_token(headers: Headers) -> str:
    """The token a visit of the link left in this port's cookie ('' when none).

    Read pair by pair, not with `SimpleCookie`: every port of a host shares its cookies, and
    at the first one it cannot parse (another app's JSON value, a space, an accented letter,
    all of which browsers keep) it stops, so the token cookie after it went unseen.
    """
    name = token_cookie_name(headers)
    # Several Cookie lines are one list (RFC 9113: HTTP/2 sends each cookie on its own).
    for pair in header(headers, "Cookie", "; ").split(";"):
        key, equals, value = pair.partition("=")
        if equals and key.strip() == name:
            return unquote(value.strip())
    return ""


def cookie_refusal(headers: Headers) -> str | None:
    """Why the token cookie may not log this socket in, or None when it may: it is for the
    server's own page only, whose socket says so in its `Origin` (every browser sends one).

    The cookie goes with every socket a browser opens to this host, whichever page opens it,
    and `SameSite` does not tell ports apart: without this, a page on another port of the same
    host could chat (and read history) as the cookie's holder. A client without `Origin` is
    not a browser: it gives the token in its auth frame, as the protocol doc says.
    """
    if not headers.get_all("Origin"):
        return (
            "the token cookie is only for this server's own page, and this socket sent no "
            "Origin (a browser always does): give the token in the auth frame"
        )
    foreign = foreign_origin(headers)
    if foreign is None:
        return None
    return (
        f"the token cookie is only for this server's own page, not for {foreign}: "
        "give the token in the auth frame"
    )


def foreign_origin(headers: Headers) -> str | None:
    """The `Origin` of a socket (one is required) opened by another site's page, else None."""
    origin = header(headers, "Origin")  # websockets refuses a handshake with two (400)
    # Proxies in a chain may each add an X-Forwarded-Host line rather than extend the one.
    named = [header(headers, "Host"), *header(headers, "X-Forwarded-Host").split(",")]
    hosts = {h.strip().lower() for h in named if h.strip()}
    try:
        parts = urlsplit(origin)
        port = parts.port
    except ValueError:  # `http://[::1`, or not a port: no page of ours
        return origin[:200]
    netloc = parts.netloc.lower()
    default = {"http": 80, "https": 443}.get(parts.scheme)
    if netloc in hosts or (port is None and f"{netloc}:{default}" in hosts):
        return None
    return origin[:200]


def came_over_https(headers: Headers) -> bool:
    """Whether the reverse proxy in front says the browser came over HTTPS: its
    `X-Forwarded-Proto` (Caddy and Traefik set it, nginx with `proxy_set_header`), else RFC 7239
    `Forwarded: proto=https`. The first value is the one the proxy nearest the browser set.
    A client that claims it falsely only gets a cookie its own browser keeps for HTTPS."""
    proto = header(headers, "X-Forwarded-Proto").split(",")[0].strip().lower()
    if proto:
        return proto == "https"
    for pair in header(headers, "Forwarded").split(",")[0].split(";"):
        key, _, value = pair.partition("=")
        if key.strip().lower() == "proto":
            return value.strip().strip('"').lower() == "https"
    return False


def tokens_match(presented: str, tokens: Sequence[str]) -> bool:
    """Constant-time check against every accepted token (no early exit on a match)."""
    given = presented.encode("utf-8")
    found = False
    for token in tokens:
        found |= hmac.compare_digest(given, token.encode("utf-8"))
    return found


def health_status(connections: dict[str, Any], store: Any = None, stopping: bool = False) -> str:
    """`ok` when the store (if reported) and every connection are `up` (a connection may also be
    `standby` while another node owns it, in distributed mode), else `degraded`; `stopping`
    while the bridge finishes its turns before it exits."""
    if stopping:
        return "stopping"
    if isinstance(store, dict) and store.get("state") != "up":
        return "degraded"
    for value in connections.values():
        state = value.get("state") if isinstance(value, dict) else value
        if state == "standby" and isinstance(value, dict) and value.get("owner"):
            continue
        if state != "up":
            return "degraded"
    return "ok"


class HttpRoutes:
    def __init__(
        self,
        tokens: Sequence[str] | TokenAuth,
        health: Callable[[], dict[str, Any]],
        assets: dict[str, Asset] | None = None,
        *,
        node_info: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        self._auth = tokens if isinstance(tokens, TokenAuth) else TokenAuth(tokens)
        self._health = health
        self._node_info = node_info
        """Distributed mode: this node's id and what it owns, shown by /healthz."""
        self._assets = assets if assets is not None else load_assets()

    def __call__(self, connection: ServerConnection, request: Request) -> Response | None:
        url = urlsplit(request.path)
        if request.method not in ALLOWED_METHODS:
            return method_not_allowed()
        if len(request.headers.get_all("Host")) > 1:  # RFC 9112 §3.2: answered with a 400
            return text_response(400, "the request has more than one Host header\n")
        if url.path == WS_PATH:
            return _head_of_handshake(connection, request) if request.method == "HEAD" else None
        if "websocket" in header(request.headers, "Upgrade").lower():
            return _response(404, f"the socket is at {WS_PATH}\n".encode(), "text/plain")
        response = self._route(url.path, url.query, request.headers)
        return headers_only(response) if request.method == "HEAD" else response

    def _route(self, path: str, query: str, headers: Headers) -> Response:
        if path in ("/", "/index.html"):
            return self._page(query, headers)
        if path == "/healthz":
            return self._healthz()
        if path.startswith("/static/"):
            asset = self._assets.get(path.removeprefix("/static/"))
            if asset is not None and not asset.content_type.startswith("text/html"):
                return _response(200, asset.body, asset.content_type, cache="no-cache")
        if path == "/favicon.ico" and "favicon.svg" in self._assets:
            asset = self._assets["favicon.svg"]
            return _response(200, asset.body, asset.content_type, cache="no-cache")
        return _response(404, b"not found\n", "text/plain; charset=utf-8")

    def _page(self, query: str, headers: Headers) -> Response:
        """The page for a valid token in the link, or in the cookie an earlier visit of the link
        set: the page then takes the token out of the address bar, and the plain address (a
        bookmark, a reload) still opens."""
        token = (parse_qs(query).get("token") or [""])[0]
        from_link = bool(token)
        signed = self._auth.signed_only
        if not from_link:
            token = cookie_token(headers)
            if not token:  # a page that saved the token may still have it: it retries
                return _refusal(
                    "This link has no access token",
                    "The webchat only opens with the full link, which ends in "
                    "<code>?token=…</code>.",
                    signed=signed,
                    retry_saved=True,
                )
        if self._auth.identify(token) is None:
            reason = self._auth.refusal(token)
            expired = "expired" in reason
            title = "This access token has expired" if expired else "This access token is not valid"
            if from_link:
                return _refusal(title, f"{reason[0].upper()}{reason[1:]}.", signed=signed)
            return _refusal(  # the saved token is likely this one: no retry with it
                title,
                "The token saved from the link you opened before is no longer accepted "
                + (
                    "(it has expired: sign in again)."
                    if expired
                    else "(it expired, or the bridge's token was replaced)."
                ),
                signed=signed,
            )
        page = _response(200, self._assets["index.html"].body, "text/html; charset=utf-8")
        if from_link:
            # `Secure` behind HTTPS: else a browser sends the token along with any plain
            # http:// request to this host, which whoever is on the network can make it send.
            secure = "; Secure" if came_over_https(headers) else ""
            page.headers["Set-Cookie"] = (
                f"{token_cookie_name(headers)}={quote(token, safe='')}; Path=/; "
                f"Max-Age={TOKEN_COOKIE_AGE}; HttpOnly; SameSite=Strict{secure}"
            )
        return page

    def _healthz(self) -> Response:
        node: dict[str, Any] = {}
        try:
            connections = self._health()
            if self._node_info is not None:
                node = self._node_info()
            status = health_status(connections, node.get("store"), bool(node.get("stopping")))
        except Exception:  # a bug of ours: the answer says it cannot tell, the log says why
            log.exception("/healthz: the health check failed, answered with status unknown")
            connections, status = {}, "unknown"
        body = json.dumps({"status": status, **node, "connections": connections}, default=str)
        # 503 while stopping: a load balancer's health check takes the node out at once.
        code = 503 if status == "stopping" else 200
        return _response(code, body.encode(), "application/json")


def _head_of_handshake(connection: ServerConnection, request: Request) -> Response:
    """`HEAD /ws` answered as `GET /ws` would be, without the body: websockets refuses any
    method but GET (405, `Allow: GET`), so a health checker probing with HEAD got a status
    that contradicts the 426 a plain GET gets (and our own `Allow: GET, HEAD`)."""
    as_get = connection.protocol.accept(dataclasses.replace(request, method="GET"))
    if as_get.status_code == 101:  # a full handshake: a socket opens only on a GET
        as_get = text_response(
            400, "a WebSocket handshake is a GET request: HEAD opens no socket\n"
        )
    return headers_only(as_get)


def method_not_allowed(more: str = "") -> Response:
    """405 for any method but GET and HEAD, with the `Allow` header RFC 9110 asks for."""
    response = text_response(
        405, f"only GET and HEAD are served here (the chat itself is the WebSocket at /ws){more}\n"
    )
    response.headers["Allow"] = ", ".join(ALLOWED_METHODS)
    return response


def text_response(status: int, text: str) -> Response:
    return _response(status, text.encode(), "text/plain; charset=utf-8")


def headers_only(response: Response) -> Response:
    """The answer to HEAD: the headers GET would get, Content-Length included, no body."""
    return Response(response.status_code, response.reason_phrase, response.headers)


_OPEN_PRINTED_LINK = (
    "Open the URL that <code>talkbridge run</code> printed in its terminal (the line starting "
    "with <code>http://</code>), or ask the person who runs this bridge for a link with a "
    "valid token."
)
_SIGN_IN_AGAIN = (
    "Sign in again on the site that sent you here: it gives you a new link with your access token."
)


def _refusal(
    title: str, reason: str, *, signed: bool = False, retry_saved: bool = False
) -> Response:
    """`retry_saved`: the address had no token; a page that saved one (in localStorage) opens
    the link with it (`saved-token.js`), which sets the cookie again. `signed`: users get
    their links from a site that signs tokens (`webchat.issuer`), not from a terminal."""
    # Both texts are fixed strings of this module; nothing from the request is echoed back.
    script = '<script src="/static/saved-token.js"></script>' if retry_saved else ""
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(title)} · talkbridge</title>
<link rel="stylesheet" href="/static/style.css">{script}</head>
<body class="refusal"><main class="refusal-card" role="alert">
<h1>{html.escape(title)}</h1>
<p>{reason}</p>
<p>{_SIGN_IN_AGAIN if signed else _OPEN_PRINTED_LINK}</p>
</main></body></html>
"""
    return _response(401, page.encode(), "text/html; charset=utf-8")


def _response(status: int, body: bytes, content_type: str, *, cache: str = "no-store") -> Response:
    headers = Headers(
        [
            ("Date", email.utils.formatdate(usegmt=True)),
            ("Content-Type", content_type),
            ("Content-Length", str(len(body))),
            ("Cache-Control", cache),
            ("X-Content-Type-Options", "nosniff"),
            ("Referrer-Policy", "no-referrer"),
            ("Content-Security-Policy", _CSP),
            ("Connection", "close"),
        ]
    )
    return Response(status, http.HTTPStatus(status).phrase, headers, body)
