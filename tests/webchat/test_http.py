"""The plain-HTTP side of the webchat port: the page, its assets, /healthz and the refusals."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
import websockets
from websockets.datastructures import Headers
from websockets.http11 import Request

from talkbridge.webchat.routes import HttpRoutes, health_status, load_assets, tokens_match
from tests.webchat.conftest import TIMEOUT, TOKEN_A, TOKEN_B, Webchat


async def _get(url: str) -> tuple[int, dict[str, str], str]:
    async with aiohttp.ClientSession() as http, http.get(url) as resp:
        return resp.status, dict(resp.headers), await resp.text()


@pytest.mark.parametrize(
    ("query", "says"),
    [("", "has no access token"), ("?token=nope", "not valid"), ("?token=", "no access token")],
)
async def test_the_page_without_a_valid_token_is_a_clear_401(
    webchat: Webchat, query: str, says: str
) -> None:
    status, headers, body = await _get(f"{webchat.http}/{query}")
    assert status == 401
    assert headers["Content-Type"].startswith("text/html")
    assert says in body and "talkbridge run" in body
    assert "nope" not in body  # nothing from the request is echoed back
    assert TOKEN_A not in body


@pytest.mark.parametrize("token", [TOKEN_A, TOKEN_B])
async def test_the_page_with_a_valid_token(webchat: Webchat, token: str) -> None:
    status, headers, body = await _get(f"{webchat.http}/?token={quote(token)}")
    assert status == 200 and "<title>talkbridge</title>" in body
    assert token not in body  # the page reads it from its URL; it is never baked in
    assert "script-src 'self'" in headers["Content-Security-Policy"]
    assert headers["Referrer-Policy"] == "no-referrer" and headers["Cache-Control"] == "no-store"


async def test_static_assets_are_served_without_a_token(webchat: Webchat) -> None:
    for name, kind in [
        ("app.js", "text/javascript"),
        ("markdown.js", "text/javascript"),
        ("style.css", "text/css"),
        ("favicon.svg", "image/svg+xml"),
    ]:
        status, headers, body = await _get(f"{webchat.http}/static/{name}")
        assert status == 200 and headers["Content-Type"].startswith(kind), name
        assert body
    # Only files of the package's table, never a path into the file system.
    for path in ("/static/../connector.py", "/static/%2e%2e/connector.py", "/static/nope.js"):
        status, _, _ = await _get(f"{webchat.http}{path}")
        assert status == 404, path


async def test_healthz_shows_states_and_no_secret(webchat: Webchat) -> None:
    status, headers, body = await _get(f"{webchat.http}/healthz")
    assert status == 200 and headers["Content-Type"] == "application/json"
    assert json.loads(body) == {
        "status": "ok",
        "connections": {"webchat": {"state": "up", "error": None}},
    }
    webchat.health["support-bot"] = {"state": "down", "error": "token rejected"}
    _, _, body = await _get(f"{webchat.http}/healthz")
    data = json.loads(body)
    assert data["status"] == "degraded" and data["connections"]["support-bot"]["state"] == "down"
    assert TOKEN_A not in body and TOKEN_B not in body


async def test_unknown_paths_are_404(webchat: Webchat) -> None:
    status, _, _ = await _get(f"{webchat.http}/admin")
    assert status == 404
    # The page is only at / (with a token): not as a static file.
    status, _, body = await _get(f"{webchat.http}/static/index.html")
    assert status == 404 and "<title>talkbridge</title>" not in body


@pytest.mark.parametrize(
    ("proxy_headers", "secure"),
    [
        ({}, False),  # plain http://127.0.0.1: a Secure cookie would not be kept
        ({"X-Forwarded-Proto": "https"}, True),
        ({"X-Forwarded-Proto": "https, http"}, True),  # the proxy nearest the browser first
        ({"X-Forwarded-Proto": "http"}, False),
        ({"Forwarded": 'for=192.0.2.60;proto="https";by=203.0.113.43'}, True),
    ],
)
async def test_the_token_cookie_is_secure_behind_an_https_proxy(
    webchat: Webchat, proxy_headers: dict[str, str], secure: bool
) -> None:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{webchat.http}/?token={quote(TOKEN_A)}", headers=proxy_headers) as resp,
    ):
        assert resp.status == 200
        flags = [part.strip() for part in resp.headers["Set-Cookie"].split(";")]
        assert ("Secure" in flags) is secure and "HttpOnly" in flags


async def test_the_link_leaves_a_cookie_so_the_plain_address_opens_the_page(
    webchat: Webchat,
) -> None:
    jar = aiohttp.CookieJar(unsafe=True)  # keep cookies of an IP address, as browsers do
    async with aiohttp.ClientSession(cookie_jar=jar) as http:
        async with http.get(f"{webchat.http}/") as resp:
            assert resp.status == 401  # no link visited yet
            page = await resp.text()
            assert "/static/saved-token.js" in page  # a page that saved the token retries
        async with http.get(f"{webchat.http}/?token={quote(TOKEN_A)}") as resp:
            assert resp.status == 200
            cookie = resp.headers["Set-Cookie"]
            # One cookie per port: two bridges on one machine keep their own.
            assert cookie.startswith(f"talkbridge_token_{webchat.port}=")
            assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
        async with http.get(f"{webchat.http}/") as resp:  # a reload without ?token=
            assert resp.status == 200 and "<title>talkbridge</title>" in await resp.text()
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
        http.cookie_jar.update_cookies({f"talkbridge_token_{webchat.port}": "stale"})
        async with http.get(f"{webchat.http}/") as resp:  # a token no longer accepted
            page = await resp.text()
            assert resp.status == 401 and "saved from the link you opened before" in page
            assert "/static/saved-token.js" not in page  # the saved token is likely this one
        async with http.get(f"{webchat.http}/?token=wrong") as resp:
            assert "/static/saved-token.js" not in await resp.text()  # no retry of a refusal


async def test_the_page_socket_logs_in_with_the_links_cookie(webchat: Webchat) -> None:
    cookie = {"Cookie": f"talkbridge_token_{webchat.port}={quote(TOKEN_A)}"}
    page = {**cookie, "Origin": webchat.http}  # a browser's socket says which page opened it
    async with websockets.connect(webchat.ws_url, additional_headers=page) as ws:
        await ws.send(json.dumps({"type": "auth"}))  # no token of its own
        assert json.loads(await ws.recv())["type"] == "ready"
    # A client that sends no Origin is no browser: the protocol doc has it give the token.
    async with websockets.connect(webchat.ws_url, additional_headers=cookie) as ws:
        await ws.send(json.dumps({"type": "auth", "ref": "a"}))
        error = json.loads(await ws.recv())
        assert error["code"] == "unauthorized" and error["ref"] == "a"
        assert "sent no Origin" in error["message"] and "auth frame" in error["message"]
    async with websockets.connect(webchat.ws_url) as ws:  # neither: refused, saying why
        await ws.send(json.dumps({"type": "auth"}))
        error = json.loads(await ws.recv())
        assert error["code"] == "unauthorized" and "no token" in error["message"]


@pytest.mark.parametrize(
    "other",
    ['prefs={"theme":"dark"}', "name=Ada Lovelace", "city=Zürich", 'q="open'],
)
async def test_another_sites_odd_cookie_does_not_hide_the_token_cookie(
    webchat: Webchat, other: str
) -> None:
    # Every port of a host shares its cookies: another app's (JSON, spaces, non-ASCII, as
    # browsers keep them) comes first in the header, and the token cookie was not read at all.
    cookie = f"{other}; talkbridge_token_{webchat.port}={quote(TOKEN_A)}".encode()
    headers = {"Cookie": cookie.decode("latin-1")}
    async with aiohttp.ClientSession() as http, http.get(f"{webchat.http}/", headers=headers) as r:
        assert r.status == 200 and "<title>talkbridge</title>" in await r.text()
    page = {**headers, "Origin": webchat.http}
    async with websockets.connect(webchat.ws_url, additional_headers=page) as ws:
        await ws.send(json.dumps({"type": "auth"}))
        assert json.loads(await ws.recv())["type"] == "ready"


@pytest.mark.parametrize(
    ("origin", "accepted"),
    [
        ("http://127.0.0.1:{port}", True),  # the page itself
        ("http://127.0.0.1:{other}", False),  # another port of the host: same site to cookies
        ("http://evil.example", False),
        ("null", False),  # a sandboxed frame or a file
        ("http://127.0.0.1:x", False),
        ("http://[::1", False),  # not a URL at all
    ],
)
async def test_the_cookie_logs_in_only_a_socket_of_the_servers_own_page(
    webchat: Webchat, origin: str, accepted: bool
) -> None:
    headers = {
        "Cookie": f"talkbridge_token_{webchat.port}={quote(TOKEN_A)}",
        "Origin": origin.format(port=webchat.port, other=webchat.port + 1),
    }
    async with websockets.connect(webchat.ws_url, additional_headers=headers) as ws:
        await ws.send(json.dumps({"type": "auth", "ref": "a"}))
        reply = json.loads(await ws.recv())
        if accepted:
            assert reply["type"] == "ready"
        else:
            assert reply["code"] == "unauthorized" and reply["ref"] == "a"
            assert "only for this server's own page" in reply["message"]
    # Another site's page that was given the token may use it: the token is the credential.
    async with websockets.connect(webchat.ws_url, additional_headers=headers) as ws:
        await ws.send(json.dumps({"type": "auth", "token": TOKEN_A}))
        assert json.loads(await ws.recv())["type"] == "ready"


async def test_methods_other_than_get_and_head_are_405(webchat: Webchat) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.head(f"{webchat.http}/healthz") as resp:
            assert resp.status == 200 and int(resp.headers["Content-Length"]) > 0
            assert await resp.read() == b""
        for method in ("POST", "PUT", "DELETE", "OPTIONS"):
            async with http.request(method, f"{webchat.http}/healthz") as resp:
                assert resp.status == 405, method
                assert resp.headers["Allow"] == "GET, HEAD"


HANDSHAKE = {
    "Connection": "Upgrade",
    "Upgrade": "websocket",
    "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
    "Sec-WebSocket-Version": "13",
}


@pytest.mark.parametrize(
    ("path", "headers"),
    [
        ("/ws", {}),  # a health checker probing the socket's path: 426, like GET
        ("/ws?x=1", {"Connection": "Upgrade"}),
        ("/ws", {"Connection": "Upgrade", "Upgrade": "websocket"}),  # no key: 400, like GET
        ("/healthz", {}),
        ("/", {}),
        (f"/?token={quote(TOKEN_A)}", {}),
        ("/static/app.js", {}),
        ("/nope", {}),
    ],
)
async def test_head_answers_as_get_does_without_the_body(
    webchat: Webchat, path: str, headers: dict[str, str]
) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{webchat.http}{path}", headers=headers) as get:
            body = await get.read()
        async with http.head(f"{webchat.http}{path}", headers=headers) as head:
            assert await head.read() == b""
    assert head.status == get.status, (path, head.status, get.status)
    for name in ("Content-Type", "Content-Length", "Upgrade", "Allow", "Set-Cookie"):
        assert head.headers.get(name) == get.headers.get(name), (path, name)
    assert int(head.headers["Content-Length"]) == len(body) > 0


async def test_head_with_a_whole_handshake_opens_no_socket(webchat: Webchat) -> None:
    async with (
        aiohttp.ClientSession() as http,
        http.head(f"{webchat.http}/ws", headers=HANDSHAKE) as head,
    ):
        assert head.status == 400 and "Sec-WebSocket-Accept" not in head.headers
        assert await head.read() == b""
    assert webchat.connector.socket_count() == 0


async def _raw(
    webchat: Webchat, *pieces: bytes, half_close: bool = False
) -> tuple[int, dict[str, str], bytes]:
    """Send a request exactly as given (in these pieces) and read the answer to its end."""
    reader, writer = await asyncio.open_connection("127.0.0.1", webchat.port)
    try:
        for piece in pieces:
            writer.write(piece)
            await writer.drain()
        if half_close:
            writer.write_eof()
        answer = await asyncio.wait_for(reader.read(), TIMEOUT)
    finally:
        writer.close()
    assert answer, "the connection was closed without an answer"
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines)
    assert int(headers["Content-Length"]) == len(body) or pieces[0].startswith(b"HEAD ")
    return int(status_line.split()[1]), headers, body


@pytest.mark.parametrize(
    ("request_bytes", "status", "says"),
    [
        (b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhello", 405, b"only GET"),
        (b"POST /ws HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\n{}", 405, b"only GET"),
        (
            b"PUT /healthz HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"5\r\nhello\r\n0\r\n\r\n",
            405,
            b"no request body is read",
        ),
        (b"GET /healthz HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\nhi", 400, b"no body"),
        (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 505, b"only HTTP/1.1"),
        (b"GET /healthz HTTP/1.1\nHost: h\n\n", 400, b"must end with CRLF"),
        ("GET /caf\u00e9 HTTP/1.1\r\nHost: h\r\n\r\n".encode(), 400, b"must be ASCII"),
        (b"GET /healthz HTTP/1.1\r\nno colon here\r\n\r\n", 400, b"METHOD /path HTTP/1.1"),
        (b"GET /" + b"x" * 9000 + b" HTTP/1.1\r\n\r\n", 414, b"too long"),
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(32), 400, b"not TLS"),
    ],
    ids=[
        "post-body",
        "post-ws-body",
        "put-chunked",
        "get-body",
        "http2",
        "lf-only",
        "non-ascii",
        "bad-header",
        "long-line",
        "tls-hello",  # https:// to this plain port: it waited for a line until open_timeout
    ],
)
async def test_a_request_websockets_cannot_read_gets_a_clear_answer(
    webchat: Webchat, request_bytes: bytes, status: int, says: bytes
) -> None:
    """websockets' parser reads no body and closes the connection without a word on what it
    cannot read: curl said "Empty reply from server", a proxy would say 502."""
    got, headers, body = await _raw(webchat, request_bytes)
    assert (got, headers["Content-Type"]) == (status, "text/plain; charset=utf-8"), body
    assert says in body and headers["Connection"] == "close"
    if status == 405:
        assert headers["Allow"] == "GET, HEAD"
    assert b"hello" not in body and b"caf" not in body  # nothing of the request comes back


async def test_a_refused_body_is_answered_whether_sent_in_pieces_large_or_on_head(
    webchat: Webchat,
) -> None:
    head = b"POST /healthz HTTP/1.1\r\nHost: h\r\nContent-Length: 11\r\n\r\n"
    pieces = [head[i : i + 7] for i in range(0, len(head), 7)]
    status, _, _ = await _raw(webchat, *pieces, b"hello", b" world")
    assert status == 405
    status, headers, body = await _raw(
        webchat, b"HEAD / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc"
    )
    assert status == 400 and body == b"" and int(headers["Content-Length"]) > 0
    # A real client with a real body: read to its end, then answered (no reset loses it).
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"{webchat.http}/?token={quote(TOKEN_A)}", data=io.BytesIO(b"x" * (4 << 20))
        ) as resp,
    ):
        assert resp.status == 405 and resp.headers["Allow"] == "GET, HEAD"
        assert "no request body is read" in await resp.text()


async def test_a_client_that_half_closes_after_its_request_still_gets_the_answer(
    webchat: Webchat,
) -> None:
    """`socat`, `nc -N` or a script's `shutdown(SHUT_WR)` end their side once the request is out:
    websockets closed the connection before the answer went back."""
    status, _, body = await _raw(webchat, b"GET /healthz HTTP/1.0\r\n\r\n", half_close=True)
    assert status == 200 and json.loads(body)["status"] == "ok"
    status, _, _ = await _raw(webchat, b"GET /ws HTTP/1.1\r\nHost: h\r\n\r\n", half_close=True)
    assert status == 426


async def test_pipelined_requests_get_the_first_ones_answer(webchat: Webchat) -> None:
    """An HTTP/1.1 client may send its next request before the first is answered (pipelining):
    websockets read the bytes after the head as WebSocket frames, failed on them and closed the
    connection without a word. The first request is answered and the connection closed (every
    answer closes it); the next one is read as nothing."""
    request = b"GET /healthz HTTP/1.1\r\nHost: h\r\n\r\n"
    status, _, body = await _raw(webchat, request + request)
    assert status == 200 and json.loads(body)["status"] == "ok"
    status, _, body = await _raw(webchat, request + b"HEAD / HTTP/1.1\r\n\r\n", half_close=True)
    assert status == 200 and json.loads(body)["status"] == "ok"
    client = await webchat.authed()  # a socket still opens, with its frames right behind
    frames = await client.turn("after", "c1")
    assert frames[-1]["text"] == "echo: after"


async def test_a_request_in_small_pieces_still_opens_the_socket(webchat: Webchat) -> None:
    """The head is read ahead of websockets on a copy: what it can read reaches it intact."""
    status, _, _ = await _raw(webchat, *(bytes([b]) for b in b"GET /healthz HTTP/1.1\r\n\r\n"))
    assert status == 200
    client = await webchat.authed()
    frames = await client.turn("whole", "c1")
    assert frames[-1]["text"] == "echo: whole"


async def test_a_header_sent_twice_is_read_not_a_500(webchat: Webchat) -> None:
    """A repeated header made `Headers.get` raise: a 500 with a traceback in the log for the
    page, and a failed socket handler for the cookie login."""
    token_cookie = f"talkbridge_token_{webchat.port}={quote(TOKEN_A)}"
    host = f"Host: 127.0.0.1:{webchat.port}\r\n".encode()
    # RFC 9113: HTTP/2 sends each cookie on a line of its own; a proxy may pass them on so.
    twice = host + f"Cookie: theme=dark\r\nCookie: {token_cookie}\r\n".encode()
    status, _, body = await _raw(webchat, b"GET / HTTP/1.1\r\n" + twice + b"\r\n")
    assert status == 200 and b"<title>talkbridge</title>" in body
    status, _, _ = await _raw(
        webchat, b"GET /healthz HTTP/1.1\r\nUpgrade: h2c\r\nUpgrade: x\r\n\r\n"
    )
    assert status == 200
    status, _, body = await _raw(webchat, b"GET /healthz HTTP/1.1\r\n" + host * 2 + b"\r\n")
    assert status == 400 and b"more than one Host header" in body  # RFC 9112 3.2
    page = f"http://127.0.0.1:{webchat.port}"
    logins: list[tuple[list[tuple[str, str]], str]] = [
        ([("Cookie", "theme=dark"), ("Cookie", token_cookie), ("Origin", page)], "ready"),
        (
            [
                ("Cookie", token_cookie),
                ("Origin", "https://chat.example"),
                ("X-Forwarded-Host", "edge.example"),  # a chain of proxies, a line each
                ("X-Forwarded-Host", "chat.example:443"),
            ],
            "ready",
        ),
        (
            [
                ("Cookie", token_cookie),
                ("Origin", "https://evil.example"),
                ("X-Forwarded-Host", "edge.example"),
                ("X-Forwarded-Host", "chat.example:443"),
            ],
            "error",
        ),
    ]
    for headers, answer in logins:
        async with websockets.connect(webchat.ws_url, additional_headers=headers) as ws:
            await ws.send(json.dumps({"type": "auth"}))
            reply = json.loads(await ws.recv())
        assert reply["type"] == answer, (headers, reply)
        if answer == "error":
            assert reply["code"] == "unauthorized" and "own page" in reply["message"]


async def test_a_websocket_upgrade_elsewhere_than_ws_is_refused(webchat: Webchat) -> None:
    async with aiohttp.ClientSession() as http:
        for path in ("/healthz", "/static/app.js", f"/?token={quote(TOKEN_A)}"):
            with pytest.raises(aiohttp.WSServerHandshakeError) as err:
                await http.ws_connect(f"{webchat.http}{path}")
            assert err.value.status == 404, path


def test_token_comparison_and_health_rules() -> None:
    assert tokens_match("b", ["a", "b"]) and not tokens_match("c", ["a", "b"])
    assert not tokens_match("", ["a"]) and not tokens_match("é", ["e"])
    assert health_status({}) == "ok"
    assert health_status({"a": {"state": "up"}, "b": {"state": "degraded"}}) == "degraded"
    assert health_status({"a": "up"}) == "ok"
    assert {"index.html", "app.js", "markdown.js", "style.css"} <= set(load_assets())


def test_healthz_is_503_while_the_bridge_is_stopping() -> None:

    stopping = {"stopping": False}
    routes = HttpRoutes(
        ["t0ken"], lambda: {"webchat": {"state": "up"}}, node_info=lambda: dict(stopping)
    )
    ask = Request("/healthz", Headers())
    response = routes(None, ask)  # type: ignore[arg-type]
    assert response is not None and response.status_code == 200
    stopping["stopping"] = True
    response = routes(None, ask)  # type: ignore[arg-type]
    assert response is not None and response.status_code == 503  # load balancers move on
    assert json.loads(response.body)["status"] == "stopping"


def test_a_health_check_that_fails_says_unknown_and_logs_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A bug in the health check must not pass in silence: the answer cannot tell, the
    operator's log says why."""

    def broken() -> dict[str, Any]:
        raise KeyError("webchat")

    routes = HttpRoutes(["t0ken"], broken)
    with caplog.at_level(logging.ERROR, logger="talkbridge.webchat"):
        response = routes(None, Request("/healthz", Headers()))  # type: ignore[arg-type]
    assert response is not None and response.status_code == 200
    assert json.loads(response.body) == {"status": "unknown", "connections": {}}
    [record] = [r for r in caplog.records if "/healthz" in r.getMessage()]
    assert "health check failed" in record.getMessage() and record.exc_info is not None
