"""Three rules every connector applies where talkbridge meets the platform.

A caller's bad input (an id that is not ours, a malformed button) is a `PermanentError`:
retrying cannot help. And no secret leaves in an error message: SDKs quote URLs and requests
that may hold a token, so every message built from an SDK's words is scrubbed first. And a
payload of the wrong shape is refused like any unreadable one, not crashed on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ParamSpec, TypeVar

from talkbridge.config import Secrets
from talkbridge.errors import PermanentError, TransientError

P = ParamSpec("P")
T = TypeVar("T")


def permanent(parse: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """`parse(*args, **kwargs)`, its ValueError raised again as a PermanentError (same words)."""
    try:
        return parse(*args, **kwargs)
    except ValueError as exc:
        raise PermanentError(str(exc)) from None


def readable(decode: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """`decode(*args, **kwargs)` of a platform payload. A field of an unexpected shape meets
    the codec as an AttributeError, TypeError or KeyError: raised again as the ValueError a
    codec raises for a payload it refuses, so one except clause skips both."""
    try:
        return decode(*args, **kwargs)
    except (AttributeError, TypeError, KeyError) as exc:
        raise ValueError(f"malformed payload ({type(exc).__name__}: {exc})") from None


def not_the_api(platform: str, exc: UnicodeDecodeError | KeyError) -> TransientError:
    """An answer the SDK could not read (bytes that are not UTF-8, JSON without a field every
    answer has): most likely `api_base` points at something that is not the platform's API."""
    what = (
        "a body that is not UTF-8 text"
        if isinstance(exc, UnicodeDecodeError)
        else f"a payload without the field {exc}"
    )
    return TransientError(f"{platform} answered with {what}: is api_base its API?")


def scrub(text: str, *secrets: str | None) -> str:
    """`text` with each of a connector's secrets replaced by `***`, in every form `Secrets`
    knows (escaped, inside a repr) and with any URL's `user:password@` masked: the one
    redaction the log lines also get, so an SDK's words are never scrubbed less than a log.
    """
    return Secrets(s for s in secrets if s).redact(text)
