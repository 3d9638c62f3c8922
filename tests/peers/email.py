"""Real mail servers on 127.0.0.1 for the email connector: Dovecot (IMAP) and aiosmtpd (SMTP).

`DovecotPeer` runs the Debian `dovecot` binary (`dovecot -F -c CONF`) on a free port with a
passwd-file of users and one Maildir each; `deliver(user, raw)` drops a mail into the Maildir as
an MTA would, `kick(user)` makes the server drop the user's IMAP connections (`doveadm kick`),
`no_idle=True` hides IDLE from the capability list (a server without IDLE); `sent="Sent"` has
the server create that folder and mark it `\\Sent` (RFC 6154), as most servers do, and
`folder(user, name)` reads a folder's mail.

`ImapCutter` sits between a client and Dovecot and cuts the client off at one command (APPEND),
before or after the server carried it out: where a bridge killed at that point leaves things.
`ImapRecorder` records the connections clients open and the commands they send through it.

`SmtpPeer` is aiosmtpd's SMTP server in the test's own event loop: it records every mail
(`received`), checks AUTH against its users, can refuse the next DATA with a scripted code
(`fail_next`), offers SMTPUTF8 on request (`smtputf8`), and can hand each mail on into a
Dovecot Maildir (`route`) so two mailboxes can write to each other. `wait_for(condition)`
waits on what was received, without sleeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import mailbox
import os
import pwd
import shutil
import signal
import ssl
import subprocess
import tempfile
import warnings
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from datetime import date, datetime
from email import message_from_bytes, policy
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import trustme
from aiosmtpd.smtp import SMTP, AuthResult, Envelope, LoginPassword, Session

from tests.peers.http import free_port
from tests.peers.proxy import TcpProxy
from tests.support.waiting import Waitable

DOVECOT = shutil.which("dovecot") or "/usr/sbin/dovecot"
DOVEADM = shutil.which("doveadm") or "/usr/bin/doveadm"
MAIL_USER = "nobody"


def dovecot_available() -> bool:
    return os.path.exists(DOVECOT) and os.access(DOVECOT, os.X_OK)


class DovecotPeer:
    """One Dovecot instance under a private root directory; stop() removes it."""

    def __init__(
        self,
        users: dict[str, str],
        *,
        no_idle: bool = False,
        tls: TlsFiles | None = None,
        sent: str | None = None,
        unmarked: str | None = None,
    ) -> None:
        self.users = dict(users)
        self.no_idle = no_idle
        self.sent = sent
        """A folder the server creates and marks `\\Sent` (RFC 6154 SPECIAL-USE)."""
        self.unmarked = unmarked
        """A folder the server creates and marks nothing (`Sent Items`, as a client made it)."""
        self.tls = tls
        """With TLS: STARTTLS on `port`, and TLS from the first byte on `tls_port`."""
        self.port = 0
        self.tls_port = 0
        # Not pytest's tmp_path: its parents are 0700 and Dovecot's workers run as other users.
        self.root = Path(tempfile.mkdtemp(prefix="talkbridge-dovecot-"))
        self.root.chmod(0o755)
        self.config = self.root / "dovecot.conf"
        self._process: subprocess.Popen[bytes] | None = None
        self._uid = pwd.getpwnam(MAIL_USER).pw_uid
        self._gid = pwd.getpwnam(MAIL_USER).pw_gid

    # ---- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        self.port = self.port or free_port()
        if self.tls is not None:
            self.tls_port = self.tls_port or free_port()
        for user in self.users:
            self._make_maildir(user)
        self._write_passwd()
        self._write_config()
        self._process = subprocess.Popen(
            [DOVECOT, "-F", "-c", str(self.config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own process group: stop() ends master and workers
        )

    async def wait_ready(self, timeout: float = 10.0) -> None:
        """Wait until the IMAP listener answers with its greeting."""

        async def greet() -> None:
            while True:
                if self._process is not None and self._process.poll() is not None:
                    err = self._process.stderr.read().decode() if self._process.stderr else ""
                    raise RuntimeError(f"dovecot exited: {err or self.log()}")
                try:
                    reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
                except OSError:
                    await asyncio.sleep(0.02)  # the listener is not bound yet: nothing to await
                    continue
                try:
                    line = await reader.readline()
                finally:
                    writer.close()
                    await writer.wait_closed()
                if line.startswith(b"* OK"):
                    return

        await asyncio.wait_for(greet(), timeout)

    async def __aenter__(self) -> DovecotPeer:
        self.start()
        await self.wait_ready()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.stop()

    def stop(self, *, keep_files: bool = False) -> None:
        if self._process is not None and self._process.poll() is None:
            # A graceful stop takes Dovecot about a second; the files are thrown away anyway.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._process.pid, signal.SIGKILL)
            self._process.wait(10)
        if self._process is not None and self._process.stderr is not None:
            self._process.stderr.close()
        self._process = None
        if not keep_files:
            shutil.rmtree(self.root, ignore_errors=True)

    # ---- users and mail --------------------------------------------------------------------

    def maildir(self, user: str) -> Path:
        return self.root / "home" / user / "Maildir"

    def _make_maildir(self, user: str) -> None:
        home = self.root / "home" / user
        for sub in ("cur", "new", "tmp"):
            (home / "Maildir" / sub).mkdir(parents=True, exist_ok=True)
        for path in (self.root / "home", home, *home.rglob("*")):
            os.chown(path, self._uid, self._gid)

    def _write_passwd(self) -> None:
        lines = [f"{user}:{{PLAIN}}{password}::::::" for user, password in self.users.items()]
        passwd = self.root / "passwd"
        tmp = self.root / "passwd.tmp"
        tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
        tmp.replace(passwd)  # atomic: Dovecot re-reads the file when it changes

    def set_password(self, user: str, password: str) -> None:
        self.users[user] = password
        self._write_passwd()

    def deliver(self, user: str, raw: bytes, received: datetime | None = None) -> str:
        """Drop one mail into the user's Maildir `new/`, as a local delivery agent would.

        `received` back-dates it: Dovecot takes a Maildir file's mtime as the mail's INTERNALDATE
        (an APPEND with a date sets the same), so it reads as if it had arrived then.
        """
        box = mailbox.Maildir(self.maildir(user), create=False)
        key = box.add(mailbox.MaildirMessage(raw))
        if received is not None:
            [path] = self.maildir(user).glob(f"new/{key}*")
            os.utime(path, (received.timestamp(), received.timestamp()))
        for path in self.maildir(user).rglob("*"):
            os.chown(path, self._uid, self._gid)
        return key

    def flags(self, user: str) -> list[str]:
        """The Maildir flags of every message ("S" = \\Seen), in no particular order."""
        box = mailbox.Maildir(self.maildir(user), create=False)
        return [message.get_flags() for message in box.values()]

    def folder(self, user: str, name: str) -> list[tuple[EmailMessage, str]]:
        """(mail, Maildir flags: "S" = \\Seen) of each mail in one of the user's folders
        (Maildir++: `.name`, in modified UTF-7); none if the folder is not there."""
        path = self.maildir(user) / f".{name}"
        if not path.is_dir():
            return []
        found = []
        for message in mailbox.Maildir(path, create=False).values():
            parsed = message_from_bytes(message.as_bytes(), policy=policy.default)
            found.append((parsed, message.get_flags()))
        return found  # type: ignore[return-value]

    def doveadm(self, *args: str) -> None:
        """Run `doveadm ARGS` against this server (`mailbox rename -u help A B`)."""
        subprocess.run(
            [DOVEADM, "-c", str(self.config), *args],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def kick(self, user: str) -> None:
        """Make the server drop every IMAP connection of `user` (as a restart or timeout would)."""
        self.doveadm("kick", user)

    def _namespace(self) -> str:
        if self.sent is None and self.unmarked is None:
            return ""
        mailboxes = ""
        if self.sent is not None:
            mailboxes += (
                f'  mailbox "{self.sent}" {{\n    special_use = \\Sent\n    auto = create\n  }}\n'
            )
        if self.unmarked is not None:
            mailboxes += f'  mailbox "{self.unmarked}" {{\n    auto = create\n  }}\n'
        return f"namespace inbox {{\n  inbox = yes\n{mailboxes}}}\n"

    def log(self) -> str:
        path = self.root / "dovecot.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def _write_config(self) -> None:
        root = self.root
        for sub in ("run", "state"):
            (root / sub).mkdir(exist_ok=True)
        ssl_settings = "ssl = no"
        imaps = "port = 0"
        if self.tls is not None:
            ssl_settings = f"ssl = yes\nssl_cert = <{self.tls.cert}\nssl_key = <{self.tls.key}"
            imaps = f"address = 127.0.0.1\n    port = {self.tls_port}"
        capability = ""
        if self.no_idle:
            capability = (
                "imap_capability = IMAP4rev1 SASL-IR LOGIN-REFERRALS ID ENABLE LITERAL+ UIDPLUS\n"
            )
        self.config.write_text(
            f"""
