"""Webchat sessions and their conversations, kept in the store so they survive a restart.

A session is what a browser holds (in localStorage): a random 128-bit id the server made, bound
to the token that made it. Binding means a leaked session id is useless without its token, and a
second token never sees the first token's sessions. A session holds several conversations;
each is one thread, `thread_id = f"{session_id}.{conversation_id}"`.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import re
import secrets
import unicodedata
import weakref
from dataclasses import asdict, dataclass

from talkbridge.message import utcnow
from talkbridge.store.base import Store
from talkbridge.webchat.protocol import FrameError

MAX_CONVERSATIONS = 1000
TITLE_LENGTH = 60
_SESSION_ID = re.compile(r"^[0-9a-f]{32}$")
_CONVERSATION_ID = re.compile(r"^[0-9a-f]{12}$")


PERSON_PREFIX = "sub:"
"""Identities of one person (a signed token's subject): their session follows them."""


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def split_thread(thread_id: str) -> tuple[str, str] | None:
    """`(session_id, conversation_id)` of a well-formed webchat thread id, else None."""
    session_id, dot, conversation_id = thread_id.partition(".")
    if not dot or not _SESSION_ID.fullmatch(session_id):
        return None
    if not _CONVERSATION_ID.fullmatch(conversation_id):
        return None
    return session_id, conversation_id


@dataclass(frozen=True, slots=True)
class Conversation:
    id: str
    title: str
    created_at: str

    def as_frame(self, session_id: str) -> dict[str, str]:
        created_at = self.created_at.replace("+00:00", "Z")  # as messages' `ts` are written
        return {**asdict(self), "created_at": created_at, "thread_id": f"{session_id}.{self.id}"}


class Sessions:
    """Creates, authenticates and lists sessions; conversations are cached per process.

    The cache is only a shortcut: an unknown conversation id is looked up in the store again, so
    a conversation made through another node is still found.
    """

    def __init__(self, store: Store, *, max_per_identity: int | None = None) -> None:
        self._store = store
        self._max_per_identity = max_per_identity
        """Sessions one identity may create: each is kept for good, and a client holding a
        static token made a new one with every unknown `session_id` it sent."""
        self._conversations: dict[str, list[Conversation]] = {}
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    def lock(self, session_id: str) -> asyncio.Lock:
        """One lock per session: serializes its sends and its conversation list changes."""
        lock = self._locks.get(session_id)
        if lock is None:
            lock = asyncio.Lock()
            self._locks[session_id] = lock
        return lock

    async def authenticate(
        self, identity: str, session_id: str | None, *, earlier_identity: str | None = None
    ) -> tuple[str, bool]:
        """Return `(session_id, created)` for this identity (see `TokenAuth.identify`), or raise
        `FrameError("forbidden")`.

        A known session bound to a different identity is refused. Without a session id, or with
        one the store has never seen (a new device, a wiped store, a stale tab): a signed
        token's user gets their own session back, on every device; a static token, which may be
        handed to many people, gets a new session for each browser. A session bound to
        `earlier_identity` (the same holder, known by an older name) moves to `identity`.
        """
        digest = identity
        if session_id is not None and _SESSION_ID.fullmatch(session_id):  # else: never issued
            bound = await self._store.get_state(_session_key(session_id))
            if (
                bound is not None
                and earlier_identity is not None
                and hmac.compare_digest(bound, earlier_identity)
            ):
                await self._store.set_state(_session_key(session_id), digest)  # same holder
                bound = digest
            if bound is not None:
                if not hmac.compare_digest(bound, digest):
                    raise FrameError(
                        "forbidden", "that session belongs to another token; start a new session"
                    )
                return session_id, False
        if not digest.startswith(PERSON_PREFIX):
            return await self._new_session(digest), True
        async with self.lock(_identity_key(digest)):  # two tabs of a new user: one session
            known = await self._store.get_state(_identity_key(digest))
            if known is not None and await self._store.get_state(_session_key(known)) == digest:
                return known, False
            new_id = await self._new_session(digest)
            await self._store.set_state(_identity_key(digest), new_id)
        return new_id, True

    async def _new_session(self, identity: str) -> str:
        """A new session bound to `identity`, or `FrameError("too_many_sessions")` when the
        identity has made all it may (counted per identity, so per static token)."""
        if self._max_per_identity is None:
            new_id = await self._bind_new(identity)
            await self.new_conversation(new_id)
            return new_id
        count_key = _count_key(identity)
        async with self.lock(count_key):
            made = int(await self._store.get_state(count_key) or 0)
            if made >= self._max_per_identity:
                raise FrameError(
                    "too_many_sessions",
                    f"this access token has opened the most sessions it may "
                    f"({self._max_per_identity}: one per browser), so it cannot start another; "
                    "open the link in a browser that used it before, or ask the person who "
                    "runs this bridge for a link of your own (or to raise "
                    "webchat.max_sessions_per_token)",
                )
            new_id = await self._bind_new(identity)
            await self._store.set_state(count_key, str(made + 1))
        await self.new_conversation(new_id)
        return new_id

    async def _bind_new(self, identity: str) -> str:
        new_id = secrets.token_hex(16)
        await self._store.set_state(_session_key(new_id), identity)
        return new_id

    async def conversations(self, session_id: str, *, refresh: bool = False) -> list[Conversation]:
        cached = self._conversations.get(session_id)
        if cached is not None and not refresh:
            return list(cached)
        raw = await self._store.get_state(_conversations_key(session_id))
        loaded = [Conversation(**item) for item in json.loads(raw)] if raw else []
        self._conversations[session_id] = loaded
        return list(loaded)

    async def find(self, session_id: str, conversation_id: str) -> Conversation | None:
        for refresh in (False, True):
            for conv in await self.conversations(session_id, refresh=refresh):
                if conv.id == conversation_id:
                    return conv
        return None

    async def holds(self, session_id: str, conversation_id: str) -> bool:
        """Whether the session has that conversation: what a message sent to its thread needs.
        Read from the store when not cached, without caching it: the session may have no
        socket on this process, which is when its cached list is dropped (`forget`)."""
        cached = self._conversations.get(session_id)
        if cached is not None and any(c.id == conversation_id for c in cached):
            return True
        raw = await self._store.get_state(_conversations_key(session_id))
        if not raw:
            return False
        return any(item.get("id") == conversation_id for item in json.loads(raw))

    async def new_conversation(self, session_id: str, title: str = "") -> Conversation:
        async with self.lock(session_id):
            current = await self.conversations(session_id, refresh=True)
            if len(current) >= MAX_CONVERSATIONS:
                raise FrameError(
                    "too_large", f"a session holds at most {MAX_CONVERSATIONS} conversations"
                )
            taken = {c.id for c in current}
            conv_id = secrets.token_hex(6)
            while conv_id in taken:
                conv_id = secrets.token_hex(6)
            conv = Conversation(conv_id, _title(title), utcnow().isoformat())
            await self._save(session_id, [*current, conv])
            return conv

    async def title_from(
        self, session_id: str, conversation_id: str, text: str
    ) -> Conversation | None:
        """Name an untitled conversation after its first message; the renamed one, or None."""
        current = await self.conversations(session_id)
        for index, conv in enumerate(current):
            if conv.id == conversation_id and not conv.title:
                renamed = Conversation(conv.id, _title(text), conv.created_at)
                current[index] = renamed
                await self._save(session_id, current)
                return renamed
        return None

    def forget(self, session_id: str) -> None:
        """Drop the cached list once no socket of the session is left on this process."""
        self._conversations.pop(session_id, None)

    async def _save(self, session_id: str, conversations: list[Conversation]) -> None:
        payload = json.dumps([asdict(c) for c in conversations], ensure_ascii=False)
        await self._store.set_state(_conversations_key(session_id), payload)
        self._conversations[session_id] = list(conversations)


_MARKS = re.compile(r"(\*{1,3}|_{2}|~~|`+|^#{1,6}\s+|^>\s*)")


def _title(text: str) -> str:
    """The first words of the first message, without the Markdown marks around them: a list
    of titles shows `bold` as bold, not as **bold**."""
    line = _MARKS.sub("", " ".join(text.split())).strip() or " ".join(text.split())
    return line if len(line) <= TITLE_LENGTH else _cut(line, TITLE_LENGTH - 1).rstrip() + "…"


def _cut(text: str, at: int) -> str:
    """`text[:at]`, moved back so it does not split what shows as one character: a base and
    its combining marks, an emoji joined by ZWJ or with a modifier, a flag's two letters."""
    while 0 < at < len(text) and (_joins_previous(text[at]) or text[at - 1] == "\u200d"):
        at -= 1
    flag_letters = 0
    while flag_letters < at and "\U0001f1e6" <= text[at - 1 - flag_letters] <= "\U0001f1ff":
        flag_letters += 1
    return text[: at - flag_letters % 2]


def _joins_previous(ch: str) -> bool:
    return (
        unicodedata.combining(ch) != 0
        or ch in "\u200d\ufe0e\ufe0f"
        or "\U0001f3fb" <= ch <= "\U0001f3ff"  # skin tones
        or unicodedata.category(ch) == "Me"
    )


def _identity_key(identity: str) -> str:
    return f"webchat:identity:{token_hash(identity)}"  # never the identity (a sub) itself


def _count_key(identity: str) -> str:
    return f"webchat:sessions-made:{token_hash(identity)}"


def _session_key(session_id: str) -> str:
    return f"webchat:session:{session_id}"


def _conversations_key(session_id: str) -> str:
    return f"webchat:conversations:{session_id}"
