"""What a connector is, and the small base class most connectors start from.

A connector is a `Talk` (subscribe / send / feature) for one configured connection. It may also
be a `Transport` (a long-running `run` the registry supervises) and offer `check` (try the
credentials) and `close`. The router subscribes to the connector's `Talk` to receive inbound
messages; apps never hold connectors, they go through the router.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any, Protocol, runtime_checkable

from talkbridge import replies
from talkbridge.connectors.boundary import scrub
from talkbridge.errors import ConnectorError, TransientError
from talkbridge.message import NormalizedMessage, OutboundMessage, SendResult, thread_key
from talkbridge.store.base import Store
from talkbridge.talk import Feature, MessageHandler, Subscription


class ConnectionStatus(Protocol):
    """Given to `Transport.run`, so a transport can say how it is doing in plain words."""

    def up(self) -> None: ...
    def degraded(self, reason: str) -> None: ...


@runtime_checkable
class Transport(Protocol):
    async def run(self, status: ConnectionStatus) -> None:
        """Connect and pump traffic until cancelled.

        Call `status.up()` once traffic flows. Raise a `ConnectorError` when the connection is
        lost: `UnauthorizedError`/`PermanentError` stop the connection, anything else makes the
        registry reconnect with backoff.
        """
        ...


@runtime_checkable
class CredentialCheck(Protocol):
    async def check(self) -> str:
        """Try the credentials against the platform; return who we are there, or raise."""
        ...


@runtime_checkable
class CheckWaiting(Protocol):
    def check_waiting(self) -> str | None:
        """What a `check` cut short by its timeout was waiting for, when the connector knows
        more than "no answer" (its SDK quietly retrying a server error); None otherwise."""
        ...


@runtime_checkable
class Closable(Protocol):
    async def close(self) -> None: ...


class Deleting(Protocol):
    """`TalkRouter.delete`: one of our messages deleted through the connection's send queue."""

    async def __call__(
        self, connection_id: str, thread_id: str, message_id: str, *, why: str
    ) -> object: ...


class ConnectorContext:
    """What the core hands a connector when it is built."""

    def __init__(
        self,
        store: Store,
        logger: logging.Logger | None = None,
        settings: Mapping[str, Any] | None = None,
        *,
        dedupe_for: timedelta = timedelta(days=7),
    ) -> None:
        self.store = store
        self.logger = logger or logging.getLogger("talkbridge.connector")
        self.settings = dict(settings or {})
        self.dedupe_for = dedupe_for
        """How long the router remembers a message it handled (`retention.dedupe_days`): how
        long a connector keeps what it stores per inbound message for later use (rebuilding
        it on an edit), with `store.set_state(..., keep_for=dedupe_for)`, so the store does
        not grow with every message."""
        self.on_deleted: list[Callable[[str, str], None]] = []
        """Told (connection id, native id) the moment a connector hears that an inbound
        message was deleted (`BaseConnector.withdraw_reply`): the bridge stops a turn still
        answering it. Called synchronously; must not raise."""
        self.deleting: Deleting | None = None
        """Set by the bridge (`TalkRouter.delete`): how a connector deletes one of its own
        messages (a reply taken back with the message it answered), queued and retried as
        sends are, so a platform failing for a while does not leave the reply up. None (a
        connector without a router): deleted at once, a failure logged."""

    def deleted(self, connection_id: str, message_id: str) -> None:
        for listener in list(self.on_deleted):
            listener(connection_id, message_id)


