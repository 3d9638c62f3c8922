"""An agent backed by any OpenAI-compatible chat-completions API (OpenAI, vLLM, Ollama, LiteLLM, …).

The reply is streamed (server-sent events) as `TextDelta`s and ends with a `Result`; the thread's
recent history is sent along, so the model sees the conversation. Failures become an `Error` event
that names what went wrong in plain words — never the API key:

- a 429 or a 5xx before anything was streamed is asked again (up to `retries` times, waiting as
  `Retry-After` says when that is short); after that, or for any other status, the turn fails;
- an error object sent in the middle of a stream fails the turn: the text before it is not an
  answer;
- an answer with no text (an empty completion, or only tool calls, which this agent does not
  run) fails the turn instead of leaving the user with nothing;
- a server that answers with one JSON completion although a stream was asked for is read as such;
- `timeout` bounds connecting and each wait for the next piece, not the whole answer: a long
  answer that keeps streaming is never cut off;
- the stream is read as server-sent events are specified: an event's `data:` lines joined, at
  the blank line that ends it; comments, other fields and events without data are skipped;
- an answer the model cut at its token limit (`finish_reason: length`) is sent as it is, with a
  warning in the log that says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Iterator
from typing import Any

from talkbridge.agents.base import Error, Result, TextDelta, TurnContext
from talkbridge.errors import AgentUnavailableError

log = logging.getLogger("talkbridge.agents")

DEFAULT_HISTORY = 20
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


class OpenAIChatAgent:
    def __init__(
        self,
        name: str,
        *,
        base_url: str,
        model: str,
        api_key: str | None = None,
        system_prompt: str | None = None,
        history: int = DEFAULT_HISTORY,
        timeout: float = 120.0,
        retries: int = 2,
        max_retry_wait: float = 20.0,
    ) -> None:
        self.name = name
        self._base_url = base_url.rstrip("/")
        self._url = self._base_url + "/chat/completions"
        self._model = model
        self._api_key = api_key
        self._system_prompt = system_prompt
        self._history = history
        self._timeout = timeout
        self._retries = retries
        self._max_retry_wait = max_retry_wait

    async def messages(self, ctx: TurnContext) -> list[dict[str, str]]:
        """What the model is sent: system prompt, earlier turns of the thread, this prompt.

        Chat hooks are handed this list and the one they leave (`ctx.state["messages"]`) is
        sent, its last user message being the prompt as turn middleware left it."""
        given = ctx.state.get("messages")
        if isinstance(given, list) and given:
            return _with_prompt([m for m in given if isinstance(m, dict)], ctx.input.prompt)
        messages: list[dict[str, str]] = []
        if self._system_prompt:
            messages.append({"role": "system", "content": self._system_prompt})
        if self._history:
            for entry in await ctx.history(self._history):  # (never this turn's own message)
                role = "assistant" if entry.role == "assistant" else "user"
                messages.append({"role": role, "content": entry.text})
        messages.append({"role": "user", "content": ctx.input.prompt})
        return messages

    async def stream(self, ctx: TurnContext) -> AsyncIterator[Any]:
        import aiohttp

        body = {"model": self._model, "messages": await self.messages(ctx), "stream": True}
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        # Bounds connecting and every wait for data (the headers, the next chunk), not the whole
        # answer: a model that keeps streaming for minutes is answering, not hanging.
        timeout = aiohttp.ClientTimeout(total=None, connect=self._timeout, sock_read=self._timeout)
        answer = _Answer()
        answering = False  # the model accepted the request: a failure now breaks off an answer
        try:
            async with aiohttp.ClientSession(timeout=timeout) as session:
                for attempt in range(self._retries + 1):
                    async with session.post(self._url, json=body, headers=headers) as response:
                        if response.status != 200:
                            # some servers quote the key they refused
                            message = self._hide_key(await _describe(response))
                            wait = self._retry_wait(response, attempt)
                            if wait is None:
                                yield Error(message=message, code=_code(response.status))
                                return
                            await asyncio.sleep(wait)
                            continue
                        answering = True
                        if response.content_type == "application/json":  # not streamed after all
                            answer.take_completion(await response.json(content_type=None))
                        else:
                            async with contextlib.aclosing(_sse_data(response.content)) as data:
                                async for event in data:
                                    if event == "[DONE]":
                                        break
                                    text = answer.take_chunk(json.loads(event))
                                    if text:
                                        yield TextDelta(text=text)
                        break
        except (aiohttp.ClientError, TimeoutError) as exc:
            if isinstance(exc, TimeoutError):
                reason = f"nothing came for {self._timeout:g} s"
            else:
                reason = " ".join(f"{type(exc).__name__} {exc}".split())[:300]
            if answering:
                message = f"the answer from the model at {self._url} broke off: {reason}"
            else:
                message = f"the model at {self._url} could not be reached: {reason}"
            yield Error(message=message)
            return
        except _ModelFailed as exc:
            yield Error(message=f"the model at {self._url} failed mid-answer: {exc}")
            return
        except ValueError as exc:  # a chunk that is not JSON, or of the wrong shape
            if answering:
                message = f"the model at {self._url} sent an unreadable answer: {exc}"
            else:  # aiohttp refusing the request itself (credentials both in the URL and key)
                message = f"the request to the model at {self._url} could not be made: {exc}"
            yield Error(message=message)
            return
        text = "".join(answer.pieces)
        if not text:
            if answer.tools:
                names = ", ".join(sorted(answer.tools))
                yield Error(
                    message=f"the model asked to call tools ({names}), which this agent does "
                    "not run: it gave no text to answer with",
                    code="unsupported",
                )
            else:
                yield Error(message="the model answered with no text", code="empty_answer")
            return
        if answer.cut_short:
            log.warning(
                "%s: the model at %s stopped at its token limit (finish_reason: length): "
                "the answer is cut short",
                self.name,
                self._url,
            )
        yield Result(text=text, usage=answer.usage)

    async def check(self) -> str:
        """`GET /models` with the key: the key is taken and the model is one the server
        offers. A server without that endpoint (some proxies) is reachable, model unverified."""
        import aiohttp

        url = self._base_url + "/models"
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        try:
            async with aiohttp.ClientSession() as session, session.get(url, headers=headers) as r:
                if r.status in (404, 405):
                    return (
                        f"{self._base_url} answers, but lists no models (GET /models: HTTP "
                        f"{r.status}): model {self._model!r} not verified"
                    )
                if r.status != 200:
                    problem = await _describe(r)
                    if r.status in (401, 403):
                        problem = f"the key was refused: {problem}"
                    raise AgentUnavailableError(self._hide_key(f"{problem} (GET {url})"))
                payload = await r.json(content_type=None)
        except (aiohttp.ClientError, ValueError) as exc:
            reason = " ".join(f"{type(exc).__name__} {exc}".split())[:300]
            raise AgentUnavailableError(
                self._hide_key(f"the model server at {self._base_url} could not be read: {reason}")
            ) from None
        offered = _model_ids(payload)
        if offered is None:
            return f"{self._base_url} answers; its model list is unreadable: model not verified"
        if self._model not in offered:
            some = ", ".join(sorted(offered)[:10]) or "none"
            more = f" and {len(offered) - 10} more" if len(offered) > 10 else ""
            raise AgentUnavailableError(
                f"{self._base_url} does not offer model {self._model!r} (it offers: {some}{more})"
            )
        return f"model {self._model!r} is offered at {self._base_url}"

    def _hide_key(self, text: str) -> str:
        return text.replace(self._api_key, "***") if self._api_key else text

    def _retry_wait(self, response: Any, attempt: int) -> float | None:
        """Seconds to wait before asking again, or None when this status is final."""
        if response.status not in RETRY_STATUSES or attempt >= self._retries:
            return None
        wait = float(2**attempt)
        retry_after = response.headers.get("Retry-After", "")
        with contextlib.suppress(ValueError):  # absent, or an HTTP date: back off by attempt
            wait = max(0.0, float(retry_after))
        return wait if wait <= self._max_retry_wait else None


class _ModelFailed(Exception):
    """An error object the server sent inside the stream."""


class _Answer:
    """What the chunks (or the one completion) of an answer said so far."""

    __slots__ = ("cut_short", "pieces", "tools", "usage")

    def __init__(self) -> None:
        self.pieces: list[str] = []
        self.tools: set[str] = set()
        self.usage: dict[str, int] = {}
        self.cut_short = False
        """The model stopped at its token limit (`finish_reason: length`)."""

    def take_chunk(self, chunk: Any) -> str:
        """The text of one streamed chunk ('' for none); raises on an error chunk."""
        if not isinstance(chunk, dict):
            raise ValueError(f"a chunk is not a JSON object: {str(chunk)[:80]}")
        _raise_error(chunk)
        self.usage = _usage(chunk) or self.usage
        text = ""
        for choice in chunk.get("choices") or ():
            self._note_finish(choice)
            delta = choice.get("delta") if isinstance(choice, dict) else None
            if not isinstance(delta, dict):
                continue
            self._note_tools(delta)
            piece = delta.get("content")
            if isinstance(piece, str) and piece:
                text += piece
        if text:
            self.pieces.append(text)
        return text

    def take_completion(self, payload: Any) -> None:
        """A whole (non-streamed) completion."""
        if not isinstance(payload, dict):
            raise ValueError("the answer is not a JSON object")
        _raise_error(payload)
        self.usage = _usage(payload)
        for choice in payload.get("choices") or ():
            self._note_finish(choice)
            message = choice.get("message") if isinstance(choice, dict) else None
            if not isinstance(message, dict):
                continue
            self._note_tools(message)
            content = message.get("content")
            if isinstance(content, str) and content:
                self.pieces.append(content)
                return

    def _note_finish(self, choice: Any) -> None:
        if isinstance(choice, dict) and choice.get("finish_reason") == "length":
            self.cut_short = True

    def _note_tools(self, part: dict[str, Any]) -> None:
        for call in part.get("tool_calls") or ():
            function = call.get("function") if isinstance(call, dict) else None
            name = function.get("name") if isinstance(function, dict) else None
            if isinstance(name, str) and name:
                self.tools.add(name)


def _with_prompt(messages: list[dict[str, Any]], prompt: str) -> list[dict[str, Any]]:
    """`messages` with its last user message saying `prompt`: a middleware that rewrote the
    prompt after the chat hooks ran (they run first) is not undone by their list."""
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].get("role") == "user":
            content = messages[index].get("content")
            if isinstance(content, str) and content != prompt:  # (a list: parts of its own)
                messages = list(messages)
                messages[index] = {**messages[index], "content": prompt}
            break
    return messages


def _raise_error(payload: dict[str, Any]) -> None:
    error = payload.get("error")
    if error is None:
        return
    detail = error.get("message") if isinstance(error, dict) else error
    raise _ModelFailed(" ".join(str(detail or "an error without a message").split())[:200])


async def _sse_data(lines: AsyncIterable[bytes]) -> AsyncGenerator[str, None]:
    """The data of each server-sent event of a response body's lines."""
    events = _SseEvents()
    async for raw in lines:
        for data in events.feed(raw):
            yield data
    for data in events.end():
        yield data


