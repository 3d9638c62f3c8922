"""Calls into a hook's own code: checked when it is registered, told in one line when they fail.

A hook whose function cannot take the arguments it is called with (`on_message(a, b, c)`,
middleware `mw(ctx)`) is refused when it is registered, naming the file and line where it is
defined, rather than failing at every message. A hook that raises is logged in one line naming
the hook and the line of its code that raised; the traceback is logged at debug level.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import sysconfig
import traceback
from pathlib import Path
from typing import Any

_PACKAGE = str(Path(__file__).resolve().parents[1]) + os.sep
_LIBRARIES = tuple(
    str(Path(p).resolve()) + os.sep
    for p in {sysconfig.get_path(key) for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    if p
)


def shown_path(filename: str) -> str:
    """`filename` relative to the working directory when it is under it, else as it is."""
    try:
        return str(Path(filename).resolve().relative_to(Path.cwd()))
    except ValueError:
        return filename


def failed_at(exc: BaseException) -> str:
    """` (at FILE line N)`: the innermost frame of the hook's code in `exc`'s traceback (not
    talkbridge's, nor a library's it called, unless there is no other); "" when none."""
    frames = [
        f
        for f in traceback.extract_tb(exc.__traceback__)
        if not str(Path(f.filename).resolve()).startswith(_PACKAGE)
    ]
    own = [f for f in frames if not str(Path(f.filename).resolve()).startswith(_LIBRARIES)]
    chosen = own or frames
    if not chosen:
        return ""
    return f" (at {shown_path(chosen[-1].filename)} line {chosen[-1].lineno})"


def describe_hook_error(exc: BaseException) -> str:
    """`TypeName: message (at FILE line N)`, for a log line or a dead letter."""
    return f"{type(exc).__name__}: {exc}".rstrip(": ") + failed_at(exc)


def log_failure(
    logger: logging.Logger, level: int, message: str, *args: Any, exc: BaseException
) -> None:
    """One line at `level` (`message` should say what failed and carry `describe_hook_error`), and
    the traceback at debug level, for `--log-level debug`."""
    logger.log(level, message, *args)
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug("the traceback of the failure above:", exc_info=exc)


def _code_of(fn: Any) -> Any:
    target = fn
    while isinstance(target, functools.partial):
        target = target.func
    target = getattr(target, "__func__", target)  # a bound method
    code = getattr(target, "__code__", None)
    if code is None and not inspect.isroutine(target):  # an instance with __call__
        code = getattr(type(target).__call__, "__code__", None)
    return code


def handler_name(fn: Any) -> str:
    """How a handler reads in a log line: `Bridge.handler`, `relay`, `partial(relay)`, its
    qualified name without the `create_hook.<locals>.` of a function defined in another."""
    if isinstance(fn, functools.partial):
        return f"partial({handler_name(fn.func)})"
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    return str(name).rsplit("<locals>.", 1)[-1] if name else type(fn).__qualname__


def hook_code(fn: Any) -> str:
    """`Boom.on_message (hooks/x/hook.py line 2)`: the hook's code, for a failure's log line."""
    return f"{handler_name(fn)}{defined_at(fn)}"


def message_ref(msg: Any) -> str:
    """`connection/message-id` of the message a hook was handling (never its text)."""
    connection_id = getattr(msg, "connection_id", None)
    message_id = getattr(msg, "id", None)
    if connection_id is None or message_id is None:
        return "an event"
    return f"{connection_id}/{message_id}"


def defined_at(fn: Any) -> str:
    """` (FILE line N)` where `fn` (a function, a method, a class) is defined, when it is
    Python code."""
    if inspect.isclass(fn):
        try:
            _, line = inspect.findsource(fn)
            filename = inspect.getsourcefile(fn)
        except (OSError, TypeError):
            return ""
        return f" ({shown_path(filename)} line {line + 1})" if filename else ""
    code = _code_of(fn)
    if code is None:
        return ""
    return f" ({shown_path(code.co_filename)} line {code.co_firstlineno})"


def check_call(fn: Any, args: tuple[str, ...], what: str) -> None:
    """Raise TypeError when `fn` cannot be called with the positional arguments `args` (their
    names, for the message), naming `what` (the hook) and where `fn` is defined."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: nothing to check
        return
    try:
        signature.bind(*args)
    except TypeError as exc:
        name = getattr(fn, "__name__", type(fn).__name__)
        prefix = f"{what}: " if what else ""
        raise TypeError(
            f"{prefix}{name}{signature}{defined_at(fn)} cannot be called as "
            f"{name}({', '.join(args)}): {exc}"
        ) from None


def is_async(fn: Any) -> bool:
    """An `async def` function or method, or an instance with an `async def __call__`."""
    call = getattr(fn, "__call__", None)  # noqa: B004 - an instance with async __call__
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(call)


def check_async(fn: Any, what: str, should: str) -> None:
    """A plain `def` where the caller awaits the result loaded, then failed every turn
    ("object NoneType can't be used in 'await' expression"): refused, naming its file and line."""
    if is_async(fn):
        return
    name = getattr(fn, "__name__", type(fn).__name__)
    raise TypeError(
        f"{what}: {name}{defined_at(fn)} is a plain function (def): it must be {should}, "
        "as what it returns is awaited"
    )
