"""Who a webchat token belongs to: a static token from the config, or one an issuer signed.

Sessions are bound to the identity, not to the token text: a signed token is renewed (new text,
same `sub`) without losing the user's conversations, and a static token's identity is its hash.
"""

from __future__ import annotations

import hmac
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
        if self._issuer is not None and _expired(token, self._issuer):
            return "the access token has expired; sign in again to get a new link"
        return "the access token is wrong or no longer accepted"

    @staticmethod
    def _signed(token: str, issuer: WebchatIssuer) -> tuple[str, float | None] | None:
        claims = _claims(token, issuer, require=["sub", "exp"])
        if claims is None:
            return None
        subject, expires = claims.get("sub"), claims.get("exp")
        if not isinstance(subject, str) or not subject:
            return None
        until = float(expires) + issuer.leeway if isinstance(expires, int | float) else None
        return f"{PERSON_PREFIX}{subject}", until


def _expired(token: str, issuer: WebchatIssuer) -> bool:
    """A token this issuer signed whose time is up (signature checked, expiry not)."""
    claims = _claims(token, issuer, verify_exp=False)
    expires = claims.get("exp") if claims is not None else None
    return isinstance(expires, int | float) and expires + issuer.leeway < time.time()


def _claims(
    token: str, issuer: WebchatIssuer, *, require: list[str] | None = None, verify_exp: bool = True
) -> dict[str, Any] | None:
    """The claims of a token this issuer signed (HS256, its audience), or None."""
    import jwt

    try:
        claims: dict[str, Any] = jwt.decode(
            token,
            issuer.secret.get_secret_value(),
            algorithms=["HS256"],
            audience=issuer.audience,
            leeway=issuer.leeway,
            options={"require": require or [], "verify_exp": verify_exp},
        )
    except jwt.PyJWTError:
        return None
    return claims
