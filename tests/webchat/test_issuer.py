"""Tokens an issuer signs (JWT, HS256): accepted while valid, sessions follow the user (`sub`)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
import jwt
import pytest
import websockets
from pydantic import SecretStr

from talkbridge.config import WebchatIssuer
from talkbridge.webchat.auth import TokenAuth
from tests.webchat.conftest import StartWebchat

SECRET = "issuer-signing-secret-0123456789abcdef"
ISSUER = WebchatIssuer(secret=SecretStr(SECRET), audience="talkbridge")


def signed(sub: str, *, ttl: int = 300, secret: str = SECRET, **extra: Any) -> str:
    claims = {"sub": sub, "exp": int(time.time()) + ttl, "aud": "talkbridge", **extra}
    return jwt.encode(claims, secret, algorithm="HS256")


def test_identities() -> None:
    auth = TokenAuth(["static-token"], ISSUER)
    assert auth.identify(signed("ada")) == "sub:ada"
    assert auth.identify(signed("ada", ttl=-120)) is None  # expired (beyond the leeway)
    assert auth.identify(signed("ada", secret="x" * 40)) is None  # not our signature
    assert auth.identify(jwt.encode({"sub": "ada"}, SECRET, algorithm="HS256")) is None  # no exp
    wrong_audience = jwt.encode(
        {"sub": "ada", "exp": int(time.time()) + 60, "aud": "other"}, SECRET, algorithm="HS256"
    )
    assert auth.identify(wrong_audience) is None
    assert auth.identify("static-token") not in (None, "sub:static-token")
    assert TokenAuth(["static-token"]).identify(signed("ada")) is None  # no issuer configured


FAR = 4_102_444_800
"""2100-01-01: a time still ahead whenever the suite runs (a time taken at import is not: the
suite runs for minutes before it gets here)."""


@pytest.mark.parametrize(
    ("claim", "value"),
    [
        ("exp", str(FAR)),  # PyJWT takes it (`int("…")`): the socket then never expired
        ("exp", 10**400),  # beyond a float: setting the socket's expiry crashed
        ("exp", True),
        ("iat", "1700000000"),
        ("nbf", "1700000000"),
        ("nbf", False),
    ],
    ids=["exp-string", "exp-huge", "exp-bool", "iat-string", "nbf-string", "nbf-bool"],
)
async def test_a_time_claim_that_is_not_a_json_number_is_refused_naming_it(
    start_webchat: StartWebchat, claim: str, value: object
) -> None:
    token = signed("ada", **{claim: value})
    assert TokenAuth([], ISSUER).identify(token) is None
    chat = await start_webchat(issuer=ISSUER, static_tokens=[])
    async with websockets.connect(chat.ws_url) as ws:
        await ws.send(json.dumps({"type": "auth", "token": token}))
        error = json.loads(await ws.recv())
        await asyncio.wait_for(ws.wait_closed(), 10)
    assert error["code"] == "unauthorized" and ws.close_code == 4401
    assert f"'{claim}' claim is not a time: it must be a JSON number" in error["message"]
    async with aiohttp.ClientSession() as http, http.get(f"{chat.http}/?token={token}") as resp:
        page = await resp.text()
    assert resp.status == 401 and "This access token is not valid" in page
    assert f"The access token's '{claim}' claim is not a time" in page


def test_time_claims_that_are_json_numbers_are_accepted() -> None:
    auth = TokenAuth([], ISSUER)
    now = time.time()
    assert auth.identify(signed("ada", exp=now + 300.5, iat=now - 1.5, nbf=int(now))) == "sub:ada"
    assert auth.admit(signed("ada", exp=FAR)) == ("sub:ada", FAR + ISSUER.leeway)
    assert auth.refusal(signed("ada", ttl=-120)).startswith("the access token has expired")
    assert auth.refusal("not-a-jwt") == "the access token is wrong or no longer accepted"


async def test_a_renewed_token_keeps_the_session_and_another_user_cannot_take_it(
    start_webchat: StartWebchat,
) -> None:
    chat = await start_webchat(issuer=ISSUER)
    url = chat.ws_url

    async def auth(token: str, session_id: str | None = None) -> dict[str, Any]:
        async with websockets.connect(url) as ws:
            frame: dict[str, Any] = {"type": "auth", "token": token}
            if session_id:
                frame["session_id"] = session_id
            await ws.send(json.dumps(frame))
            reply: dict[str, Any] = json.loads(await ws.recv())
            return reply

    first = await auth(signed("ada"))
    assert first["type"] == "ready" and first["new_session"] is True
    again = await auth(signed("ada", ttl=600, jti="renewed"), first["session_id"])
    assert again["type"] == "ready" and again["session_id"] == first["session_id"]
    intruder = await auth(signed("mallory"), first["session_id"])
    assert intruder["type"] == "error" and intruder["code"] == "forbidden"
    expired = await auth(signed("ada", ttl=-120), first["session_id"])
    assert expired["type"] == "error" and expired["code"] == "unauthorized"

    # The same user on a new device (no session id of its own) gets their session back; a
    # static token would get a new session per browser, as it may be handed to many people.
    phone = await auth(signed("ada"))
    assert phone["session_id"] == first["session_id"] and phone["new_session"] is False
    other = await auth(signed("grace"))
    assert other["session_id"] != first["session_id"] and other["new_session"] is True


def test_a_signed_token_refused_for_its_claims_says_which() -> None:
    """A token the issuer did sign, refused for a claim missing or a time ahead of this
    server's clock (the signing app's clock runs fast), was "wrong or no longer accepted":
    nothing its app's developer could act on."""
    auth = TokenAuth([], ISSUER)
    now = int(time.time())
    no_exp = jwt.encode({"sub": "ada", "aud": "talkbridge"}, SECRET, algorithm="HS256")
    no_sub = jwt.encode({"exp": now + 300, "aud": "talkbridge"}, SECRET, algorithm="HS256")
    assert auth.refusal(no_exp) == "the access token has no 'exp' claim: it is required"
    assert auth.refusal(no_sub) == "the access token has no 'sub' claim: it is required"
    for claim in ("nbf", "iat"):
        token = signed("ada", **{claim: now + 600})
        assert auth.identify(token) is None
        refusal = auth.refusal(token)
        assert refusal.startswith(f"the access token is not valid yet: its '{claim}' is "), refusal
        assert "ahead of this server's clock" in refusal
    forged = jwt.encode({"sub": "ada", "aud": "talkbridge"}, "x" * 40, algorithm="HS256")
    assert auth.refusal(forged) == "the access token is wrong or no longer accepted"


