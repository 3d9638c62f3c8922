"""Whether the receiving server vouches for a mail's From: `Authentication-Results` (RFC 8601).

Anyone can write any `From:`. What a mail server can prove is DMARC (the From domain's owner
says the mail passed SPF or DKIM aligned with it) or a DKIM signature of the From domain. Our
own receiving server writes what it found into an `Authentication-Results` header that starts
with its authserv-id; it prepends it, so it sits above any such header the sender wrote
(RFC 8601 section 5: a sender can claim any authserv-id, which is why only the topmost header
of the configured one counts). Pure: no I/O.

A From is vouched for when that header says `dmarc=pass` (for the From domain, when it names
one), or, when DMARC gave no verdict (`none`: the domain publishes no DMARC record, or an
error), `dkim=pass` by a domain aligned with From (`header.d`, else `header.i`) in DMARC's
relaxed sense (RFC 7489, 3.1.1): the same organizational domain, by the Public Suffix List
(`mail.example.com` signs for `example.com` and the reverse; `evil.co.uk` not for `victim.co.uk`,
nor `evil.github.io` for `victim.github.io`). Relaxed is DMARC's default, and strict (`adkim=s`)
can only be asked in a DMARC record; with one, the server's `dmarc=` verdict decides, so it
is honoured. A `dmarc=fail` stands even beside a passing DKIM. SPF alone never: it vouches for
the envelope sender, not for From.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from email.message import Message
from functools import cache
from typing import Literal

from publicsuffixlist import PublicSuffixList

Proof = Literal["dmarc", "dkim"]

_PAIR = re.compile(r'([^\s=;"]+)\s*=\s*("(?:[^"\\]|\\.)*"|[^\s;"]+)')


@dataclass(frozen=True)
class Result:
    """One `method=result` of a header, with its properties (`header.d` -> `example.org`)."""

    method: str
    result: str
    props: dict[str, str] = field(default_factory=dict)


def _without_comments(value: str) -> str:
    """The value with its (nested) comments taken out; quoted strings are kept as they are."""
    out: list[str] = []
    depth = 0
    quoted = escaped = False
    for char in value:
        if escaped:
            escaped = False
            if depth == 0:
                out.append(char)
            continue
        if char == "\\":
            escaped = True
            if depth == 0:
                out.append(char)
            continue
        if quoted:
            quoted = char != '"'
            out.append(char)
        elif char == "(":
            depth += 1
        elif char == ")" and depth:
            depth -= 1
        elif depth == 0:
            quoted = char == '"'
            out.append(char)
    return "".join(out)


def _split(value: str) -> list[str]:
    """`;`-separated parts, a `;` inside a quoted string left alone."""
    parts = [""]
    quoted = escaped = False
    for char in value:
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == '"':
            quoted = not quoted
        elif char == ";" and not quoted:
            parts.append("")
            continue
        parts[-1] += char
    return parts


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] == '"':
        return re.sub(r"\\(.)", r"\1", value[1:-1])
    return value


def parse(value: str) -> tuple[str, list[Result]]:
    """The authserv-id (lower case) and the results of one header's value."""
    head, *resinfos = _split(_without_comments(value))
    words = head.split()
    authserv_id = _unquote(words[0]).lower().rstrip(".") if words else ""
    results: list[Result] = []
    for resinfo in resinfos:
        pairs = [(k.lower(), _unquote(v)) for k, v in _PAIR.findall(resinfo)]
        if not pairs:  # `none`: nothing was checked
            continue
        (method, result), *rest = pairs
        props = {k: v for k, v in rest if k != "reason"}
        results.append(Result(method.partition("/")[0], result.lower(), props))
    return authserv_id, results


@cache
def _suffixes() -> PublicSuffixList:
    """The Public Suffix List the package bundles (read once; no download)."""
    return PublicSuffixList()


def organizational_domain(domain: str) -> str | None:
    """`domain`'s registrable domain (`mail.example.co.uk` -> `example.co.uk`); None for a
    public suffix itself (`co.uk`, `github.io`), which no one organization owns."""
    found = _suffixes().privatesuffix(domain.strip().lower().rstrip("."))
    return str(found) if found else None


def _aligned(from_domain: str, domain: str) -> bool:
    """DMARC's relaxed alignment: the same domain, or the same organizational domain."""
    domain = domain.strip().lower().rstrip(".")
    if not domain:
        return False
    if domain == from_domain:
        return True
    organization = organizational_domain(domain)
    return organization is not None and organization == organizational_domain(from_domain)


def vouched(msg: Message, authserv_id: str, from_domain: str) -> Proof | None:
    """How the topmost `Authentication-Results` of `authserv_id` vouches for mail From
    `from_domain` ("dmarc" or "dkim"), or None when it does not (or there is none)."""
    wanted = authserv_id.strip().lower().rstrip(".")
    domain = from_domain.strip().lower().rstrip(".")
    if not domain:
        return None
    try:
        values = [str(v) for v in msg.get_all("Authentication-Results", [])]
    except Exception:  # a header the parser gave up on: its raw text
        values = [v for k, v in msg.raw_items() if k.lower() == "authentication-results"]
    for value in values:
        found_id, results = parse(value)
        if found_id == wanted:
            return _verdict(results, domain)
    return None


def _verdict(results: list[Result], domain: str) -> Proof | None:
    dmarc = [r for r in results if r.method == "dmarc"]
    for r in dmarc:
        named = r.props.get("header.from", domain).lower().rstrip(".")
        if r.result == "pass" and named == domain:
            return "dmarc"
    if any(r.result in ("pass", "fail", "quarantine", "reject") for r in dmarc):
        return None  # a verdict on the domain, and not a pass for this one
    for r in results:
        if r.method != "dkim" or r.result != "pass":
            continue
        signer = r.props.get("header.d") or r.props.get("header.i", "").rpartition("@")[2]
        if _aligned(domain, signer):
            return "dkim"
    return None
