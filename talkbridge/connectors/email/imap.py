"""One IMAP session on aioimaplib: connect (TLS / STARTTLS / plain), log in, select, and the few
commands the transport needs, each raced against the connection being lost (aioimaplib would
otherwise wait forever on a command whose socket is gone)."""

from __future__ import annotations

import asyncio
import base64
import re
import ssl
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from aioimaplib import aioimaplib  # type: ignore[import-untyped]

from talkbridge.connectors.email.backlog import parse_internal_date
from talkbridge.connectors.email.config import ImapConfig
from talkbridge.connectors.email.errors import imap_errors
from talkbridge.errors import NotFoundError, PermanentError, TransientError, UnauthorizedError

T = TypeVar("T")
_UIDVALIDITY = re.compile(rb"\[UIDVALIDITY (\d+)\]")
_UIDNEXT = re.compile(rb"\[UIDNEXT (\d+)\]")
_EXISTS = re.compile(rb"^(\d+) EXISTS")
_FETCH = re.compile(rb"^\d+ FETCH \(")
_UID = re.compile(rb"\bUID (\d+)")
_INTERNALDATE = re.compile(rb'\bINTERNALDATE "([^"]*)"')
_LIST = re.compile(rb'^\(([^)]*)\) (NIL|"(?:[^"\\]|\\.)*"|\S+) (.+)$', re.IGNORECASE)
_LITERAL = re.compile(rb"^\{(\d+)\+?\}$")
_UIDS_PER_FETCH = 500
"""UIDs asked for in one FETCH: a command line stays well below servers' limits (8 KB+)."""


def body_of(lines: list[Any], uid: int) -> bytes | None:
    """The literal of the FETCH response for `uid` in aioimaplib's lines, or None.

    The data items come in any order (RFC 3501, 7.4.2): UID before the body, in the line that
    announces the literal, or after it, in the line that follows the literal.
    """
    for index, line in enumerate(lines[:-1]):
        if (
            not isinstance(line, bytes)
            or not _FETCH.match(line)
            or not line.rstrip().endswith(b"}")
        ):
            continue
        literal = lines[index + 1]
        after = lines[index + 2] if index + 2 < len(lines) else b""
        found = _UID.search(line) or (_UID.search(after) if isinstance(after, bytes) else None)
        if found and int(found.group(1)) == uid and isinstance(literal, bytearray | bytes):
            return bytes(literal)
    return None


def internal_dates_of(lines: list[Any]) -> dict[int, datetime]:
    """UID -> INTERNALDATE from the lines of a `UID FETCH … (INTERNALDATE)` answer; FETCH
    lines without both (an unsolicited flag update) and unreadable dates are left out."""
    found: dict[int, datetime] = {}
    for line in lines:
        if not isinstance(line, bytes | bytearray) or not _FETCH.match(line):
            continue
        uid, internal = _UID.search(line), _INTERNALDATE.search(line)
        if uid is None or internal is None:
            continue
        when = parse_internal_date(internal.group(1).decode(errors="replace"))
        if when is not None:
            found[int(uid.group(1))] = when
    return found


SENT_NAMES = ("sent", "sent items", "sent messages", "sent mail")
"""Names mail clients give the Sent folder on servers that mark none `\\Sent` (compared in
lower case, the last level of the name), in the order they are looked for."""


@dataclass(frozen=True)
class Listed:
    """One mailbox of a `LIST` answer."""

    attributes: frozenset[str]
    """In lower case: `\\sent`, `\\noselect`, …"""
    argument: str
    """The name as a command takes it: the server's own encoding (modified UTF-7), quoted
    when it has to be."""
    leaf: str
    """The last level of the name (after the hierarchy delimiter), unquoted."""


def listed_of(lines: list[Any]) -> list[Listed]:
    """The mailboxes in the lines of a `LIST` answer, in its order."""
    found: list[Listed] = []
    for index, line in enumerate(lines):
        match = _LIST.match(bytes(line)) if isinstance(line, bytes | bytearray) else None
        if match is None:
            continue
        attributes = frozenset(a.decode(errors="replace") for a in match.group(1).lower().split())
        delimiter = match.group(2).strip(b'"').replace(b"\\\\", b"\\").decode(errors="replace")
        name = match.group(3).strip()
        if _LITERAL.match(name) and index + 1 < len(lines):  # a name sent as a literal
            raw = bytes(lines[index + 1]).decode(errors="replace")
            argument = _quote_raw(raw)
        else:
            argument = name.decode(errors="replace")
            raw = argument
            if raw.startswith('"') and raw.endswith('"') and len(raw) >= 2:
                raw = re.sub(r"\\(.)", r"\1", raw[1:-1])
        leaf = raw.rsplit(delimiter, 1)[-1] if delimiter and delimiter != "NIL" else raw
        found.append(Listed(attributes, argument, leaf))
    return found