async def test_an_expired_signed_token_says_so_and_asks_to_sign_in_again(
    start_webchat: StartWebchat,
) -> None:
    chat = await start_webchat(issuer=ISSUER, static_tokens=[])
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{chat.http}/?token={signed('ada', ttl=-120)}") as resp:
            page = await resp.text()
        assert resp.status == 401 and "This access token has expired" in page
        assert "Sign in again" in page and "talkbridge run" not in page  # no terminal here
        async with http.get(f"{chat.http}/?token={signed('ada', secret='forged' * 6)}") as resp:
            assert "This access token is not valid" in await resp.text()
        # A reload, the expired token in the cookie the link left: the same heading.
        cookie = {"Cookie": f"talkbridge_token_{chat.connector.port}={signed('ada', ttl=-120)}"}
        async with http.get(f"{chat.http}/", headers=cookie) as resp:
            page = await resp.text()
        assert resp.status == 401 and "This access token has expired" in page, page
    async with websockets.connect(chat.ws_url) as ws:
        await ws.send(json.dumps({"type": "auth", "token": signed("ada", ttl=-120)}))
        error = json.loads(await ws.recv())
        assert error["code"] == "unauthorized" and "expired; sign in again" in error["message"]


async def test_an_open_socket_is_closed_when_its_signed_token_expires(
    start_webchat: StartWebchat,
) -> None:
    """An app cutting a user off with short-lived tokens: the socket opened while the token
    was valid does not outlive it (the page then asks to sign in again)."""
    issuer = WebchatIssuer(secret=SecretStr(SECRET), audience="talkbridge", leeway=0)
    chat = await start_webchat(issuer=issuer, static_tokens=["static-token"])
    async with (
        websockets.connect(chat.ws_url) as short,
        websockets.connect(chat.ws_url) as static,
    ):
        await short.send(json.dumps({"type": "auth", "token": signed("ada", ttl=1)}))
        await static.send(json.dumps({"type": "auth", "token": "static-token"}))
        assert json.loads(await short.recv())["type"] == "ready"
        assert json.loads(await static.recv())["type"] == "ready"
        error = json.loads(await asyncio.wait_for(short.recv(), 10))
        assert error["code"] == "unauthorized" and "expired; sign in again" in error["message"]
        await asyncio.wait_for(short.wait_closed(), 10)
        assert short.close_code == 4401
        await static.send(json.dumps({"type": "ping", "ref": "p"}))  # a static token lasts
        assert json.loads(await static.recv()) == {"type": "pong", "ref": "p"}


async def test_a_signed_token_with_a_few_thousand_characters_of_claims_is_accepted(
    start_webchat: StartWebchat,
) -> None:
    chat = await start_webchat(issuer=ISSUER, static_tokens=[], max_frame_bytes=64 * 1024)
    token = signed("ada", groups=[f"group-{i:04d}" for i in range(300)])
    assert len(token) > 4000  # identity providers' tokens with group lists run this long
    async with websockets.connect(chat.ws_url) as ws:
        await ws.send(json.dumps({"type": "auth", "token": token}))
        assert json.loads(await ws.recv())["type"] == "ready"


async def test_an_oversized_first_frame_is_called_too_large_not_something_else(
    start_webchat: StartWebchat,
) -> None:
    chat = await start_webchat(issuer=ISSUER, static_tokens=[])
    async with websockets.connect(chat.ws_url) as ws:
        await ws.send(json.dumps({"type": "auth", "token": "x" * 70_000}))
        error = json.loads(await ws.recv())
    assert error["code"] == "unauthorized"
    assert error["message"].startswith("the first frame is too large (frame is "), error
