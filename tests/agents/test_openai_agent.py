"""The OpenAI-compatible agent against a local chat-completions server speaking HTTP + SSE."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from talkbridge.agents import TurnContext
from talkbridge.bridge import Bridge
from talkbridge.config import ConnectionConfig, parse_config
from talkbridge.errors import ConfigError
from talkbridge.hooks import HookRegistry
from tests.peers.openai import ChatCompletionsPeer
from tests.support.talk_connector import TalkConnector, make_message

KEY = "sk-test-0123456789abcdef"


@pytest.fixture
async def peer() -> AsyncIterator[ChatCompletionsPeer]:
    async with ChatCompletionsPeer(KEY) as running:
        yield running


async def _bridge(
    tmp_path: Path,
    peer: ChatCompletionsPeer,
    key: str = KEY,
    environment: str = "development",
    hooks: HookRegistry | None = None,
    **agent: Any,
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
                        **agent,
                    }
                },
            },
        }
    )
    bridge = Bridge(config, secrets, hooks=hooks, with_webchat=False)
    conn = TalkConnector("chat")
    bridge.registry.add(conn, ConnectionConfig(id="chat", channel="telegram", trusted=("*",)))
    await bridge.start()
    return bridge, conn


async def _answer(tmp_path: Path, peer: ChatCompletionsPeer, text: str = "hello") -> str:
    """What a user writing `text` is sent back, the bridge stopped after."""
    bridge, conn = await _bridge(tmp_path, peer)
    await conn.inject(make_message(text, connection_id="chat"))
    (sent,) = await conn.wait_sent(1, timeout=5)
    await bridge.stop()
    assert sent.message.text is not None
    return sent.message.text


async def test_the_reply_streams_and_the_model_sees_the_conversation(
    tmp_path: Path, peer: ChatCompletionsPeer
) -> None:
    bridge, conn = await _bridge(tmp_path, peer)
    deltas: list[str] = []

    class Streaming:
        async def delta(self, thread_id: str, stream_id: str, text: str) -> None:
            deltas.append(text)

        async def end(self, thread_id: str, stream_id: str) -> None:
            pass

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


async def test_a_chat_hook_edits_the_whole_conversation_the_model_is_sent(
    tmp_path: Path, peer: ChatCompletionsPeer
) -> None:
    """A chat hook that only redacts is handed the system prompt and the history too, and the
    model still gets them (it got the prompt alone); a turn middleware's rewrite of the prompt,
    made after the chat hooks, is what the model reads."""
    hooks = HookRegistry()
    handed: list[list[str]] = []

    @hooks.chat_hook
    def redact(messages: list[dict[str, Any]]) -> None:
        handed.append([m["role"] for m in messages])
        for m in messages:
            m["content"] = m["content"].replace("4111", "****")

    @hooks.turn_middleware
    async def polite(ctx: TurnContext, next: Callable[[], Awaitable[None]]) -> None:
        ctx.input.prompt = f"{ctx.input.prompt}, please"
        await next()

    bridge, conn = await _bridge(tmp_path, peer, hooks=hooks)
    await conn.inject(make_message("my card is 4111", connection_id="chat"))
    await conn.wait_sent(1)
    await conn.inject(make_message("is it 4111?", connection_id="chat"))
    await conn.wait_sent(2)
    await bridge.stop()
    assert handed == [["system", "user"], ["system", "user", "assistant", "user"]]
    assert peer.requests[1]["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "my card is ****"},
        {"role": "assistant", "content": "You said: my card is ****, please"},
        {"role": "user", "content": "is it ****?, please"},
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
    overloaded = (503, {"error": {"message": "overloaded"}}, {"Retry-After": "0"})
    peer.failures.extend([overloaded] * 3)  # the first try and both retries
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
    exploded = (500, {"error": {"message": "shard 7 exploded"}}, {"Retry-After": "0"})
    peer.failures.extend([exploded] * 3)  # the first try and both retries
    await conn.inject(make_message("hello", connection_id="chat"))
    (sent,) = await conn.wait_sent(1)
    await bridge.stop()
    assert sent.message.text == "Sorry, something went wrong while answering."
    assert "shard 7 exploded" in caplog.text


async def test_a_rate_limit_with_a_short_retry_after_is_asked_again(
    tmp_path: Path, peer: ChatCompletionsPeer
) -> None:
    bridge, conn = await _bridge(tmp_path, peer)
    limited = {"error": {"message": "Rate limit reached", "code": "rate_limit_exceeded"}}
    peer.failures.append((429, limited, {"Retry-After": "0"}))
    peer.failures.append((502, {}, {"Retry-After": "0"}))
    await conn.inject(make_message("hello", connection_id="chat"))
    (sent,) = await conn.wait_sent(1)
    await bridge.stop()
    assert sent.message.text == "You said: hello"
    assert len(peer.requests) == 3


async def test_a_retry_after_too_long_to_wait_fails_the_turn_at_once(
    tmp_path: Path, peer: ChatCompletionsPeer
) -> None:
    limited = {"error": {"message": "Rate limit reached"}}
    peer.failures.append((429, limited, {"Retry-After": "3600"}))
    answer = await _answer(tmp_path, peer)
    assert answer == "the model answered HTTP 429: Rate limit reached"
    assert len(peer.requests) == 1


async def test_an_empty_completion_is_an_error_the_user_sees(
    tmp_path: Path, peer: ChatCompletionsPeer
) -> None:
    peer.reply = lambda messages: []
    answer = await _answer(tmp_path, peer)
    assert answer == "the model answered with no text"


async def test_an_answer_of_tool_calls_only_says_this_agent_runs_no_tools(
    tmp_path: Path, peer: ChatCompletionsPeer
) -> None:
    peer.answer_as = "tools"
    answer = await _answer(tmp_path, peer, "weather in Paris?")
    assert "asked to call tools (get_weather), which this agent does not run" in (answer)


async def test_a_server_that_answers_without_streaming_is_read_all_the_same(
    tmp_path: Path, peer: ChatCompletionsPeer
) -> None:
    peer.answer_as = "json"
    answer = await _answer(tmp_path, peer)
    assert answer == "You said: hello"


async def test_events_spread_over_several_data_lines_are_read_as_one(
    tmp_path: Path, peer: ChatCompletionsPeer
) -> None:
    """Each chunk's JSON over several `data:` lines, CRLF line ends, events without data and
    comments between them: all server-sent events as specified."""
    peer.spread_events = True
    answer = await _answer(tmp_path, peer)
    assert answer == "You said: hello"


async def test_an_answer_cut_at_the_token_limit_is_sent_and_the_log_says_so(
    tmp_path: Path, peer: ChatCompletionsPeer, caplog: pytest.LogCaptureFixture
) -> None:
    peer.finish_reason = "length"
    answer = await _answer(tmp_path, peer)
    assert answer == "You said: hello"
    (warning,) = [r for r in caplog.records if "token limit" in r.getMessage()]
    assert warning.levelname == "WARNING"
    assert "assistant" in warning.getMessage()


async def test_an_answer_that_ends_normally_warns_of_nothing(
    tmp_path: Path, peer: ChatCompletionsPeer, caplog: pytest.LogCaptureFixture
) -> None:
    await _answer(tmp_path, peer)
    assert "token limit" not in caplog.text


async def test_an_error_in_the_middle_of_the_stream_fails_the_turn(
    tmp_path: Path, peer: ChatCompletionsPeer
) -> None:
    peer.answer_as = "error"
    answer = await _answer(tmp_path, peer)
    assert answer == (
        f"the model at {peer.base_url}/chat/completions failed mid-answer: the model overloaded"
    )


async def test_a_long_answer_that_keeps_streaming_is_not_cut_off(
    tmp_path: Path, peer: ChatCompletionsPeer
) -> None:
    """`timeout` bounds each wait for the next piece, not the whole answer."""
    peer.reply = lambda messages: [f"{n} " for n in range(6)]
    peer.piece_gap = 0.3  # six pieces: 1.5 s in all, each gap well under the 1 s timeout
    bridge, conn = await _bridge(tmp_path, peer, timeout=1.0)
    await conn.inject(make_message("count", connection_id="chat"))
    (sent,) = await conn.wait_sent(1)
    await bridge.stop()
    assert sent.message.text == "0 1 2 3 4 5 "


async def test_an_error_shown_in_development_holds_no_secret_of_the_config(
    tmp_path: Path, peer: ChatCompletionsPeer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A base URL with a secret in it (a proxy's path token) is named by the error."""
    monkeypatch.setenv("PROXY_TOKEN", "proxy-secret-4242")
    await peer.__aexit__()  # the model server is gone: the error names the URL
    config, secrets = parse_config(
        {
            "store": f"sqlite:///{tmp_path / 'b.db'}",
            "environment": "development",
            "agents": {
                "default": "assistant",
                "definitions": {
                    "assistant": {
                        "kind": "openai",
                        "base_url": peer.base_url + "/${PROXY_TOKEN}",
                        "model": "tiny-1",
                    }
                },
            },
        }
    )
    bridge = Bridge(config, secrets, with_webchat=False)
    conn = TalkConnector("chat")
    bridge.registry.add(conn, ConnectionConfig(id="chat", channel="telegram", trusted=("*",)))
    await bridge.start()
    await conn.inject(make_message("hello", connection_id="chat"))
    (sent,) = await conn.wait_sent(1)
    await bridge.stop()
    assert "could not be reached" in sent.message.text
    assert "proxy-secret-4242" not in sent.message.text
    assert "/***/chat/completions" in sent.message.text


def test_a_base_url_that_is_no_http_url_is_a_config_error() -> None:
    spec = {"kind": "openai", "base_url": "ftp://models.example", "model": "m"}
    with pytest.raises(ConfigError) as caught:
        parse_config({"agents": {"definitions": {"assistant": spec}}})
    assert "agents.definitions.assistant.base_url: must be an http:// or https:// URL" in str(
        caught.value
    )
