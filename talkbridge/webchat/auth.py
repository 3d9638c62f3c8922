"""Who a webchat token belongs to: a static token from the config, or one an issuer signed.

Sessions are bound to the identity, not to the token text: a signed token is renewed (new text,
same `sub`) without losing the user's conversations, and a static token's identity is its hash.
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence

from talkbridge.config import WebchatIssuer
from talkbridge.webchat.sessions import token_hash


class TokenAuth:
    def __init__(self, tokens: Sequence[str], issuer: WebchatIssuer | None = None) -> None:
        self._tokens = [t.encode("utf-8") for t in tokens]
        self._issuer = issuer

    def identify(self, token: str) -> str | None:
        """The identity behind `token`, or None when it is not accepted."""
        given = token.encode("utf-8")
        found = False
        for accepted in self._tokens:  # constant time: no early exit on a match
            found |= hmac.compare_digest(given, accepted)
        if found:
            return token_hash(token)
        if self._issuer is not None:
            return self._signed(token, self._issuer)
        return None

    @staticmethod
    def _signed(token: str, issuer: WebchatIssuer) -> str | None:
        import jwt

        try:
            claims = jwt.decode(
                token,
                issuer.secret.get_secret_value(),
                algorithms=["HS256"],
                audience=issuer.audience,
                leeway=issuer.leeway,
                options={"require": ["sub", "exp"]},
            )
        except jwt.PyJWTError:
            return None
        subject = claims.get("sub")
        return f"sub:{subject}" if isinstance(subject, str) and subject else None
