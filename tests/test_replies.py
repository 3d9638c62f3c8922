"""A reply split over several messages is found, edited and withdrawn whole."""

from __future__ import annotations

from talkbridge import replies
from talkbridge.connectors.base import BaseConnector, ConnectorContext
from talkbridge.store import SqliteStore


class Deleter:
    def __init__(self) -> None:
        self.deleted: list[str] = []

    async def delete(self, thread_id: str, message_id: str) -> None:
        self.deleted.append(message_id)


async def test_a_deleted_question_takes_every_part_of_its_reply_along(
    sqlite_store: SqliteStore,
) -> None:
    connector = BaseConnector("c", ConnectorContext(sqlite_store))
    deleter = Deleter()
    connector.provide("delete", deleter)
    await replies.remember(sqlite_store, "c", "q1", ["r1", "r2", "r3"])
    await replies.remember(sqlite_store, "c", "q2", ["s1"])
    assert await connector.withdraw_reply("t", "q1")
    assert deleter.deleted == ["r1", "r2", "r3"]
    assert await replies.later_parts(sqlite_store, "c", "q1") == []  # forgotten once deleted
    assert await connector.withdraw_reply("t", "q2")
    assert deleter.deleted == ["r1", "r2", "r3", "s1"]
