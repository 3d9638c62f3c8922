from datetime import UTC, datetime, timedelta, timezone

import pytest
from pydantic import ValidationError

from talkbridge import (
    Attachment,
    MessageRouting,
    NormalizedMessage,
    OutboundMessage,
    ReplyTo,
    SendResult,
)


def _msg(**overrides: object) -> NormalizedMessage:
    fields: dict[str, object] = {
        "id": "42",
        "connection_id": "support-bot",
        "channel": "telegram",
        "channel_user_id": "123",
        "display_name": "Ada",
        "thread_id": "-100:7",
        "thread_type": "group",
        "thread_name": "Support",
        "timestamp": datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
        "text": "hi",
        "attachments": [
            Attachment(kind="image", name="a.png", mime_type="image/png", size=3, ref="f1")
        ],
        "reply_to": ReplyTo(message_id="41", content="earlier", sender_name="Bob"),
        "routing": MessageRouting(agent="echo", trust="trusted", routed_by="kw"),
        "raw_event": {"update_id": 1},
    }
    fields.update(overrides)
    return NormalizedMessage.model_validate(fields)


def test_json_round_trip_keeps_everything_but_the_raw_event() -> None:
    msg = _msg()
    back = NormalizedMessage.model_validate_json(msg.model_dump_json())
    assert back == msg.model_copy(update={"raw_event": None})
    assert "raw_event" not in msg.model_dump_json()


def test_frozen() -> None:
    with pytest.raises(ValidationError):
        _msg().text = "changed"  # type: ignore[misc]


def test_timestamp_must_be_aware_and_is_kept_in_utc() -> None:
    with pytest.raises(ValidationError, match="timezone-aware"):
        _msg(timestamp=datetime(2026, 1, 1))
    local = datetime(2026, 1, 1, 12, tzinfo=timezone(timedelta(hours=2)))
    assert _msg(timestamp=local).timestamp == datetime(2026, 1, 1, 10, tzinfo=UTC)


def test_channel_is_extensible_but_validated() -> None:
    assert _msg(channel="matrix").channel == "matrix"
    with pytest.raises(ValidationError, match="lowercase identifier"):
        _msg(channel="Not A Channel")


def test_unknown_fields_and_empty_ids_are_refused() -> None:
    with pytest.raises(ValidationError):
        _msg(colour="red")
    with pytest.raises(ValidationError):
        _msg(id="")


def test_thread_key_separates_connections() -> None:
    assert _msg(connection_id="a").thread_key != _msg(connection_id="b").thread_key


def test_outbound_needs_content_and_send_result_needs_an_id() -> None:
    with pytest.raises(ValidationError, match="needs text or at least one attachment"):
        OutboundMessage(thread_id="t")
    assert OutboundMessage(thread_id="t", attachments=(Attachment(kind="document"),))
    with pytest.raises(ValidationError):
        SendResult(message_ids=())
    assert SendResult(message_ids=("a", "b")).message_id == "a"
