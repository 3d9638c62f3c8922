"""The email transport: IMAP in (IDLE, or polling when the server has no IDLE), SMTP out.

Inbound is at-least-once without replays: the cursor (UIDVALIDITY and the last handled UID) is
stored, and `\\Seen` set, only after `deliver` returned, i.e. after the router durably accepted
or deduped the message. A restart catches up on everything after the cursor; a crash between
`deliver` and the cursor re-delivers one mail, which the router drops as a duplicate (the native
id is the Message-ID). Mail we must not answer (auto-replies, lists, bounces, our own) advances
the cursor but stays unseen, for a human to look at. With no cursor yet (a first start) only the
unread mail received in the last `backlog_days` is answered (see `backlog`); older unread mail
stays unread, and the cursor moves past it.

`send` opens one SMTP session per mail and never sleeps or retries: it raises the translated
error and the router's per-connection queue decides. A reply that went out is then saved to
the Sent folder (`imap.sent_folder`) in the background, over a short IMAP session, once: not
again when a retry sends it to recipients that deferred it, nor when the folder already holds
its Message-ID (a copy saved before a crash, or one the SMTP server filed itself). In the
background, so that a stop cutting the save short cannot make a sent reply look unsent (and be
sent again). The mail is kept in the store from the moment SMTP took it until the folder has
it (`unsaved`): a crash or a stop in between leaves it there, and the next start of the
connection saves it. A failed save is tried again with backoff, `SAVE_TRIES` times in all
(across restarts), then given up with an error naming the folder: the mail itself went out.

A per-thread reply limit refuses (and so records) replies beyond `max_replies_per_thread` in
`reply_window` seconds, and a per-address limit those to one address across threads (a
responder may answer each reply in a new thread).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from email import policy
from email.message import EmailMessage

import aiosmtplib
from aiosmtplib.typing import Default

from talkbridge.backoff import Backoff
from talkbridge.connectors.base import BaseConnector, ConnectionStatus, ConnectorContext
from talkbridge.connectors.boundary import permanent, scrub
from talkbridge.connectors.email.backlog import backlog_cutoff, received_since, since_search
from talkbridge.connectors.email.codec import (
    InboundMail,
    MailContext,
    attachment_bytes,
    message_id_of,
    needs_smtputf8,
    new_message_id,
    parse_mail,
    parse_ref,
    read_mail,
    recipients_of,
    render_reply,
)
from talkbridge.connectors.email.config import EmailConfig
from talkbridge.connectors.email.deferrals import Deferrals, Deferred
from talkbridge.connectors.email.errors import smtp_errors
from talkbridge.connectors.email.imap import SENT_NAMES, ImapSession, mailbox_argument
from talkbridge.connectors.email.limits import KeptLimiter
from talkbridge.connectors.email.threads import Participants
from talkbridge.connectors.email.unsaved import Unsaved
from talkbridge.connectors.email.written import SentLookups
from talkbridge.errors import (
    ConnectorError,
    NotFoundError,
    PermanentError,
    StoreError,
    TransientError,
    UnauthorizedError,
)
from talkbridge.message import Attachment, NormalizedMessage, OutboundMessage, SendResult

SAVE_TRIES = 8
"""Tries to save one reply to Sent, all runs counted, before it is given up (logged)."""
SAVE_RETRY_BASE = 30.0
SAVE_RETRY_CAP = 1800.0
"""Seconds between tries (`Backoff`): the 8 tries span from about half an hour to an hour, so
a folder refusing the copy is not asked at every reconnect for ever, and an IMAP server down
for a while still gets it."""

DATA_TIMEOUT = 600.0
"""Seconds the server may take to confirm a mail's data (RFC 5321, 4.5.3.2.6: 10 minutes). It
has the mail by then, so giving up sooner, and retrying, sends it a second time."""


def create(config: EmailConfig, context: ConnectorContext) -> EmailConnector:
    return EmailConnector(config, context)


class EmailConnector(BaseConnector):
    """One mailbox = one connection. Feature: inbound_media (attachments, fetched over IMAP)."""

    channel = "email"

    def __init__(self, config: EmailConfig, context: ConnectorContext) -> None:
        super().__init__(config.id, context)
        self.config = config
        self._log = context.logger.getChild(f"email.{config.id}")
        self._prefix = f"email:{config.id}:"
        self._cursor_key = f"{self._prefix}cursor:{config.imap.folder}"
        self._limiter = KeptLimiter(
            context.store,
            f"{self._prefix}replies:thread:",
            config.max_replies_per_thread,
            config.reply_window,
            self._log,
        )
        self._per_address = KeptLimiter(
            context.store,
            f"{self._prefix}replies:to:",
            config.max_replies_per_address,
            config.reply_window,
            self._log,
        )
        self._deferred = Deferrals(context.store, self._prefix, context.dedupe_for, self._log)
        self._participants = Participants(context.store, config.id, self._prefix)
        self._secrets = [
            config.imap.password.get_secret_value(),
            config.smtp.password.get_secret_value() if config.smtp.password else None,
        ]
        self.idle_renewals = 0
        """How often IDLE was re-issued before the server's timeout (observability, tests)."""
        self.skipped: list[tuple[str, str]] = []
        """(UID, reason) of recent mail we refused to answer (bounded)."""
        self.handled = 0
        """Mails delivered to subscribers and marked seen since start."""
        self._progress = asyncio.Event()
        self._checking: dict[str, str | None] = {}
        """The latest `check`'s verdict per server (IMAP, SMTP); None while waited for."""
        self._smtputf8: bool | None = None
        """Whether the SMTP server offered SMTPUTF8 when last met (None: not met yet)."""
        self._sent_folder: str | bool | None = False
        """`sent_folder: auto`'s folder once found (None: the server marks none; False: not
        looked for yet)."""
        self.lookups = SentLookups(
            config.imap, config.timeout, config.address, self._sent_folder_in, self._log
        )
        """Mail of a thread's chain looked for in Sent (`written`): its session, its caps."""
        self._saving: set[asyncio.Task[None]] = set()
        self._saving_ids: set[str] = set()
        self._unsaved = Unsaved(context.store, self._prefix, context.dedupe_for, self._log)
        self._save_lock = asyncio.Lock()
        """One save at a time: two copies of one reply are never both found missing."""
        self._closing = asyncio.Event()
        """Set by `close`: a save waiting to try again stops waiting (the next start goes on)."""
        self.save_tries = SAVE_TRIES
        self.save_retry_base = SAVE_RETRY_BASE
        self.saved = 0
        """Replies whose saving to Sent is over in this run (saved, found there already, given
        up, or left to the next start by `close`)."""
        self.save_failures = 0
        """Tries to save a reply to Sent that failed in this run (observability, tests)."""
        self.provide("inbound_media", self)

    # ---- Transport -------------------------------------------------------------------------

    async def run(self, status: ConnectionStatus) -> None:
        session = ImapSession(self.config.imap, self.config.timeout)
        try:
            await session.open()
            await self._catch_up(session)
            await self._resume_saves()  # (started before `up`: a stop then waits for them)
            status.up()
            if session.has_idle:
                await self._idle_loop(session)
            else:
                self._log.info(
                    "%s has no IDLE: polling every %gs", session.where, self.config.poll_interval
                )
                await self._poll_loop(session)
        finally:
            await self.lookups.close()
            await session.close()

    async def wait_for(self, condition: Callable[[], bool], timeout: float = 30.0) -> None:
        """Wait until `condition()` holds; re-checked after every mail handled or skipped and
        every IDLE cycle (for apps and tests that need to know the mailbox was processed)."""

        async def wait() -> None:
            while not condition():
                await self._progress.wait()

        await asyncio.wait_for(wait(), timeout)

    def _notify(self) -> None:
        event, self._progress = self._progress, asyncio.Event()
        event.set()

    async def _idle_loop(self, session: ImapSession) -> None:
        while True:
            news = await session.idle(self.config.idle_renew)
            if not news:
                self.idle_renewals += 1
                self._notify()
            await self._catch_up(session)

    async def _poll_loop(self, session: ImapSession) -> None:
        while True:
            await session.guard(asyncio.sleep(self.config.poll_interval))
            await session.noop()
            await self._catch_up(session)

    async def _load_cursor(self) -> tuple[int, int] | None:
        stored = await self.context.store.get_state(self._cursor_key)
        if not stored:
            return None
        validity, _, last = stored.partition(":")
        try:
            return int(validity), int(last)
        except ValueError:
            return None

    async def _catch_up(self, session: ImapSession) -> None:
        """Handle every mail after the cursor, oldest first, until a search finds nothing new.

        Searching again matters: the server announces a mail that lands meanwhile (EXISTS) in
        its answer to one of these commands, where aioimaplib drops it, and does not announce it
        again in IDLE, which would leave it until the next renewal (25 minutes by default).
        """
        while await self._catch_up_once(session):
            pass

    async def _catch_up_once(self, session: ImapSession) -> bool:
        """Handle the mail after the cursor, advancing it one mail at a time; False: none."""
        cursor = await self._load_cursor()
        if cursor is None or cursor[0] != session.uidvalidity:
            if cursor is not None:
                self._log.warning(
                    "UIDVALIDITY of %s changed: catching up on unseen mail (duplicates are "
                    "dropped by Message-ID)",
                    self.config.imap.folder,
                )
            return await self._first_catch_up(session)
        last = cursor[1]
        uids = [u for u in await session.uids(f"UID {last + 1}:*") if u > last]
        for uid in uids:
            await self._handle(session, uid)
            last = max(last, uid)
            await self.context.store.set_state(self._cursor_key, f"{session.uidvalidity}:{last}")
        return bool(uids)

    async def _first_catch_up(self, session: ImapSession) -> bool:
        """No cursor (a first start, or the folder's UIDs were reset): answer the recent unread
        mail (`_backlog`), then put the cursor past all the mail there is, so that what was not
        answered now never is.

        The cursor is stored only at the end: until then a restart is a first start again (the
        mail handled is `\\Seen` by then), where a cursor stored at a mail handled mid-way
        would have it answer every mail above that UID, old and read ones alike.
        """
        # RFC 3501 requires UIDNEXT in SELECT's answer; a server that leaves it out is asked
        # for its highest UID, before the search below, so mail landing meanwhile lies beyond.
        top = session.uidnext - 1
        if session.uidnext <= 0:
            top = max(await session.uids("ALL"), default=0)
        uids = await self._backlog(session)
        for uid in uids:
            await self._handle(session, uid)
        await self.context.store.set_state(
            self._cursor_key, f"{session.uidvalidity}:{max(top, *uids, 0)}"
        )
        return bool(uids)

    async def _backlog(self, session: ImapSession) -> list[int]:
        """The unread mail a first start answers (or one after UIDs were reset: what is unread
        is what nobody handled): that received in the last `backlog_days`, oldest first."""
        unseen = await session.uids("UNSEEN")
        days = self.config.backlog_days
        if days == "all" or not unseen:
            return unseen
        cutoff = backlog_cutoff(datetime.now(UTC), days)
        answered: list[int] = []
        if days > 0:
            criteria = since_search(cutoff)
            narrowed = await session.uids_if_understood(criteria)
            if narrowed is None:
                self._log.warning(
                    "%s refused UID SEARCH %s: reading the receipt date of each of the %d "
                    "unread mails instead",
                    session.where,
                    criteria,
                    len(unseen),
                )
            found = unseen if narrowed is None else narrowed
            dates = await session.internal_dates(found) if found else {}
            if dates is None:
                # A server that has neither (both are RFC 3501's own) is a small stand-in,
                # not a mailbox with years of mail: its search narrowed to days is kept, and
                # without that search the unread mail is what nobody handled, as before.
                self._log.warning(
                    "%s refused UID FETCH (INTERNALDATE): answering the %d unread mail(s) %s",
                    session.where,
                    len(found),
                    "its SINCE search found" if narrowed is not None else "without a date check",
                )
                return found
            answered = received_since(found, dates, cutoff)
        left = len(set(unseen) - set(answered))
        if left:
            self._log.warning(
                "first start on %s: left %d unread mail(s) received before %s alone (they stay "
                "unread and are never answered); backlog_days (now %s) sets how far back a "
                "first start answers",
                self.config.imap.folder,
                left,
                cutoff.strftime("%Y-%m-%d %H:%M UTC"),
                f"{days:g}",
            )
        return answered

    async def _handle(self, session: ImapSession, uid: int) -> None:
        raw = await session.fetch(uid)
        if raw is None:  # expunged meanwhile, most likely: said, since the cursor moves on
            self._log.info("mail UID %d was not there to fetch (deleted meanwhile?); skipped", uid)
            return
        try:
            result = read_mail(
                raw,
                connection_id=self.connection_id,
                address=self.config.address,
                received_at=datetime.now(UTC),
                uid=uid,
                authenticated_by=self.config.authenticated_by,
                contact_forms=self.config.answer_contact_forms,
            )
        except Exception as exc:  # one unreadable mail must not stall the mailbox forever
            self._log.error("skipping mail UID %s that cannot be read: %s", uid, exc)
            return
        if isinstance(result, InboundMail):
            result = await self._reachable(result)
        message = await self._remember(result) if isinstance(result, InboundMail) else result
        if isinstance(message, str):
            self._log.info("not answering mail UID %s: %s", uid, message)
            self.skipped.append((str(uid), message))
            del self.skipped[:-100]
            self._notify()
            return
        await self.deliver_confirmed(message, f"mail {message.id}", *self._secrets)
        await session.mark_seen(uid)
        self.handled += 1
        self._notify()

    async def _reachable(self, mail: InboundMail) -> InboundMail | str:
        """The mail, or why its answer could never go out: checked before a turn is paid for.

        An address with letters beyond ASCII before the @ needs SMTPUTF8; whether the server
        offers it is known from the last SMTP session, else asked once. A server that cannot
        be asked now is no verdict: the turn runs, and the send says what it finds.
        """
        context = mail.context
        unreachable = needs_smtputf8((*context.reply_to, *context.cc))
        if not unreachable or await self._offers_smtputf8() is not False:
            return mail
        return (
            f"cannot answer {', '.join(unreachable)}: an address with letters beyond ASCII "
            f"before the @ needs SMTPUTF8, which the SMTP server {self._smtp_where} does not offer"
        )

    async def _offers_smtputf8(self) -> bool | None:
        if self._smtputf8 is None:
            try:
                async with self._smtp() as smtp:
                    with smtp_errors(self._smtp_where, *self._secrets):
                        if smtp.last_ehlo_response is None:
                            await smtp.ehlo()
                    self._met(smtp)
            except ConnectorError as exc:
                self._log.warning(
                    "could not ask %s whether it offers SMTPUTF8: %s", self._smtp_where, exc
                )
        return self._smtputf8

    def _met(self, smtp: aiosmtplib.SMTP) -> None:
        """Note what the server offered in its EHLO answer (when it gave one)."""
        if smtp.last_ehlo_response is not None:
            self._smtputf8 = smtp.supports_extension("smtputf8")

    async def _remember(self, mail: InboundMail) -> NormalizedMessage | str:
        """Store what a reply will need, and put the mail in its thread (`_thread_of`). The
        reason instead for another mail with the Message-ID of one read before: anyone who
        learnt the id (Bcc'd) can send one, and its addresses would take the earlier mail's
        answer (the router drops it as seen, after this). The same mail read again is taken."""
        message = mail.message
        store = self.context.store
        earlier = await store.get_state(f"{self._prefix}msg:{message.id}")
        before = MailContext.from_json(earlier) if earlier is not None else None
        if before is not None and not _same_mail(before, mail.context):
            return f"another mail with the Message-ID {message.id} was read before"
        thread_id = before.thread_id if before and before.thread_id else ""
        thread_id = thread_id or await self._thread_of(mail)
        if thread_id != message.thread_id:
            message = message.model_copy(update={"thread_id": thread_id})
        context = MailContext(
            message_id=mail.context.message_id,
            references=mail.context.references,
            subject=mail.context.subject,
            reply_to=mail.context.reply_to,
            cc=mail.context.cc,
            thread_id=thread_id,
        )
        # Kept for good, as the thread's history is: a reply after any silence threads by
        # its headers (only the dedupe ids run out, `retention.dedupe_days`).
        await store.set_state(f"{self._prefix}msg:{message.id}", context.to_json())
        await store.set_state(f"{self._prefix}root:{message.id}", thread_id)
        await store.set_state(f"{self._prefix}thread:{thread_id}", message.id)
        await self._participants.add(
            thread_id, (message.channel_user_id, *context.reply_to, *context.cc)
        )
        return message

    async def _thread_of(self, mail: InboundMail) -> str:
        """The thread a mail joins: of those it references (ours newest first, so a client
        that dropped References still lands in ours; then its chain's root), the first that
        has its sender and the addresses its answer goes to among its participants
        (`threads`); else a thread of its own. Mail of the chain the bridge never read is
        looked for in the Sent folder first (`written`)."""
        message, context = mail.message, mail.context
        writers = {message.channel_user_id, *context.reply_to}
        if message.sender_verified is False:  # the sender is a claim; the Cc gets the answer
            writers.update(context.cc)
        # What a person in the mailbox wrote in it:
        await self._learn_from_sent(mail.chain, message.channel_user_id)
        candidates = await self._candidates(mail)
        for thread_id in candidates:
            if await self._participants.admits(thread_id, writers):
                return thread_id
        self._log.info(
            "mail %s from %s references thread %s but %s not among its participants: "
            "answered in a thread of its own",
            message.id,
            message.channel_user_id,
            candidates[0],
            ", ".join(sorted(writers)) + (" is" if len(writers) == 1 else " are"),
        )
        return message.id

    async def _candidates(self, mail: InboundMail) -> list[str]:
        """The threads the mails of its chain lead to, newest first, then the chain's root."""
        candidates: list[str] = []
        for mid in reversed(mail.chain):
            known = await self.context.store.get_state(f"{self._prefix}root:{mid}")
            if known and known not in candidates:
                candidates.append(known)
        if mail.message.thread_id not in candidates:
            candidates.append(mail.message.thread_id)  # the chain's root (or the mail's own id)
        return candidates

    async def _learn_from_sent(self, chain: list[str], sender: str) -> None:
        """The mails of `chain` the bridge does not know, looked for in the Sent folder: one a
        person wrote from the mailbox (`written`) makes whom it went to participants of the
        thread it answers, and leads to that thread. None found, or none could be looked for
        (no Sent folder; the caps of `SentLookups`; the IMAP server failed: logged), changes
        nothing."""
        store = self.context.store
        if self.config.imap.sent_folder is False:
            return
        unknown = [
            mid
            for mid in reversed(chain)
            if await store.get_state(f"{self._prefix}root:{mid}") is None
        ]
        found = await self.lookups.find(unknown, sender) if unknown else []
        for written in found:
            for mid in reversed(written.chain):
                thread_id = await store.get_state(f"{self._prefix}root:{mid}")
                if thread_id:
                    await store.set_state(f"{self._prefix}root:{written.message_id}", thread_id)
                    await self._participants.add(thread_id, written.recipients)
                    break

    # ---- check -----------------------------------------------------------------------------

    async def check(self) -> str:
        """Log in to IMAP and to SMTP, both at once; report each (raises naming what failed).

        At once, so a server that never answers costs one timeout and the other's verdict is
        in by then: `check_waiting` names the one still waited for.
        """
        self._checking = {"IMAP": None, "SMTP": None}
        outcomes = await asyncio.gather(self._check_imap(), self._check_smtp())
        results = [text for text, _ in outcomes]
        failure = next((error for _, error in outcomes if error is not None), None)
        summary = "; ".join(results)
        if failure is not None:
            kind = type(failure)
            if kind not in (UnauthorizedError, NotFoundError, PermanentError):
                kind = TransientError
            raise kind(summary)
        if self.config.authenticated_by is None:
            summary += "; From not verified (anyone can write any From: see authenticated_by)"
        return f"{self.config.address}: {summary}"

    def check_waiting(self) -> str | None:
        """Which server the latest `check` was still waiting for, with the other's verdict."""
        parts = self._checking
        if not parts or all(text is not None for text in parts.values()):
            return None
        where = {"IMAP": self._imap_where, "SMTP": self._smtp_where}
        return "; ".join(
            text if text is not None else f"{name} server {where[name]} has not answered"
            for name, text in parts.items()
        )

    async def _check_imap(self) -> tuple[str, ConnectorError | None]:
        session = ImapSession(self.config.imap, self.config.timeout)
        try:
            await session.open()
            result: tuple[str, ConnectorError | None] = (
                f"IMAP ok ({self.config.imap.username}@{session.where}, "
                f"{self.config.imap.folder}: {session.exists} messages"
                f"{await self._unread(session)}; {await self._sent_verdict(session)})",
                None,
            )
        except ConnectorError as exc:
            result = (f"IMAP failed: {exc}", exc)
        finally:
            await session.close()
        self._checking["IMAP"] = result[0]
        return result

    async def _unread(self, session: ImapSession) -> str:
        """`, N unread` (the backlog waiting in the folder), or nothing if it cannot be told."""
        try:
            return f", {len(await session.uids('UNSEEN'))} unread"
        except ConnectorError:
            return ""

    async def _sent_verdict(self, session: ImapSession) -> str:
        """Where replies are saved, or why not (`imap.sent_folder`)."""
        configured = self.config.imap.sent_folder
        if configured is False:
            return "replies not saved to Sent (sent_folder: false)"
        if configured != "auto":
            return f"replies saved to {configured}"
        try:
            found = await session.sent_folder()
        except ConnectorError as exc:
            return f"cannot tell the Sent folder: {exc}"
        if found is None:
            return (
                "replies not saved to Sent: no folder marked \\Sent, nor one named Sent "
                "(see imap.sent_folder)"
            )
        folder, marked = found
        if marked:
            return f"replies saved to {folder} (marked \\Sent)"
        return f"replies saved to {folder} (by its name: no folder marked \\Sent)"

    async def _check_smtp(self) -> tuple[str, ConnectorError | None]:
        try:
            async with self._smtp() as smtp:
                # A sender probe, then RSET: a server that wants a login, or does not take
                # our address as sender, says so here (a NOOP passed both).
                with smtp_errors(self._smtp_where, *self._secrets):
                    await smtp.mail(self.config.address)
                    await smtp.rset()
                self._met(smtp)
            result: tuple[str, ConnectorError | None] = (f"SMTP ok ({self._smtp_where})", None)
        except ConnectorError as exc:
            result = (f"SMTP failed: {exc}", exc)
        self._checking["SMTP"] = result[0]
        return result

    async def close(self) -> None:
        """Let the replies being saved to Sent finish (for up to `timeout` seconds); those
        waiting to try again stop waiting (kept in the store for the next start)."""
        self._closing.set()
        if self._saving:
            await asyncio.wait(set(self._saving), timeout=self.config.timeout)

    # ---- send ------------------------------------------------------------------------------

    @property
    def _imap_where(self) -> str:
        return f"{self.config.imap.host}:{self.config.imap.effective_port}"

    @property
    def _smtp_where(self) -> str:
        return f"{self.config.smtp.host}:{self.config.smtp.effective_port}"

    def _smtp(self) -> _SmtpSession:
        return _SmtpSession(self.config, self._secrets)

    async def send(self, message: OutboundMessage) -> SendResult:
        now = self._limiter.now()  # (wall clock: the counts are kept across restarts)
        if not await self._limiter.allowed(message.thread_id, now):
            raise PermanentError(
                f"not sending: thread {message.thread_id} already had "
                f"{self.config.max_replies_per_thread} replies in {self.config.reply_window:g} s "
                "(reply limit against mail loops)"
            )
        context = await self._context_for(message)
        key = message.idempotency_key
        resumed = self._deferred.take(key) if key else None
        # After a restart: the recipients an earlier try left, the reply made anew for them.
        owed = await self._deferred.owed(key, message) if key and resumed is None else None
        to: tuple[str, ...] = ()
        if resumed is not None:  # a retry: only the recipients the server deferred
            mail, message_id, recipients = resumed
        else:
            if context is None:
                if "@" in message.thread_id and "<" not in message.thread_id:
                    to = (message.thread_id.lower(),)  # a new conversation with an address
                else:
                    raise NotFoundError(f"no mail of thread {message.thread_id} is known to answer")
            message_id = new_message_id(self.config.address, self._unique(key))
            mail = permanent(
                render_reply,
                message,
                address=self.config.address,
                context=context,
                to=to,
                message_id=message_id,
                date=datetime.now(UTC),
            )
            recipients = owed if owed is not None else recipients_of(mail)
        answered = context.reply_to if context is not None else to
        again = resumed is not None or owed is not None
        if not again:  # (a retry to deferred recipients is the same reply)
            await self._check_per_address(answered, now)
        try:
            async with self._smtp() as smtp:
                try:
                    with smtp_errors(self._smtp_where, *self._secrets):
                        refused, _ = await smtp.send_message(
                            mail, sender=self.config.address, recipients=recipients
                        )
                finally:
                    self._met(smtp)
        except ConnectorError as exc:
            if resumed is not None and key and exc.retryable:  # still theirs alone to get
                self._deferred.hold(key, Deferred(*resumed))
            raise
        if not again:  # it went out: counted, even should some recipients defer it
            for address in answered:
                await self._per_address.record(address, now)
            if self.config.imap.sent_folder is not False:
                raw = _as_bytes(mail)
                await self._unsaved.add(message_id, raw)  # first: a crash now loses no copy
                self._start_save(message_id, raw)
        await self._some_refused(message, message_id, mail, refused)
        if key and again:
            await self._deferred.settled(key)
        await self._limiter.record(message.thread_id, now)
        thread_id = context.thread_id if context and context.thread_id else message.thread_id
        await self._thread_kept(thread_id, message_id)
        await self._participants.add(thread_id, recipients)
        return SendResult(message_ids=(message_id,))

    async def _thread_kept(self, thread_id: str, message_id: str) -> None:
        """After a reply in the thread: our reply's Message-ID leads to the thread (for good,
        as a mail's own does), so an answer to it, however late, continues the thread."""
        await self.context.store.set_state(f"{self._prefix}root:{message_id}", thread_id)

    def _start_save(self, message_id: str, raw: bytes) -> None:
        """Save a reply to Sent in the background (unless that is under way already)."""
        if message_id in self._saving_ids:
            return
        self._saving_ids.add(message_id)
        task = asyncio.create_task(self._save_sent(raw, message_id))
        self._saving.add(task)

        def finished(task: asyncio.Task[None]) -> None:
            self._saving.discard(task)
            self._saving_ids.discard(message_id)

        task.add_done_callback(finished)

    async def _resume_saves(self) -> None:
        """Save the replies an earlier run sent but did not save to Sent (it died, was
        stopped, or the IMAP server failed it); each is looked for in the folder first."""
        try:
            waiting = await self._unsaved.waiting()
        except StoreError as exc:  # the next start tries again
            self._log.warning("cannot tell which replies are still to be saved to Sent: %s", exc)
            return
        if self.config.imap.sent_folder is False:  # turned off since: not to be saved
            for message_id, _ in waiting:
                await self._unsaved.done(message_id)
            return
        if waiting:
            self._log.info(
                "saving %d reply(ies) sent earlier to the Sent folder (not saved then)",
                len(waiting),
            )
        for message_id, raw in waiting:
            self._start_save(message_id, raw)

    async def _save_sent(self, raw: bytes, message_id: str) -> None:
        """Save a reply that went out to the Sent folder, marked read, unless the folder has
        its Message-ID already. A failure is tried again with backoff, up to `save_tries`
        tries counted across runs (`Unsaved.failed`), then given up: said once, as an error
        naming the folder and the failure. A `close` meanwhile leaves it to the next start."""
        backoff = Backoff(base=self.save_retry_base, cap=SAVE_RETRY_CAP)
        tries = 0
        while (failure := await self._save_once(raw, message_id)) is not None:
            self.save_failures += 1
            self._notify()
            tries = max(tries + 1, await self._unsaved.failed(message_id, raw))
            folder = self._sent_name()
            if tries >= self.save_tries:
                self._log.error(
                    "reply %s went out but could not be saved to the Sent folder %s after %d "
                    "tries; given up, no copy is kept there (imap.sent_folder names the "
                    "folder): %s",
                    message_id,
                    folder,
                    tries,
                    failure,
                )
                break
            delay = backoff.next()
            self._log.warning(
                "reply %s went out but was not saved to the Sent folder %s (try %d of %d; "
                "trying again in %.0f s): %s",
                message_id,
                folder,
                tries,
                self.save_tries,
                delay,
                failure,
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), delay)
            if self._closing.is_set():  # kept in the store: the next start tries again
                self.saved += 1
                self._notify()
                return
        await self._unsaved.done(message_id)
        self.saved += 1
        self._notify()

    async def _save_once(self, raw: bytes, message_id: str) -> str | None:
        """One try at saving the reply; None when it is over (saved, there already, or no
        folder to save to), else what failed (secrets scrubbed)."""
        session = ImapSession(self.config.imap, self.config.timeout)
        try:
            async with self._save_lock:
                await session.open(select=False)
                folder = await self._sent_folder_in(session)
                if folder is not None and not await session.holds(folder, message_id):
                    create = self.config.imap.sent_folder != "auto"
                    await session.append(folder, raw, create=create)
            return None
        except Exception as exc:  # best effort, in a task nobody awaits: said, never raised
            return str(exc) if isinstance(exc, ConnectorError) else scrub(repr(exc), *self._secrets)
        finally:
            await session.close()

    def _sent_name(self) -> str:
        """The Sent folder, for the log: as configured, or as `auto` found it."""
        configured = self.config.imap.sent_folder
        if configured is not False and configured != "auto":
            return repr(configured)
        found = self._sent_folder
        return found if isinstance(found, str) else "(imap.sent_folder: auto, not found yet)"

    async def _sent_folder_in(self, session: ImapSession) -> str | None:
        """The folder replies are saved to, as IMAP commands name it; None: none to save to."""
        configured = self.config.imap.sent_folder
        if configured is not False and configured != "auto":
            return mailbox_argument(configured)
        if self._sent_folder is False:
            found = await session.sent_folder()
            self._sent_folder = found[0] if found is not None else None
            if found is None:
                self._log.info(
                    "%s marks no folder \\Sent (RFC 6154) and has none named %s: replies "
                    "are not saved to a Sent folder (imap.sent_folder names one)",
                    session.where,
                    " or ".join(repr(name.title()) for name in SENT_NAMES),
                )
            elif not found[1]:
                self._log.info(
                    "%s marks no folder \\Sent (RFC 6154): replies are saved to %s, found by "
                    "its name (imap.sent_folder names another)",
                    session.where,
                    found[0],
                )
        return self._sent_folder if isinstance(self._sent_folder, str) else None

    async def _check_per_address(self, answered: tuple[str, ...], now: float) -> None:
        for address in answered:
            if not await self._per_address.allowed(address, now):
                raise PermanentError(
                    f"not sending: {address} already had {self.config.max_replies_per_address} "
                    f"replies in {self.config.reply_window:g} s (reply limit against mail loops)"
                )

    def _unique(self, key: str | None) -> str | None:
        """The Message-ID's unique part for a send with an idempotency key: the same on every
        try, so a copy the server took before a lost answer is the same mail, which the
        recipient's server or client can tell (a new Message-ID made it a second mail)."""
        if not key:
            return None
        return hashlib.sha256(f"{self.connection_id}\x1f{key}".encode()).hexdigest()[:32]

    async def _some_refused(
        self,
        message: OutboundMessage,
        message_id: str,
        mail: EmailMessage,
        refused: dict[str, aiosmtplib.SMTPResponse],
    ) -> None:
        """The server took the mail for some recipients only. Those it refused for good are
        logged; those it deferred (4xx) make the send fail as transient, and its retry (same
        idempotency key) sends the same mail to them alone."""
        if not refused:
            return
        codes = {rcpt: answer.code for rcpt, answer in refused.items()}
        lost = [f"{r} ({c})" for r, c in codes.items() if c >= 500]
        if lost:
            self._log.warning("reply %s was not delivered to %s", message_id, ", ".join(lost))
        later = [r for r, c in codes.items() if 400 <= c < 500]
        if not later:
            return
        key = message.idempotency_key
        if key is None:  # a retry would send it to everyone again: said, not retried
            self._log.warning(
                "reply %s was deferred for %s and is not sent again (no idempotency key)",
                message_id,
                ", ".join(later),
            )
            return
        await self._deferred.keep(key, message, Deferred(mail, message_id, later))
        raise TransientError(
            f"SMTP server {self._smtp_where} deferred the reply for {', '.join(later)} "
            "(the other recipients have it)"
        )

    async def _context_for(self, message: OutboundMessage) -> MailContext | None:
        store = self.context.store
        target = message.reply_to
        if not target:
            target = await store.get_state(f"{self._prefix}thread:{message.thread_id}")
        if not target:
            return None
        stored = await store.get_state(f"{self._prefix}msg:{target}")
        if stored is None:
            latest = await store.get_state(f"{self._prefix}thread:{message.thread_id}")
            stored = await store.get_state(f"{self._prefix}msg:{latest}") if latest else None
        return MailContext.from_json(stored) if stored else None

    # ---- inbound_media ---------------------------------------------------------------------

    async def download(self, attachment: Attachment, *, max_bytes: int | None = None) -> bytes:
        if not attachment.ref:
            raise PermanentError(f"this {attachment.kind} attachment has no reference")
        message_id, index = permanent(parse_ref, attachment.ref)
        session = ImapSession(self.config.imap, self.config.timeout)
        try:
            await session.open()
            raw = await _mail_with_id(session, message_id)
        finally:
            await session.close()
        if raw is None:
            raise NotFoundError(f"mail {message_id} is no longer in {self.config.imap.folder}")
        try:
            data = attachment_bytes(raw, index)
        except LookupError as exc:
            raise NotFoundError(str(exc)) from None
        if max_bytes is not None and len(data) > max_bytes:
            raise PermanentError(
                f"attachment is {len(data)} bytes, over the {max_bytes}-byte limit"
            )
        return data


