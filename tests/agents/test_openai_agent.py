"""The OpenAI-compatible agent against a local chat-completions server speaking HTTP + SSE."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from talkbridge.bridge import Bridge
from talkbridge.config import ConnectionConfig, parse_config
from tests.peers.openai import ChatCompletionsPeer
from tests.support.talk_connector import TalkConnector, make_message

KEY = "sk-test-0123456789abcdef"


@pytest.fixture
async def peer() -> AsyncIterator[ChatCompletionsPeer]:
    async with ChatCompletionsPeer(KEY) as running:
        yield running


async def _bridge(
    tmp_path: Path, peer: ChatCompletionsPeer, key: str = KEY, environment: str = "development"
) -> tuple[Bridge, TalkConnector]:
    config, secrets = parse_config(
        {
            "store": f"sqlite:///{tmp_path / 'b.db'}",
            "environment": environment,
            "agents": {
                "default": "assistant",
                "definitions": {
                    "assistant": {
                        "kind": "openai",
                        "base_url": peer.base_url,
                        "model": "tiny-1",
                        "api_key": key,
                        "system_prompt": "Be brief.",
                    }
                },
            },
        }
    )
    bridge = Bridge(config, secrets, with_webchat=False)
    conn = TalkConnector("chat")
    bridge.registry.add(conn, ConnectionConfig(id="chat", channel="telegram", trusted=("*",)))
    await bridge.start()
    return bridge, conn


async def test_the_reply_streams_and_the_model_sees_the_conversation(
    tmp_path: Path, peer: ChatCompletionsPeer
) -> None:
    bridge, conn = await _bridge(tmp_path, peer)
    deltas: list[str] = []

    class Streaming:
        async def delta(self, thread_id: str, stream_id: str, text: str) -> None:
            deltas.append(text)

    conn.features["streaming"] = Streaming()
    await conn.inject(make_message("first question", connection_id="chat"))
    await conn.wait_sent(1)
    await conn.inject(make_message("second question", connection_id="chat"))
    await conn.wait_sent(2)
    await bridge.router.join()
    await bridge.stop()
    assert conn.texts() == ["You said: first question", "You said: second question"]
    assert deltas == ["You said: ", "first question", "You said: ", "second question"]
    second = peer.requests[1]
    assert second["model"] == "tiny-1" and second["stream"] is True
    assert second["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": "You said: first question"},
        {"role": "user", "content": "second question"},
    ]


async def test_a_refused_key_is_reported_without_the_key(
    tmp_path: Path, peer: ChatCompletionsPeer
) -> None:
    wrong = "sk-wrong-key-987654321"
    bridge, conn = await _bridge(tmp_path, peer, key=wrong)
    await conn.inject(make_message("hello", connection_id="chat"))
    (sent,) = await conn.wait_sent(1)
    await bridge.stop()
    assert "HTTP 401" in sent.message.text and "Incorrect API key" in sent.message.text
    assert wrong not in sent.message.text


async def test_server_errors_and_unreachable_models_become_clear_errors(
    tmp_path: Path, peer: ChatCompletionsPeer
) -> None:
    bridge, conn = await _bridge(tmp_path, peer)
    peer.fail_next = (503, {"error": {"message": "overloaded"}})
    await conn.inject(make_message("one", connection_id="chat"))
    await conn.wait_sent(1)
    await peer.__aexit__()  # the model server goes away
    await conn.inject(make_message("two", connection_id="chat"))
    await conn.wait_sent(2)
    await bridge.stop()
    assert conn.texts()[0] == "the model answered HTTP 503: overloaded"
    assert "could not be reached" in conn.texts()[1]


async def test_in_production_users_see_an_apology_and_the_log_has_the_detail(
    tmp_path: Path, peer: ChatCompletionsPeer, caplog: pytest.LogCaptureFixture
) -> None:
    bridge, conn = await _bridge(tmp_path, peer, environment="production")
    peer.fail_next = (500, {"error": {"message": "shard 7 exploded"}})
    await conn.inject(make_message("hello", connection_id="chat"))
    (sent,) = await conn.wait_sent(1)
    await bridge.stop()
    assert sent.message.text == "Sorry, something went wrong while answering."
    assert "shard 7 exploded" in caplog.text