def special_use_of(lines: list[Any], attribute: str) -> str | None:
    """The first mailbox a `LIST` answer marks with `attribute` (`\\Sent`, RFC 6154), as the
    argument to name it in a command. None when none is marked."""
    wanted = attribute.lower()
    return next((m.argument for m in listed_of(lines) if wanted in m.attributes), None)


def sent_by_name(lines: list[Any]) -> str | None:
    """For a server that marks no folder `\\Sent`: the one a mail client would have made,
    by its name (`SENT_NAMES`, first match), as a command names it. None when there is none."""
    usable = [m for m in listed_of(lines) if not m.attributes & {"\\noselect", "\\nonexistent"}]
    for wanted in SENT_NAMES:
        for mailbox in usable:
            if mailbox.leaf.lower() == wanted:
                return mailbox.argument
    return None


def uid_set(uids: Sequence[int]) -> str:
    """An IMAP sequence set for `uids` with runs as ranges: `[1, 2, 3, 7]` -> `1:3,7`."""
    parts: list[str] = []
    ordered = sorted(set(uids))
    start = 0
    for index, uid in enumerate(ordered):
        if index + 1 < len(ordered) and ordered[index + 1] == uid + 1:
            continue
        first = ordered[start]
        parts.append(str(uid) if first == uid else f"{first}:{uid}")
        start = index + 1
    return ",".join(parts)


class _GreetingProtocol(aioimaplib.IMAP4ClientProtocol):  # type: ignore[misc]
    """Keeps a greeting aioimaplib refuses (`* BYE`, or another protocol's banner). aioimaplib
    raises it in a task nobody awaits: the session would wait out its timeout, and the log get
    a stray traceback, instead of failing at once with what the server said."""

    def __init__(self, loop: asyncio.AbstractEventLoop, conn_lost_cb: Any) -> None:
        super().__init__(loop, conn_lost_cb)
        self.refused_greeting: asyncio.Future[str] = loop.create_future()

    async def welcome(self, command: bytes) -> None:
        try:
            await super().welcome(command)
        except aioimaplib.Error:
            if not self.refused_greeting.done():
                self.refused_greeting.set_result(command.decode(errors="replace").strip())


