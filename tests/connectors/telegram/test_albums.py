"""Telegram albums with the real aiogram client against the local Bot API peer: the items of one
media group reach the bridge as one message, whatever the batches, restarts or edits."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from talkbridge.connectors.telegram.albums import kept_key
from talkbridge.message import NormalizedMessage
from talkbridge.store import Retention, SqliteStore
from tests.connectors.telegram.conftest import TOKEN, webhook_on
from tests.peers.http import free_port
from tests.peers.telegram import TelegramBotAPIPeer, album, group_text, private_text
from tests.support.running import Inbox

Start = Callable[..., Any]
DAY = 86_400


def files(peer: TelegramBotAPIPeer, count: int) -> list[str]:
    return [
        peer.add_file(f"picture {i}".encode(), file_path=f"photos/{i}.jpg") for i in range(count)
    ]


def refs(message: NormalizedMessage) -> list[str | None]:
    return [a.ref for a in message.attachments]


def confirmed(peer: TelegramBotAPIPeer, update_id: int) -> Callable[[], bool]:
    """Telegram was told `update_id` is done (a poll with an offset past it): it is gone there."""
    return lambda: any(
        (c.params.get("offset") or 0) > update_id
        for c in peer.calls_of("getUpdates", answered=None)
    )


async def test_an_album_is_one_message_with_every_item_and_the_caption(
    peer: TelegramBotAPIPeer, start: Start
) -> None:
    running = await start(album_wait=60)  # only the update after it ends it here
    photos = files(peer, 3)
    for update in album(777, photos, first_message_id=20, caption="Our holiday", caption_on=0):
        peer.push_update(update)
    peer.push_update(private_text(777, "what do you think?", message_id=23))
    shots, question = await running.inbox.wait_count(2)
    assert shots.id == "777:20"  # the first item: what a reply quotes
    assert shots.text == "Our holiday" and refs(shots) == photos
    assert [a.kind for a in shots.attachments] == ["image"] * 3
    assert question.text == "what do you think?"
    assert len(running.inbox.messages) == 2
    media = running.connector.feature("inbound_media")
    assert await media.download(shots.attachments[2]) == b"picture 2"


async def test_an_album_straddling_two_polls_is_still_one_message(
    peer: TelegramBotAPIPeer, start: Start
) -> None:
    running = await start(album_wait=60)
    photos = files(peer, 3)
    first, second, third = album(777, photos, first_message_id=30, caption="three")
    peer.push_update(first)
    last = peer.push_update(second)
    await peer.wait_for(confirmed(peer, last))  # Telegram forgot the first two
    assert running.inbox.messages == []
    peer.push_update(third)
    peer.push_update(private_text(777, "after", message_id=33))
    shots, after = await running.inbox.wait_count(2)
    assert refs(shots) == photos and shots.text == "three" and after.text == "after"


async def test_an_album_with_nothing_after_it_goes_on_after_a_short_wait(
    peer: TelegramBotAPIPeer, start: Start
) -> None:
    running = await start(album_wait=0.05)
    photos = files(peer, 2)
    for update in album(777, photos, first_message_id=40, caption="two"):
        peer.push_update(update)
    [shots] = await running.inbox.wait_count(1)
    assert refs(shots) == photos and shots.text == "two"


async def test_ten_items_end_an_album_without_waiting(
    peer: TelegramBotAPIPeer, start: Start
) -> None:
    running = await start(album_wait=60)
    photos = files(peer, 10)
    for update in album(-100123, photos, first_message_id=50, chat_id=-100123):
        peer.push_update(update)
    [shots] = await running.inbox.wait_count(1)
    assert refs(shots) == photos and shots.thread_id == "-100123"


async def test_an_album_cut_by_a_stop_is_delivered_once_and_whole_after_the_restart(
    peer: TelegramBotAPIPeer, start: Start
) -> None:
    first_run = await start(album_wait=60)
    photos = files(peer, 3)
    first, second, third = album(777, photos, first_message_id=60, caption="kept")
    peer.push_update(first)
    last = peer.push_update(second)
    await peer.wait_for(confirmed(peer, last))  # Telegram will not offer them again
    await first_run.stop()  # Ctrl-C before the album's last item came
    assert first_run.inbox.messages == []
    second_run = await start(album_wait=60)
    peer.push_update(third)  # sent while the bridge was down
    peer.push_update(private_text(777, "and on", message_id=63))
    shots, after = await second_run.inbox.wait_count(2)
    assert refs(shots) == photos and shots.text == "kept" and shots.id == "777:60"
    assert after.text == "and on" and len(second_run.inbox.messages) == 2


async def test_an_album_whose_other_items_never_come_goes_after_the_wait_at_restart(
    peer: TelegramBotAPIPeer, start: Start
) -> None:
    first_run = await start(album_wait=60)
    photos = files(peer, 3)
    for update in album(777, photos, first_message_id=64, caption="partial")[:2]:
        last = peer.push_update(update)
    await peer.wait_for(confirmed(peer, last))
    await first_run.stop()
    second_run = await start(album_wait=0.05)
    [shots] = await second_run.inbox.wait_count(1)
    assert refs(shots) == photos[:2] and shots.text == "partial" and shots.id == "777:64"


class Stuck(Inbox):
    """A subscriber that takes a message and never says so: the bridge stops meanwhile."""

    async def __call__(self, message: NormalizedMessage) -> None:
        self.messages.append(message)
        self._notify()
        await asyncio.Event().wait()


async def test_an_album_whose_delivery_was_cut_short_goes_again_at_once_at_restart(
    peer: TelegramBotAPIPeer, start: Start
) -> None:
    """It may have gone out: held for more items, a late one would be dropped with it as a
    duplicate of the album under the same id."""
    first_run = await start(inbox=Stuck(), album_wait=0.05)
    photos = files(peer, 2)
    for update in album(777, photos, first_message_id=66, caption="cut"):
        peer.push_update(update)
    await first_run.inbox.wait_count(1)
    await first_run.stop()
    second_run = await start(album_wait=60)  # nothing else comes: only the record says go
    [shots] = await second_run.inbox.wait_count(1)
    assert (shots.id, refs(shots)) == (first_run.inbox.messages[0].id, photos)


async def test_items_offered_again_after_their_album_went_out_are_not_delivered_again(
    peer: TelegramBotAPIPeer, start: Start
) -> None:
    first_run = await start(album_wait=60)
    photos = files(peer, 3)
    updates = album(777, photos, first_message_id=70, caption="once")
    ids = [peer.push_update(update) for update in updates]
    peer.push_update(private_text(777, "closing it", message_id=73))
    await first_run.inbox.wait_count(2)
    await first_run.stop()
    # Telegram never heard that the last items were done (a crash before the offset was
    # stored): it offers them again, without the first, plus a message sent meanwhile.
    peer.updates[TOKEN] = [u | {"update_id": i} for u, i in zip(updates[1:], ids[1:], strict=True)]
    peer.push_update(private_text(777, "while down", message_id=74))
    second_run = await start(album_wait=60)
    await second_run.inbox.wait_count(1)
    await peer.wait_for(lambda: not peer.updates[TOKEN])
    assert second_run.inbox.texts == ["while down"]
    assert first_run.inbox.texts == ["once", "closing it"]


async def test_an_edit_of_one_item_is_an_edit_of_the_whole_album(
    peer: TelegramBotAPIPeer, start: Start
) -> None:
    running = await start(album_wait=0.05)
    photos = files(peer, 3)
    updates = album(777, photos, first_message_id=80, caption="Holiday")
    for update in updates:
        peer.push_update(update)
    [shots] = await running.inbox.wait_count(1)
    edited = dict(updates[2]["message"], caption="the beach")
    edited["edit_date"] = edited["date"] + 30
    peer.push_update({"edited_message": edited})
    _, edit = await running.inbox.wait_count(2)
    assert edit.edit_of == shots.id == "777:80"
    assert edit.id == f"777:82:edit:{edited['edit_date']}"
    assert edit.text == "Holiday\n\nthe beach" and refs(edit) == photos
    assert len(running.inbox.messages) == 2  # the edit opened no album of its own


async def test_an_albums_kept_updates_go_once_its_edits_are_past_the_dedupe_window(
    peer: TelegramBotAPIPeer, start: Start, sqlite_store: SqliteStore
) -> None:
    t0 = 1_700_000_000.0
    clock = [t0]
    sqlite_store.wall_clock = lambda: clock[0]
    running = await start(album_wait=0.05, dedupe_for=timedelta(days=2))
    photos = files(peer, 3)
    updates = album(777, photos, first_message_id=140, caption="Holiday")
    for update in updates:
        peer.push_update(update)
    [shots] = await running.inbox.wait_count(1)
    kept = kept_key("tg", shots.id)

    def edited(caption: str, after: int) -> dict[str, Any]:
        item = dict(updates[2]["message"], caption=caption)
        return {"edited_message": item | {"edit_date": item["date"] + after}}

    clock[0] = t0 + DAY  # within the window: the edit is one of the whole album
    peer.push_update(edited("the beach", 30))
    _, edit = await running.inbox.wait_count(2)
    assert edit.edit_of == shots.id and edit.text == "Holiday\n\nthe beach"
    assert refs(edit) == photos
    clock[0] = t0 + 2.5 * DAY  # past the album's own deadline, not past the edit's
    assert await sqlite_store.get_state(kept) is not None
    clock[0] = t0 + 3 * DAY + 1  # two days after the last edit: gone, before any sweep
    assert await sqlite_store.get_state(kept) is None
    swept = await sqlite_store.prune(
        now=datetime.fromtimestamp(clock[0], UTC),
        keep=Retention(timedelta(days=2), timedelta(days=2), timedelta(days=2)),
    )
    assert swept.expired_state == 1
    rows = await sqlite_store._writer.submit(sqlite_store._ops.query, "SELECT key FROM state")
    assert kept not in {key for (key,) in rows}  # the store no longer holds it
    peer.push_update(edited("the sea", 60))  # still the album's answer, from this item alone
    *_, late = await running.inbox.wait_count(3)
    assert late.edit_of == shots.id and late.text == "the sea" and refs(late) == photos[2:]


async def test_a_webhook_answers_each_item_at_once_and_delivers_the_album_as_one(
    peer: TelegramBotAPIPeer, start: Start
) -> None:
    port = free_port()
    running = await start(
        album_wait=60,
        **webhook_on(port, secret="abc"),
    )
    photos = files(peer, 3)
    # Telegram sends a chat's next update once the previous POST is answered: each item is
    # answered before its album is complete, kept in the store meanwhile.
    for update in album(-100123, photos, first_message_id=90, caption="team", chat_id=-100123):
        assert await peer.post_to_webhook(update) == 200
    assert running.inbox.messages == []
    # Another chat's update may come between them: it does not end the album.
    assert await peer.post_to_webhook(private_text(777, "elsewhere", message_id=1)) == 200
    assert running.inbox.texts == ["elsewhere"]
    assert await peer.post_to_webhook(group_text(-100123, 42, "next", message_id=93)) == 200
    _, shots, after = running.inbox.messages
    assert refs(shots) == photos and shots.text == "team" and after.text == "next"


async def test_an_album_its_subscriber_refused_is_offered_again(
    peer: TelegramBotAPIPeer, start: Start, caplog: pytest.LogCaptureFixture
) -> None:
    refusing = Inbox(fail_on={"777:100"})  # once
    running = await start(inbox=refusing, album_wait=0.05)
    photos = files(peer, 2)
    for update in album(777, photos, first_message_id=100, caption="again"):
        peer.push_update(update)
    [shots] = await running.inbox.wait_count(1)
    assert refs(shots) == photos
    assert "album in chat 777 not delivered yet, trying again" in caplog.text
    assert TOKEN not in caplog.text


async def test_an_album_item_that_cannot_be_read_is_skipped_and_polling_goes_on(
    peer: TelegramBotAPIPeer, start: Start, caplog: pytest.LogCaptureFixture
) -> None:
    running = await start(album_wait=60)
    [item] = album(777, files(peer, 1), first_message_id=110)
    item["message"]["from"] = "not an object"
    bad = peer.push_update(item)
    peer.push_update(private_text(777, "after it", message_id=111))
    await running.inbox.wait_count(1)
    assert running.inbox.texts == ["after it"]
    assert f"skipping update {bad} that cannot be read" in caplog.text


async def test_an_album_right_after_another_ends_it_and_goes_after_it(
    peer: TelegramBotAPIPeer, start: Start
) -> None:
    running = await start(album_wait=60)
    first, second = files(peer, 2), files(peer, 10)
    for update in album(777, first, first_message_id=120, media_group_id="1", caption="one"):
        peer.push_update(update)
    for update in album(777, second, first_message_id=122, media_group_id="2", caption="two"):
        peer.push_update(update)  # ten items: it goes at once, but not before the first album
    one, two = await running.inbox.wait_count(2)
    assert (one.text, refs(one)) == ("one", first)
    assert (two.text, refs(two)) == ("two", second)


async def test_album_items_an_older_version_kept_go_at_once_after_the_upgrade(
    peer: TelegramBotAPIPeer, start: Start, sqlite_store: SqliteStore
) -> None:
    """Its record (a list of updates) does not say whether it began to deliver them."""
    photos = files(peer, 2)
    updates = album(777, photos, first_message_id=150, caption="older")
    kept = [u | {"update_id": 900 + i} for i, u in enumerate(updates)]
    await sqlite_store.set_state("telegram:tg:albums", json.dumps(kept))
    running = await start(album_wait=60)
    [shots] = await running.inbox.wait_count(1)
    assert refs(shots) == photos and shots.id == "777:150"
