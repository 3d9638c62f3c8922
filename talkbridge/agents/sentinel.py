"""The sentinel: the only agent an untrusted sender reaches unless a hook routes them elsewhere.

It answers from fixed text (never from the sender's words, never passing them to another agent or
model), issues a pairing code an operator can approve, and flags likely prompt injection. A trusted
sender a hook routed here gets a short refusal instead of a code: they are approved already; so
does one whose message the answer to would reach strangers (an email Cc'ing one).
"""

from __future__ import annotations

import logging
import re
import secrets
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

from talkbridge.agents.base import Result, TurnContext
from talkbridge.message import utcnow
from talkbridge.store.base import Pairing, Store

log = logging.getLogger("talkbridge.sentinel")

_ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"  # no 0/O, 1/I: codes are read aloud and retyped

INJECTION_PATTERNS: tuple[re.Pattern[str], ...] = tuple(
    re.compile(p, re.IGNORECASE)
    for p in (
        r"\bignore\s+(all\s+|any\s+)?(the\s+)?(previous|prior|above|earlier)\s+"
        r"(instructions|prompts?|messages|rules)",
        r"\bdisregard\s+(all\s+|any\s+)?(the\s+)?(previous|prior|above|your)\b",
        r"\b(reveal|print|show|repeat)\s+(me\s+)?(your|the)\s+(system\s+prompt|instructions)",
        r"\byou\s+are\s+now\s+(a|an|in)\b",
        r"\b(system|developer)\s*(prompt|message)\s*:",
        r"\bjailbreak\b|\bDAN\s+mode\b|\bdeveloper\s+mode\b",
        r"<\|?\s*/?\s*(system|assistant|im_start|im_end)\s*\|?>",
        r"\bact\s+as\s+(an?\s+)?(admin|administrator|root|system)\b",
    )
)


def injection_flags(text: str) -> list[str]:
    """Names of the injection patterns `text` matches (empty when it looks harmless)."""
    return [f"injection:{i}" for i, p in enumerate(INJECTION_PATTERNS) if p.search(text)]


def new_pairing_code() -> str:
    raw = "".join(secrets.choice(_ALPHABET) for _ in range(8))
    return f"{raw[:4]}-{raw[4:]}"


GROUP_NOTICE = (
    "This assistant only answers people its operator has approved. To ask for access, send "
    "me a direct message."
)


SCREENED_NOTICE = "Sorry, I cannot pass this message on."
"""What a trusted sender a hook routed to the sentinel reads: they need no approval."""


OTHERS_NOTICE = (
    "Sorry, I cannot answer this message: my answer would also reach people this assistant's "
    "operator has not approved. Write to me again on your own, with nobody else on To or Cc."
)
"""What a trusted sender reads whose message the answer to would reach strangers (an email
that Cc's one): they need no approval, and the strangers did not ask for any."""


CODE_TTL = timedelta(hours=1)
"""How long a pairing code can be approved unless the config says otherwise
(`pairing.code_ttl`): long enough for the sender to reach the operator, short enough that an
approval still matches who asked."""


class SentinelAgent:
    name = "sentinel"

    def __init__(self, store: Store, *, code_ttl: timedelta = CODE_TTL) -> None:
        if code_ttl <= timedelta(0):
            raise ValueError(f"code_ttl must be positive, got {code_ttl}")
        self._store = store
        self._code_ttl = code_ttl

    async def stream(self, ctx: TurnContext) -> AsyncIterator[Any]:
        message = ctx.message
        flags = injection_flags(ctx.input.prompt)
        ctx.state["sentinel_flags"] = flags
        if flags:
            log.warning(
                "likely prompt injection from %s on %s (%s)",
                message.channel_user_id,
                message.connection_id,
                ", ".join(flags),
            )
        routing = message.routing
        if routing is not None and routing.trust == "trusted":
            # A hook screened this one message of a trusted sender (README's keyword router on
            # "ignore previous instructions"): a code would tell them they are not approved,
            # and leave the operator a pairing to approve for someone trusted already.
            yield Result(text=SCREENED_NOTICE)
            return
        if routing is not None and routing.sender_trusted:
            # Trusted themselves, but the answer would reach a stranger: a new pending pairing
            # for them would be one the operator cannot make sense of, nor need approve.
            yield Result(text=OTHERS_NOTICE)
            return
        code = new_pairing_code()
        now = utcnow()
        pairing = await self._store.create_pairing(
            Pairing(
                code=code,
                connection_id=message.connection_id,
                channel_user_id=message.channel_user_id,
                display_name=message.display_name,
                created_at=now,
                approved=False,
                expires_at=now + self._code_ttl,
            )
        )
        if message.thread_type != "private":
            # In a group or a channel everyone reads the answer: no code there, said once per
            # sender (the pending pairing is in `pair list` for the operator all the same).
            # An empty result is a turn that says nothing (no result would be a failed turn,
            # and the sender would get the apology instead).
            yield Result(text=GROUP_NOTICE if pairing.code == code else "")
            return
        yield Result(
            text=(
                "Hello! This assistant only answers people its operator has approved, so your "
                "message has not been passed on. To ask for access, send the operator this "
                f"pairing code: {pairing.code}"
            )
        )