class _Client(aioimaplib.IMAP4):  # type: ignore[misc]
    """aioimaplib's client on `_GreetingProtocol` (its `IMAP4_SSL` overrides the same method)."""

    protocol: _GreetingProtocol

    def create_client(
        self,
        host: str,
        port: int,
        loop: asyncio.AbstractEventLoop | None,
        conn_lost_cb: Any = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        running = loop if loop is not None else asyncio.get_running_loop()
        protocol = _GreetingProtocol(running, conn_lost_cb)
        self.protocol = protocol
        self._client_task = running.create_task(
            running.create_connection(lambda: protocol, host, port, ssl=ssl_context)
        )


class ImapSession:
    def __init__(self, config: ImapConfig, timeout: float) -> None:
        self.config = config
        self.timeout = timeout
        self.where = f"{config.host}:{config.effective_port}"
        self._password = config.password.get_secret_value()
        self._lost = asyncio.Event()
        self.client: aioimaplib.IMAP4 | None = None
        self.uidvalidity = 0
        self.uidnext = 0
        self.exists = 0

    # ---- connecting ------------------------------------------------------------------------

    async def open(self, *, select: bool = True) -> None:
        """Connect, log in and (unless not to) select the folder; raises translated errors."""
        config = self.config
        context = ssl.create_default_context() if config.security != "none" else None
        with imap_errors(self.where, self._password):
            self.client = client = _Client(
                host=config.host,
                port=config.effective_port,
                timeout=self.timeout,
                conn_lost_cb=lambda exc: self._lost.set(),
                ssl_context=context if config.security == "ssl" else None,
            )
            await self._greeted(client)
            if config.security == "starttls":
                await self._starttls(context)
            response = await self.guard(self.client.login(config.username, self._password))
            if response.result != "OK":
                text = _text(response.lines)
                if "[UNAVAILABLE]" in text.upper():  # RFC 5530: the server's auth is down
                    raise TransientError(f"IMAP server {self.where} cannot log in for now: {text}")
                raise UnauthorizedError(
                    f"IMAP server {self.where} refused the login for {config.username!r}"
                    + (f": {text}" if text else "")
                )
            if not select:
                return
            response = await self.guard(self.client.select(mailbox_argument(config.folder)))
            if response.result != "OK":
                raise NotFoundError(
                    f"IMAP folder {config.folder!r} cannot be opened on {self.where}: "
                    f"{_text(response.lines)}"
                )
        for line in response.lines:
            line_b = bytes(line)
            if m := _UIDVALIDITY.search(line_b):
                self.uidvalidity = int(m.group(1))
            if m := _UIDNEXT.search(line_b):
                self.uidnext = int(m.group(1))
            if m := _EXISTS.match(line_b):
                self.exists = int(m.group(1))

    async def _greeted(self, client: _Client) -> None:
        """Wait for the server's greeting; fail at once on one that is not IMAP's `OK`."""
        hello = asyncio.ensure_future(client.wait_hello_from_server())
        refused = client.protocol.refused_greeting
        lost = asyncio.ensure_future(self._lost.wait())
        try:
            await asyncio.wait({hello, refused, lost}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            lost.cancel()
            if not hello.done():
                hello.cancel()
        # Checked first: a server that says BYE and hangs up has its greeting read before the
        # loss is noticed (aioimaplib handles the line before the connection is closed).
        if refused.done():
            raise greeting_error(self.where, refused.result())
        if not hello.done():
            raise TransientError(f"the IMAP server {self.where} closed the connection")
        try:
            hello.result()
        except TimeoutError:
            hint = " (a TLS port, such as 993, needs security: ssl)"
            raise TransientError(
                f"IMAP server {self.where} sent no greeting within {self.timeout:g} s"
                + (hint if self.config.security != "ssl" else "")
            ) from None

    async def _starttls(self, context: ssl.SSLContext | None) -> None:
        # aioimaplib lists STARTTLS but has no helper: ask, then upgrade the transport in place.
        assert self.client is not None and context is not None
        protocol = self.client.protocol
        if "STARTTLS" not in protocol.capabilities:
            raise PermanentError(f"IMAP server {self.where} does not offer STARTTLS")
        # `simple_command` refuses STARTTLS (aioimaplib 2.0): build the command itself.
        command = aioimaplib.Command("STARTTLS", protocol.new_tag(), loop=protocol.loop)
        response = await self.guard(protocol.execute(command))
        if response.result != "OK":
            raise PermanentError(f"IMAP server {self.where} refused STARTTLS")
        loop = asyncio.get_running_loop()
        transport = await loop.start_tls(
            protocol.transport, protocol, context, server_hostname=self.config.host
        )
        protocol.transport = transport
        await self.guard(protocol.capability())  # capabilities may change after TLS

    async def close(self) -> None:
        client, self.client = self.client, None
        if client is None:
            return
        try:
            if not self._lost.is_set() and client.get_state() in ("AUTH", "SELECTED"):
                if client.has_pending_idle():
                    client.idle_done()
                await asyncio.wait_for(client.logout(), 2)
        except Exception:  # closing is best effort: the server may be gone already
            pass
        finally:
            transport = client.protocol.transport
            if transport is not None:
                transport.close()

    # ---- commands --------------------------------------------------------------------------

    async def guard(self, awaitable: Awaitable[T]) -> T:
        """Await an IMAP call, or raise TransientError as soon as the connection is lost."""
        task = asyncio.ensure_future(awaitable)
        lost = asyncio.ensure_future(self._lost.wait())
        try:
            await asyncio.wait({task, lost}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            lost.cancel()
        if task.done():
            return task.result()
        task.cancel()
        raise TransientError(f"the IMAP server {self.where} closed the connection")

    @property
    def lost(self) -> bool:
        """Whether the connection is gone (the server closed it, or it broke)."""
        return self._lost.is_set()

    @property
    def has_idle(self) -> bool:
        return self.client is not None and bool(self.client.has_capability("IDLE"))

    def _client(self) -> aioimaplib.IMAP4:
        if self.client is None:
            raise TransientError("not connected to the IMAP server")
        return self.client

    async def uids(self, criteria: str) -> list[int]:
        response = await self._search(criteria)
        _check(response, f"UID SEARCH {criteria}", self.where)
        return _found(response.lines)

    async def uids_if_understood(self, criteria: str) -> list[int] | None:
        """As `uids`, but None when the server refuses the criteria (`BAD` or `NO`): a minimal
        server or stand-in may not implement every search key (SINCE, say)."""
        response = await self._search(criteria)
        if response.result in ("BAD", "NO"):
            return None
        _check(response, f"UID SEARCH {criteria}", self.where)
        return _found(response.lines)

    async def _search(self, criteria: str) -> Any:
        with imap_errors(self.where, self._password):
            return await self.guard(self._client().uid_search(criteria, charset=None))

    async def internal_dates(self, uids: Sequence[int]) -> dict[int, datetime] | None:
        """UID -> INTERNALDATE (when the server received the mail) of those of `uids` still
        there; a mail expunged meanwhile, or with a date the server gave unreadably, is absent.
        None when the server refuses to FETCH INTERNALDATE (`BAD` or `NO`), as a minimal one may.
        """
        wanted = set(uids)
        ordered = sorted(wanted)
        found: dict[int, datetime] = {}
        for start in range(0, len(ordered), _UIDS_PER_FETCH):
            chunk = uid_set(ordered[start : start + _UIDS_PER_FETCH])
            with imap_errors(self.where, self._password):
                response = await self.guard(
                    self._client().uid("fetch", chunk, "(UID INTERNALDATE)")
                )
            if response.result in ("BAD", "NO"):
                return None
            _check(response, f"UID FETCH {chunk} (INTERNALDATE)", self.where)
            found.update(internal_dates_of(response.lines))
        return {uid: when for uid, when in found.items() if uid in wanted}

    async def fetch(self, uid: int) -> bytes | None:
        """The raw mail with this UID (BODY.PEEK: does not set \\Seen), or None if gone."""
        with imap_errors(self.where, self._password):
            response = await self.guard(self._client().uid("fetch", str(uid), "(BODY.PEEK[])"))
        _check(response, f"UID FETCH {uid}", self.where)
        return body_of(response.lines, uid)

    async def uids_of_message_id(self, message_id: str) -> list[int]:
        """The UIDs of the selected folder's mail with this Message-ID."""
        quoted = message_id.replace("\\", "\\\\").replace('"', '\\"')
        return await self.uids(f'HEADER Message-ID "{quoted}"')

    async def special_use(self, attribute: str) -> str | None:
        """The folder the server marks with `attribute` (`\\Sent`), named as `append` takes
        it; None when it marks none (or lists no such attributes: no SPECIAL-USE)."""
        return special_use_of(await self.list_all(), attribute)

    async def sent_folder(self) -> tuple[str, bool] | None:
        """The Sent folder, as `append` names it, and whether the server marks it `\\Sent`
        (RFC 6154; False: found by its name, `SENT_NAMES`); None when there is neither."""
        lines = await self.list_all()
        marked = special_use_of(lines, "\\Sent")
        if marked is not None:
            return marked, True
        named = sent_by_name(lines)
        return (named, False) if named is not None else None

    async def list_all(self) -> list[Any]:
        """The lines of a `LIST` of every mailbox; with their special-use attributes asked for
        (`RETURN (SPECIAL-USE)`, RFC 6154) when the server announces SPECIAL-USE: a server may
        leave them out of a plain LIST. A server that refuses the option gets a plain LIST."""
        client = self._client()
        with imap_errors(self.where, self._password):
            if client.has_capability("SPECIAL-USE"):
                command = client.protocol.simple_command(
                    "LIST", '""', '"*"', "RETURN", "(SPECIAL-USE)"
                )
                response = await self.guard(asyncio.wait_for(command, self.timeout))
                if response.result == "OK":
                    return list(response.lines)
            response = await self.guard(client.list('""', '"*"'))
        _check(response, "LIST", self.where)
        return list(response.lines)

    async def holds(self, folder: str, message_id: str) -> bool:
        """Whether `folder` (as `special_use` names it) has a mail with this Message-ID; False
        when the folder is not there. Selects it."""
        return await self.select(folder) and bool(await self.uids_of_message_id(message_id))

    async def select(self, folder: str) -> bool:
        """Select `folder` (as `special_use` names it); False when it is not there."""
        with imap_errors(self.where, self._password):
            response = await self.guard(self._client().select(folder))
        return bool(response.result == "OK")

    async def append(self, folder: str, raw: bytes, *, create: bool) -> None:
        """Put `raw` into `folder` (as `special_use` names it), marked `\\Seen`. With `create`,
        a folder the server says is not there (`[TRYCREATE]`) is created first."""
        client = self._client()
        with imap_errors(self.where, self._password):
            response = await self.guard(client.append(raw, mailbox=folder, flags="\\Seen"))
            if create and response.result == "NO" and "[TRYCREATE]" in _text(response.lines):
                created = await self.guard(client.create(folder))
                _check(created, f"CREATE {folder}", self.where)
                response = await self.guard(client.append(raw, mailbox=folder, flags="\\Seen"))
        _check(response, f"APPEND to {folder}", self.where)

    async def mark_seen(self, uid: int) -> None:
        with imap_errors(self.where, self._password):
            response = await self.guard(
                self._client().uid("store", str(uid), "+FLAGS.SILENT", "(\\Seen)")
            )
        _check(response, f"UID STORE {uid}", self.where)

    async def noop(self) -> None:
        with imap_errors(self.where, self._password):
            await self.guard(self._client().noop())

    async def idle(self, renew_after: float) -> bool:
        """Wait in IDLE until the server reports news (True) or `renew_after` passed (False);
        IDLE is ended either way, so the caller can issue other commands."""
        client = self._client()
        with imap_errors(self.where, self._password):
            done = await self.guard(client.idle_start(timeout=renew_after))
            try:
                push: Any = await self.guard(client.wait_server_push(timeout=renew_after + 30))
            except TimeoutError:
                push = aioimaplib.STOP_WAIT_SERVER_PUSH
            client.idle_done()
            await self.guard(asyncio.wait_for(done, self.timeout))
        return bool(push != aioimaplib.STOP_WAIT_SERVER_PUSH)

    async def wait_lost(self) -> None:
        await self._lost.wait()


def mailbox_argument(folder: str) -> str:
    """`folder` as a command argument: in modified UTF-7, quoted when it has to be."""
    return _quote_raw(mailbox_name(folder))


def _quote_raw(folder: str) -> str:
    if re.fullmatch(r"[A-Za-z0-9_./-]+", folder):
        return folder
    return '"' + folder.replace("\\", "\\\\").replace('"', '\\"') + '"'


def mailbox_name(folder: str) -> str:
    """`folder` in IMAP's modified UTF-7 (RFC 3501, 5.1.3): `Unterstützung` is sent as
    `Unterst&APw-tzung`, the name the server lists."""
    out: list[str] = []
    wide: list[str] = []

    def shift() -> None:
        if wide:
            packed = base64.b64encode("".join(wide).encode("utf-16-be")).decode()
            out.append("&" + packed.rstrip("=").replace("/", ",") + "-")
            wide.clear()

    for ch in folder:
        if 0x20 <= ord(ch) <= 0x7E:
            shift()
            out.append("&-" if ch == "&" else ch)
        else:
            wide.append(ch)
    shift()
    return "".join(out)


def greeting_error(where: str, greeting: str) -> TransientError | PermanentError:
    """What to raise for a greeting that is not `* OK`/`* PREAUTH`: a `* BYE` is the server
    turning connections away for now (RFC 3501, 7.1.5); anything else is not an IMAP server."""
    shown = greeting[:200]
    if greeting.upper().startswith("* BYE"):
        return TransientError(f"IMAP server {where} turned the connection away: {shown}")
    hint = " (is the port right? IMAP is 143, or 993 with security: ssl)"
    return PermanentError(f"{where} is not an IMAP server: it greeted with {shown!r}{hint}")


def _text(lines: list[Any]) -> str:
    parts = [bytes(line).decode(errors="replace") for line in lines if line]
    return " ".join(parts).strip()


def _found(lines: list[Any]) -> list[int]:
    """The UIDs in the lines of a `UID SEARCH` answer, sorted."""
    found: list[int] = []
    for line in lines:
        text = bytes(line).decode(errors="replace")
        if text and all(part.isdigit() for part in text.split()):
            found.extend(int(part) for part in text.split())
    return sorted(set(found))


def _check(response: Any, command: str, where: str) -> None:
    if response.result != "OK":
        raise TransientError(f"IMAP {command} failed on {where}: {_text(response.lines)}")