base_dir = {root}/run
state_dir = {root}/state
log_path = {root}/dovecot.log
protocols = imap
listen = 127.0.0.1
{ssl_settings}
disable_plaintext_auth = no
auth_mechanisms = plain login
auth_failure_delay = 0
mail_location = maildir:{root}/home/%u/Maildir
default_internal_user = dovecot
default_login_user = dovenull
first_valid_uid = 1
passdb {{
  driver = passwd-file
  args = {root}/passwd
}}
userdb {{
  driver = static
  args = uid={MAIL_USER} gid={self._gid} home={root}/home/%u
}}
service imap-login {{
  inet_listener imap {{
    address = 127.0.0.1
    port = {self.port}
  }}
  inet_listener imaps {{
    {imaps}
  }}
}}
{capability}{self._namespace()}""",
            encoding="utf-8",
        )


# ---- cutting a client off at one command ------------------------------------------------------


class ImapCutter(TcpProxy):
    """A TCP proxy in front of an IMAP server that cuts the first client to send `command`
    off: before the server gets the command (what the server sees of a bridge killed just
    before it), or, with `after`, once the server carried it out but before the client hears
    so (killed just after). Later connections pass through untouched. `cut` is set then."""

    until_first_ends = True

    def __init__(self, port: int, command: str = "APPEND", *, after: bool = False) -> None:
        super().__init__(port)
        self._command = f" {command.upper()} ".encode()
        self._after = after
        self.cut = asyncio.Event()

    def _pumps(
        self,
        client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        server: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    ) -> tuple[Coroutine[Any, Any, None], Coroutine[Any, Any, None]]:
        tag: list[bytes] = []  # the tag of the command to cut at, once the client sent it
        return self._upstream(client[0], server[1], tag), self._downstream(
            server[0], client[1], tag
        )

    async def _upstream(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, tag: list[bytes]
    ) -> None:
        while line := await reader.readline():  # (a literal's lines are read as lines too)
            if not self.cut.is_set() and not tag and self._command in line.split(b"{")[0]:
                tag.append(line.split(b" ", 1)[0])
                if not self._after:
                    self.cut.set()
                    return
            writer.write(line)
            await writer.drain()

    async def _downstream(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, tag: list[bytes]
    ) -> None:
        while line := await reader.readline():
            if tag and line.startswith(tag[0] + b" ") and not self.cut.is_set():
                self.cut.set()
                return
            writer.write(line)
            await writer.drain()


class ImapRecorder(TcpProxy):
    """A TCP proxy in front of an IMAP server that records what clients do: `connections`
    opened, and each command (tag left out) with the server's verdict on it (`OK`, `NO`,
    `BAD`; None until it came), in `commands`."""

    until_first_ends = True  # a server hanging up hangs up on the client

    def __init__(self, port: int) -> None:
        super().__init__(port)
        self.connections = 0
        self.commands: list[list[str | None]] = []

    def searches(self, criteria: str = "") -> list[tuple[str, str | None]]:
        """(command, verdict) of each UID SEARCH (with `criteria` first)."""
        start = f"UID SEARCH {criteria}".upper()
        return [(c, v) for c, v in self.commands if c and c.upper().startswith(start)]

    def _pumps(
        self,
        client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        server: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    ) -> tuple[Coroutine[Any, Any, None], Coroutine[Any, Any, None]]:
        self.connections += 1
        pending: dict[bytes, list[str | None]] = {}
        return self._upstream(client[0], server[1], pending), self._downstream(
            server[0], client[1], pending
        )

    async def _upstream(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        pending: dict[bytes, list[str | None]],
    ) -> None:
        while line := await reader.readline():
            tag, _, rest = line.rstrip(b"\r\n").partition(b" ")
            if rest:
                entry: list[str | None] = [rest.decode(errors="replace"), None]
                pending[tag] = entry
                self.commands.append(entry)
            writer.write(line)
            await writer.drain()

    async def _downstream(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        pending: dict[bytes, list[str | None]],
    ) -> None:
        while line := await reader.readline():
            tag, _, rest = line.partition(b" ")
            if tag in pending:
                pending.pop(tag)[1] = rest.split(b" ", 1)[0].decode(errors="replace")
            writer.write(line)
            await writer.drain()


# ---- a minimal IMAP server -------------------------------------------------------------------

_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


@dataclass
class StandInMail:
    uid: int
    raw: bytes
    received: datetime
    """The INTERNALDATE (timezone-aware)."""
    seen: bool = False


@dataclass
class ImapStandIn(Waitable):
    """A minimal IMAP4rev1 server in the test's event loop, for what Dovecot will not do.

    One folder held in memory; LOGIN (any password), SELECT, UID SEARCH (`ALL`, `UNSEEN`,
    `SINCE d-Mon-yyyy`, `UID n:*`, ANDed), UID FETCH (`INTERNALDATE`, `BODY.PEEK[]`), UID STORE
    of `\\Seen`, NOOP and LOGOUT; no IDLE, so a connector polls it. `refuse_since = "BAD"` (or
    `"NO"`) answers every search with SINCE so, as some small servers do; `uidnext=False`
    leaves UIDNEXT out of SELECT's answer (RFC 3501 requires it; not every server sends it).
    `commands` records what clients sent, tag left out.
    """

    mails: list[StandInMail] = field(default_factory=list)
    refuse_since: str | None = None
    refuse_internaldate: bool = False
    """Answer a FETCH of INTERNALDATE with BAD, as a stand-in that never heard of it would."""
    uidnext: bool = True
    uidvalidity: int = 7
    folders: dict[str, str] | None = None
    """Folder name -> its special-use attribute (`\\Sent`, or ""): LIST answers with them, and
    the server announces SPECIAL-USE. None: LIST is an unknown command."""
    special_use_when_asked: bool = True
    """List the attributes only for `LIST … RETURN (SPECIAL-USE)` (RFC 6154 allows leaving
    them out of a plain LIST)."""
    port: int = 0
    commands: list[str] = field(default_factory=list)
    _server: asyncio.Server | None = None
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    def add(self, raw: bytes, received: datetime, seen: bool = False) -> StandInMail:
        uid = max((m.uid for m in self.mails), default=0) + 1
        self.mails.append(StandInMail(uid, raw, received, seen))
        return self.mails[-1]

    async def __aenter__(self) -> ImapStandIn:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(f"* OK [CAPABILITY {self._capabilities}] stand-in ready\r\n".encode())
        try:
            while line := await reader.readline():
                tag, _, command = line.decode().rstrip("\r\n").partition(" ")
                self.commands.append(command)
                untagged, status = self._answer(command)
                writer.write(untagged + f"{tag} {status}\r\n".encode())
                await writer.drain()
                self._notify()
                if command.upper() == "LOGOUT":
                    break
        except ConnectionError:
            pass
        finally:
            writer.close()

    def _answer(self, command: str) -> tuple[bytes, str]:
        name, _, args = command.partition(" ")
        name = name.upper()
        if name == "UID":
            sub, _, args = args.partition(" ")
            name = f"UID {sub.upper()}"
        if name == "CAPABILITY":
            return f"* CAPABILITY {self._capabilities}\r\n".encode(), "OK done"
        if name == "LIST" and self.folders is not None:
            asked = "RETURN (SPECIAL-USE)" in args.upper()
            shown = asked or not self.special_use_when_asked
            lines = "".join(
                f'* LIST ({use if shown else ""}) "/" "{folder}"\r\n'
                for folder, use in self.folders.items()
            )
            return lines.encode(), "OK done"
        if name in ("LOGIN", "NOOP"):
            return b"", "OK done"
        if name == "LOGOUT":
            return b"* BYE bye\r\n", "OK done"
        if name == "SELECT":
            top = max((m.uid for m in self.mails), default=0)
            lines = f"* {len(self.mails)} EXISTS\r\n* OK [UIDVALIDITY {self.uidvalidity}] ok\r\n"
            if self.uidnext:
                lines += f"* OK [UIDNEXT {top + 1}] ok\r\n"
            return lines.encode(), "OK [READ-WRITE] selected"
        if name == "UID SEARCH":
            return self._search(args.split())
        if name == "UID FETCH":
            which, _, items = args.partition(" ")
            if self.refuse_internaldate and "INTERNALDATE" in items.upper():
                return b"", "BAD unknown fetch item INTERNALDATE"
            return self._fetch(self._uid_set(which), items.upper()), "OK done"
        if name == "UID STORE":
            which, _, flags = args.partition(" ")
            if "\\SEEN" in flags.upper():
                for mail in self._uid_set(which):
                    mail.seen = True
            return b"", "OK done"
        return b"", "BAD unknown command"

    @property
    def _capabilities(self) -> str:
        return "IMAP4rev1" + (" LIST-EXTENDED SPECIAL-USE" if self.folders is not None else "")

    def _search(self, keys: list[str]) -> tuple[bytes, str]:
        found = list(self.mails)
        keys = list(keys)
        while keys:
            key = keys.pop(0).upper()
            if key == "SINCE":
                if self.refuse_since:
                    return b"", f"{self.refuse_since} SEARCH key SINCE not supported"
                day, month, year = keys.pop(0).split("-")
                since = date(int(year), _MONTHS.index(month.capitalize()) + 1, int(day))
                found = [m for m in found if m.received.date() >= since]
            elif key == "UNSEEN":
                found = [m for m in found if not m.seen]
            elif key == "UID":
                wanted = {m.uid for m in self._uid_set(keys.pop(0))}
                found = [m for m in found if m.uid in wanted]
            elif key != "ALL":
                return b"", f"BAD unknown search key {key}"
        uids = " ".join(str(m.uid) for m in found)
        return f"* SEARCH {uids}".rstrip().encode() + b"\r\n", "OK done"

    def _uid_set(self, text: str) -> list[StandInMail]:
        top = max((m.uid for m in self.mails), default=0)
        wanted: set[int] = set()
        for part in text.split(","):
            first, _, last = part.partition(":")
            low = top if first == "*" else int(first)
            high = low if not last else (top if last == "*" else int(last))
            wanted.update(range(min(low, high), max(low, high) + 1))
        return [m for m in self.mails if m.uid in wanted]

    def _fetch(self, mails: list[StandInMail], items: str) -> bytes:
        out = b""
        for mail in mails:
            seq = self.mails.index(mail) + 1
            if "INTERNALDATE" in items:
                when = mail.received
                stamp = f"{when.day:02d}-{_MONTHS[when.month - 1]}-{when.year} {when:%H:%M:%S %z}"
                out += f'* {seq} FETCH (UID {mail.uid} INTERNALDATE "{stamp}")\r\n'.encode()
            if "BODY.PEEK[]" in items:
                out += f"* {seq} FETCH (UID {mail.uid} BODY[] {{{len(mail.raw)}}}\r\n".encode()
                out += mail.raw + b")\r\n"
        return out


# ---- TLS -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TlsFiles:
    """A server certificate for 127.0.0.1 and localhost, and the CA file that trusts it."""

    cert: Path
    key: Path
    ca: Path

    @classmethod
    def issue(cls, folder: Path) -> TlsFiles:
        folder.mkdir(parents=True, exist_ok=True)
        ca = trustme.CA()
        server = ca.issue_cert("127.0.0.1", "localhost")
        files = cls(folder / "server.pem", folder / "server.key", folder / "ca.pem")
        server.cert_chain_pems[0].write_to_path(str(files.cert))
        for extra in server.cert_chain_pems[1:]:
            extra.write_to_path(str(files.cert), append=True)
        server.private_key_pem.write_to_path(str(files.key))
        ca.cert_pem.write_to_path(str(files.ca))
        return files

    def server_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.cert, self.key)
        return context


# ---- SMTP ----------------------------------------------------------------------------------


@dataclass
class ReceivedMail:
    mail_from: str
    rcpt_tos: list[str]
    data: bytes
    login: str | None

    @property
    def message(self) -> EmailMessage:
        parsed: EmailMessage = message_from_bytes(self.data, policy=policy.default)  # type: ignore[assignment]
        return parsed


@dataclass
class _Failure:
    code: str
    remaining: int
    login: str | None


class _TrackedSMTP(SMTP):
    """aiosmtpd's protocol, telling its peer when a client connects and when it is gone."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.event_handler._sessions.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        peer = self.event_handler
        peer._sessions.discard(self)
        peer._notify()