def _same_mail(earlier: MailContext, now: MailContext) -> bool:
    """Whether two mails' contexts are of one mail (its thread may be known better now)."""
    return replace(earlier, thread_id="") == replace(now, thread_id="")


async def _mail_with_id(session: ImapSession, message_id: str) -> bytes | None:
    """The first mail of the folder (by UID) whose own Message-ID is `message_id`: the one read
    (later copies are dropped as seen). Anyone who saw the id (on a Cc) can send a mail that
    carries it too, and a server's HEADER search matches any header containing it."""
    for uid in await session.uids_of_message_id(message_id):
        raw = await session.fetch(uid)
        if raw is not None and message_id_of(parse_mail(raw), raw) == message_id:
            return raw
    return None


def _as_bytes(mail: EmailMessage) -> bytes:
    """The mail as sent, CRLF lines; headers in UTF-8 where an address needs it (SMTPUTF8)."""
    try:
        return mail.as_bytes()
    except UnicodeEncodeError:
        return mail.as_bytes(policy=policy.SMTPUTF8)


class _SmtpSession:
    """`async with`: an SMTP connection, TLS as configured, logged in when a username is set."""

    def __init__(self, config: EmailConfig, secrets: list[str | None]) -> None:
        smtp = config.smtp
        self._config = smtp
        self._secrets = secrets
        self.where = f"{smtp.host}:{smtp.effective_port}"
        self.client = _Client(
            hostname=smtp.host,
            port=smtp.effective_port,
            use_tls=smtp.security == "ssl",
            start_tls=smtp.security == "starttls",
            timeout=config.timeout,
        )

    async def __aenter__(self) -> aiosmtplib.SMTP:
        with smtp_errors(self.where, *self._secrets):
            await self.client.connect()
            try:
                if self._config.username and self._config.password:
                    await self._check_login_offered()
                    await self.client.login(
                        self._config.username, self._config.password.get_secret_value()
                    )
            except BaseException:  # `__aexit__` does not run when entering failed
                self.client.close()
                raise
        return self.client

    async def _check_login_offered(self) -> None:
        """A server that offers no AUTH never will on a retry: a config error, said now (the
        client's own error would be taken for a passing failure and retried for minutes)."""
        if self.client.last_ehlo_response is None:  # connect greets with EHLO only for TLS
            await self.client.ehlo()
        if self.client.supports_extension("auth"):
            return
        hint = (
            "; servers often offer it only over TLS: set smtp.security to starttls or ssl"
            if self._config.security == "none"
            else ""
        )
        raise PermanentError(
            f"the SMTP server {self.where} offers no login (no AUTH in its EHLO answer), "
            f"but smtp.username is set{hint}"
        )

    async def __aexit__(self, *exc: object) -> None:
        try:
            if self.client.is_connected:
                await self.client.quit()
        except (aiosmtplib.SMTPException, OSError, TimeoutError):
            self.client.close()


class _Client(aiosmtplib.SMTP):
    """aiosmtplib's client, waiting for the end of a mail's data as RFC 5321 says, at least."""

    async def data(
        self, message: str | bytes, /, *, timeout: float | Default | None = Default.token
    ) -> aiosmtplib.SMTPResponse:
        if timeout is Default.token:
            timeout = max(DATA_TIMEOUT, self.timeout or 0.0)
        return await super().data(message, timeout=timeout)