class _SseEvents:
    """The data of server-sent events, from the stream's lines (WHATWG HTML, "Server-sent
    events"): an event's `data:` lines joined by newlines, ended by a blank line. A server may
    spread one JSON chunk over several `data:` lines, or send events with no data to keep the
    connection alive; a line-by-line reading took the first for broken JSON."""

    __slots__ = ("_data",)

    def __init__(self) -> None:
        self._data: list[str] = []

    def feed(self, raw: bytes) -> Iterator[str]:
        """The data of the event this line ends, if it ends one that has data."""
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        if not line:
            yield from self.end()
        elif line.startswith("data:"):
            value = line[5:]
            self._data.append(value[1:] if value.startswith(" ") else value)
        elif line == "data":  # the field with no colon: an empty data line
            self._data.append("")

    def end(self) -> Iterator[str]:
        """The event under way: at a blank line, or when the stream ends without one."""
        data, self._data = "\n".join(self._data), []
        if data.strip():
            yield data


def _code(status: int) -> str:
    return {401: "unauthorized", 403: "forbidden", 404: "not_found", 429: "rate_limited"}.get(
        status, "model_error"
    )


async def _describe(response: Any) -> str:
    detail = ""
    try:
        payload = await response.json(content_type=None)
        error = payload.get("error") if isinstance(payload, dict) else None
        if isinstance(error, dict):
            detail = str(error.get("message") or "")
    except (ValueError, AttributeError):
        pass
    reason = f": {detail[:200]}" if detail else ""
    return f"the model answered HTTP {response.status}{reason}"


def _model_ids(payload: Any) -> set[str] | None:
    """The ids of a `GET /models` answer (`{"data": [{"id": ...}, ...]}`); None if it is not
    one."""
    data = payload.get("data") if isinstance(payload, dict) else None
    if not isinstance(data, list):
        return None
    return {m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)}


def _usage(chunk: dict[str, Any]) -> dict[str, int]:
    usage = chunk.get("usage")
    if not isinstance(usage, dict):
        return {}
    return {k: v for k, v in usage.items() if isinstance(v, int)}
