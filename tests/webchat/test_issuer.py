"""Tokens an issuer signs (JWT, HS256): accepted while valid, sessions follow the user (`sub`)."""

from __future__ import annotations

import json
import time
from typing import Any

import aiohttp
import jwt
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
    async with websockets.connect(chat.ws_url) as ws:
        await ws.send(json.dumps({"type": "auth", "token": signed("ada", ttl=-120)}))
        error = json.loads(await ws.recv())
        assert error["code"] == "unauthorized" and "expired; sign in again" in error["message"]