class BaseConnector:
    """Subscriber fan-out and a feature table; subclasses add `send` and a transport."""

    channel: str = ""
    reports_deletions: bool = False
    """True for a connector whose platform says when a user deletes a message, and which then
    calls `withdraw_reply`: the bridge checks for such deletions when it records a reply."""

    def __init__(self, connection_id: str, context: ConnectorContext) -> None:
        self.connection_id = connection_id
        self.context = context
        self._handlers: list[MessageHandler] = []
        self._features: dict[str, Feature] = {}
        self._taking_back: asyncio.Lock | None = None

    def subscribe(self, handler: MessageHandler) -> Subscription:
        self._handlers.append(handler)
        return Subscription(lambda: self._handlers.remove(handler))

    async def deliver(self, message: NormalizedMessage) -> None:
        """Hand an inbound message to every subscriber; returns once they have accepted it."""
        for handler in list(self._handlers):
            await handler(message)

    async def deliver_confirmed(
        self, message: NormalizedMessage, what: str, *secrets: str | None
    ) -> None:
        """`deliver`, for a connector that confirms the platform's event only once it was taken
        (an update offset, a mail marked read): a subscriber's failure is then a passing one,
        naming `what` (secrets scrubbed), so the event stays unconfirmed and comes again."""
        try:
            await self.deliver(message)
        except ConnectorError:
            raise
        except Exception as exc:
            raise TransientError(
                f"{what} was not accepted by a subscriber: {scrub(str(exc), *secrets)}"
            ) from exc

    async def edit_or_question(self, edit: NormalizedMessage) -> NormalizedMessage | None:
        """An edit that now mentions the bot, where only mentions are answered: the message it
        edits may never have been taken (it did not mention the bot), and an edit of a message
        without an answer is not answered. Without an answer on record, the edit is taken as
        that message itself, under its id, so the router drops it if the message was taken
        after all: an edit never brings a second answer. With an answer, it stays an edit (the
        answer is updated), except the very edit taken as the message, delivered again (an
        update that adds a link's preview). None: nothing to deliver."""
        assert edit.edit_of is not None
        store = self.context.store
        asked = f"{self.channel}:{self.connection_id}:asked-by-edit:{edit.edit_of}"
        if await store.lookup_id(self.connection_id, edit.edit_of) is not None:
            return None if await store.get_state(asked) == edit.id else edit
        await store.set_state(asked, edit.id, keep_for=self.context.dedupe_for)
        return edit.model_copy(update={"id": edit.edit_of, "edit_of": None})

    def provide(self, name: str, implementation: Feature) -> None:
        self._features[name] = implementation

    def feature(self, name: str) -> Any:
        return self._features.get(name)

    async def send(self, message: OutboundMessage) -> SendResult:
        raise NotImplementedError

    async def withdraw_reply(self, thread_id: str, message_id: str) -> bool:
        """A deleted inbound message takes the bot's reply along: the id map (in the store, so it
        survives restarts) knows which reply answered it. A turn still answering it is stopped
        (`ConnectorContext.on_deleted`), and a tombstone is left in the store, so that a reply
        being posted right now, not on record yet, is deleted as soon as the bridge records it
        (`take_back_reply`). A deletion of a message never answered (or never seen) costs that
        tombstone only, kept for `dedupe_for`. The message (and its edits) leave the thread's
        history, as its reply does once taken back: a user who deletes a message expects the
        bot to forget it, so no later turn reads it (`Store.forget_history`). True when a reply
        was deleted."""
        self.context.deleted(self.connection_id, message_id)
        async with self._take_back_lock():
            store = self.context.store
            keep_for = self.context.dedupe_for
            if not await replies.mark_deleted(
                store, self.connection_id, message_id, keep_for=keep_for
            ):
                return False  # the same deletion again: its reply went already
            await self._forget(thread_id, message_id, message_id)
            return await self._take_back(thread_id, message_id)

    def history_threads(self, thread_id: str, message_id: str) -> list[str]:
        """The threads whose history may hold `message_id`, reported deleted in `thread_id`:
        a platform that names a deleted message's thread otherwise than the message's own
        (Slack: the thread it started) says so here."""
        return [thread_id]

    async def _forget(self, thread_id: str, message_id: str, entry_id: str) -> None:
        """`entry_id` (the deleted `message_id`, or our reply to it) leaves the history."""
        for thread in self.history_threads(thread_id, message_id):
            key = thread_key(self.connection_id, thread)
            await self.context.store.forget_history(key, [entry_id])

    async def take_back_reply(self, thread_id: str, message_id: str) -> bool:
        """For the bridge once it recorded its reply to `message_id`: should that message have
        been deleted meanwhile (its tombstone says so), the reply is deleted now, unless the
        deletion found it first. True when a reply was deleted."""
        async with self._take_back_lock():
            found = await replies.tombstone(self.context.store, self.connection_id, message_id)
            if found != replies.DELETED:
                return False
            return await self._take_back(thread_id, message_id)

    def _take_back_lock(self) -> asyncio.Lock:
        """One deletion of a reply at a time, so a deletion and the bridge recording the reply
        never both delete it (a second delete fails: the message is gone)."""
        if self._taking_back is None:
            self._taking_back = asyncio.Lock()
        return self._taking_back

    async def _take_back(self, thread_id: str, message_id: str) -> bool:
        store = self.context.store
        reply = await store.lookup_id(self.connection_id, message_id)
        if reply is None:
            return False
        await self._forget(thread_id, message_id, reply)  # even if it cannot be deleted
        deleter = self._features.get("delete")
        if deleter is None:
            return False
        later = await replies.later_parts(store, self.connection_id, message_id)
        await replies.mark_taken_back(
            store, self.connection_id, message_id, keep_for=self.context.dedupe_for
        )
        why = f"our reply to {message_id}, which was deleted"
        for part in [reply, *later]:  # a reply split over several messages goes whole
            if self.context.deleting is not None:  # queued: retried without holding us up
                await self.context.deleting(self.connection_id, thread_id, part, why=why)
                continue
            try:
                await deleter.delete(thread_id, part)  # type: ignore[union-attr]
            except ConnectorError as exc:
                self.context.logger.error(
                    "%s: could not delete message %s (%s): %s",
                    self.connection_id,
                    part,
                    why,
                    exc,
                )
        await replies.forget_later_parts(store, self.connection_id, message_id)
        return True