@dataclass
class SmtpPeer(Waitable):
    """aiosmtpd in this event loop; `users` are the logins it accepts (none: AUTH not required)."""

    users: dict[str, str] = field(default_factory=dict)
    received: list[ReceivedMail] = field(default_factory=list)
    route: dict[str, Callable[[bytes], Any]] = field(default_factory=dict)
    """Recipient address -> callable handed each mail's bytes (e.g. a Dovecot `deliver`)."""
    port: int = 0
    auth_attempts: list[tuple[str, bool]] = field(default_factory=list)
    auth_answer: str | None = None
    """When set, every AUTH is answered with this failure (`454 4.7.0 …`: the server's
    authentication backend is down for now), whatever the password."""
    offers_auth: bool = True
    """False: logins only over TLS, so no AUTH in a plain connection's EHLO answer."""
    hang_up_after_data: int = 0
    """The next this many mails are taken, and the connection closed before the server's
    answer (a link lost at the worst moment: the client cannot tell the mail was taken)."""
    answer_delay: float = 0.0
    """Seconds the server takes to answer the end of a mail's data once it has taken the mail
    (a content scanner at work): a slow server, not a lost one."""
    refused: list[tuple[str | None, str]] = field(default_factory=list)
    smtputf8: bool = False
    """Offer SMTPUTF8 (RFC 6531): addresses with non-ASCII characters before the @."""
    _failures: list[_Failure] = field(default_factory=list)
    _rcpt_failures: list[tuple[str, str | None]] = field(default_factory=list)
    tls: ssl.SSLContext | None = None
    """With TLS: STARTTLS required on `port`, and TLS from the first byte on `tls_port`."""
    tls_port: int = 0
    _servers: list[asyncio.Server] = field(default_factory=list)
    _sessions: set[SMTP] = field(default_factory=set)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    wait_timeout = 15.0

    @property
    def open_connections(self) -> int:
        """Client connections the server has not seen closed (a leaking client keeps some)."""
        return len(self._sessions)

    async def __aenter__(self) -> SmtpPeer:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(self._protocol, "127.0.0.1", 0)
        self._servers.append(server)
        self.port = server.sockets[0].getsockname()[1]
        if self.tls is not None:
            implicit = await loop.create_server(
                lambda: self._protocol(implicit_tls=True), "127.0.0.1", 0, ssl=self.tls
            )
            self._servers.append(implicit)
            self.tls_port = implicit.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        for server in self._servers:
            server.close()
            await server.wait_closed()

    def _protocol(self, *, implicit_tls: bool = False) -> SMTP:
        with warnings.catch_warnings():
            # "Requiring AUTH while not requiring TLS": intended here, plain SMTP on 127.0.0.1.
            warnings.simplefilter("ignore", UserWarning)
            return _TrackedSMTP(
                self,
                hostname="smtp.test",
                authenticator=self._authenticate,
                auth_required=bool(self.users),
                # Offered over TLS only (no TLS here): no AUTH in the EHLO answer at all.
                auth_require_tls=not self.offers_auth,
                # TLS from the first byte is the server's (`tls_port`); STARTTLS is aiosmtpd's.
                tls_context=None if implicit_tls else self.tls,
                require_starttls=self.tls is not None and not implicit_tls,
                enable_SMTPUTF8=self.smtputf8,
            )

    def _authenticate(
        self, server: SMTP, session: Session, envelope: Envelope, mechanism: str, data: Any
    ) -> AuthResult:
        ok = False
        login = ""
        if isinstance(data, LoginPassword):
            login = data.login.decode()
            ok = self.users.get(login) == data.password.decode()
        if self.auth_answer is not None:
            ok = False
        self.auth_attempts.append((login, ok))
        self._notify()
        if self.auth_answer is not None:
            return AuthResult(success=False, handled=False, message=self.auth_answer)
        # handled=False: aiosmtpd answers 535 itself; with True the client would hang.
        return AuthResult(success=ok, handled=False, auth_data=login if ok else None)

    def fail_next(
        self, code: str = "451 4.3.0 try again later", times: int = 1, login: str | None = None
    ) -> None:
        """Answer the next `times` DATA commands (of `login`, or anyone's) with `code`."""
        self._failures.append(_Failure(code, times, login))

    def refuse_next_recipient(self, code: str, address: str | None = None) -> None:
        """Answer the next RCPT TO (of `address`, or anyone's) with `code` (a 4xx defers it,
        a 5xx refuses it)."""
        self._rcpt_failures.append((code, address))

    async def handle_RCPT(
        self,
        server: SMTP,
        session: Session,
        envelope: Envelope,
        address: str,
        rcpt_options: list[str],
    ) -> str:
        for failure in self._rcpt_failures:
            code, whose = failure
            if whose is None or whose == address.lower():
                self._rcpt_failures.remove(failure)
                return code
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        login = session.auth_data if isinstance(session.auth_data, str) else None
        for failure in self._failures:
            if failure.login is None or failure.login == login:
                failure.remaining -= 1
                if failure.remaining <= 0:
                    self._failures.remove(failure)
                self.refused.append((login, failure.code))
                self._notify()
                return failure.code
        data = envelope.original_content or b""
        mail = ReceivedMail(envelope.mail_from or "", list(envelope.rcpt_tos), data, login)
        self.received.append(mail)
        for rcpt in mail.rcpt_tos:
            target = self.route.get(rcpt.lower())
            if target is not None:
                target(data)
        self._notify()
        if self.hang_up_after_data:
            self.hang_up_after_data -= 1
            server.transport.close()
        if self.answer_delay:
            await asyncio.sleep(self.answer_delay)
        return "250 OK"
