"""Who a webchat token belongs to: a static token from the config, or one an issuer signed.

Sessions are bound to the identity, not to the token text: a signed token is renewed (new text,
same `sub`) without losing the user's conversations, and a static token's identity is its hash.
"""

from __future__ import annotations

import hmac
import math
import time
from collections.abc import Sequence
from typing import Any

from talkbridge.config import WebchatIssuer
from talkbridge.webchat.sessions import PERSON_PREFIX, token_hash

GENERATED_IDENTITY = "generated"
"""Who holds the bridge's generated token: the operator, whichever token it is now, so the
conversations survive `talkbridge run --new-token` (the old link's holder is out)."""


class TokenAuth:
    def __init__(
        self,
        tokens: Sequence[str],
        issuer: WebchatIssuer | None = None,
        *,
        generated: bool = False,
    ) -> None:
        self._tokens = [t.encode("utf-8") for t in tokens]
        self._issuer = issuer
        self._generated = generated
        """`tokens` is the generated token alone: its identity is `GENERATED_IDENTITY`."""

    def identify(self, token: str) -> str | None:
        """The identity behind `token`, or None when it is not accepted."""
        admitted = self.admit(token)
        return None if admitted is None else admitted[0]

    def admit(self, token: str) -> tuple[str, float | None] | None:
        """The identity behind `token` and when it stops being accepted (a signed token's `exp`
        plus the leeway, in `time.time()` seconds; None for a static token, which does not
        expire), or None when it is not accepted."""
        given = token.encode("utf-8")
        found = False
        for accepted in self._tokens:  # constant time: no early exit on a match
            found |= hmac.compare_digest(given, accepted)
        if found:
            return (GENERATED_IDENTITY if self._generated else token_hash(token)), None
        if self._issuer is not None:
            return self._signed(token, self._issuer)
        return None

    @property
    def signed_only(self) -> bool:
        """Users come with tokens a site signed for them, not with a link `run` printed."""
        return self._issuer is not None and not self._tokens

    def refusal(self, token: str) -> str:
        """Why `token` is refused, in the words its holder can act on."""
        signed = None if self._issuer is None else _signed_refusal(token, self._issuer)
        return signed or "the access token is wrong or no longer accepted"

    @staticmethod
    def _signed(token: str, issuer: WebchatIssuer) -> tuple[str, float | None] | None:
        claims = _claims(token, issuer, require=["sub", "exp"])
        if claims is None or _time_claim_problem(claims) is not None:
            return None
        subject = claims.get("sub")
        if not isinstance(subject, str) or not subject:
            return None
        return f"{PERSON_PREFIX}{subject}", float(claims["exp"]) + issuer.leeway


def _signed_refusal(token: str, issuer: WebchatIssuer) -> str | None:
    """Why a token this issuer did sign is refused: a claim missing, or its times (None: not
    one it signed)."""
    claims = _claims(token, issuer, verify_times=False)
    if claims is None:
        return None
    problem = _missing_claim(claims) or _time_claim_problem(claims)
    if problem is not None:
        return problem
    now = time.time()
    if claims["exp"] + issuer.leeway < now:
        return "the access token has expired; sign in again to get a new link"
    return _not_yet(claims, now, issuer.leeway)


def _missing_claim(claims: dict[str, Any]) -> str | None:
    for name in ("sub", "exp"):
        if name not in claims:
            return f"the access token has no '{name}' claim: it is required"
    return None


def _not_yet(claims: dict[str, Any], now: float, leeway: float) -> str | None:
    """A token signed ahead of this server's clock (the signing app's runs fast): PyJWT
    refuses an `nbf` or `iat` past now plus the leeway."""
    for name in ("nbf", "iat"):
        if name in claims and claims[name] > now + leeway:
            return (
                f"the access token is not valid yet: its '{name}' is "
                f"{math.ceil(claims[name] - now)} s ahead of this server's clock (check the "
                "clocks of the signing app and of this server)"
            )
    return None


TIME_CLAIMS = ("exp", "iat", "nbf")


def _time_claim_problem(claims: dict[str, Any]) -> str | None:
    """Why a time claim is unusable, or None: RFC 7519 makes them JSON numbers, yet PyJWT takes
    anything `int()` takes (`"1893456000"`, `true`), and a string `exp` then left the socket
    without an expiry, open for good."""
    for name in TIME_CLAIMS:
        if name in claims and not _is_time(claims[name]):
            return (
                f"the access token's '{name}' claim is not a time: it must be a JSON number "
                "of seconds since 1970 (not a string or a boolean)"
            )
    return None


def _is_time(value: object) -> bool:
    """A JSON number a float can hold (`10**400` cannot: a crash when the expiry was set)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _claims(
    token: str,
    issuer: WebchatIssuer,
    *,
    require: list[str] | None = None,
    verify_times: bool = True,
) -> dict[str, Any] | None:
    """The claims of a token this issuer signed (HS256, its audience), or None; with
    `verify_times` off, whatever its `exp`, `iat` and `nbf` say (to tell why it is refused)."""
    import jwt

    try:
        claims: dict[str, Any] = jwt.decode(
            token,
            issuer.secret.get_secret_value(),
            algorithms=["HS256"],
            audience=issuer.audience,
            leeway=issuer.leeway,
            options={
                "require": require or [],
                "verify_exp": verify_times,
                "verify_iat": verify_times,
                "verify_nbf": verify_times,
            },
        )
    except jwt.PyJWTError:
        return None
    return claims
