"""An agent backed by any OpenAI-compatible chat-completions API (OpenAI, vLLM, Ollama, LiteLLM, …).

The reply is streamed (server-sent events) as `TextDelta`s and ends with a `Result`; the thread's
recent history is sent along, so the model sees the conversation. Failures become an `Error` event
that names what went wrong in plain words — never the API key.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from talkbridge.agents.base import Error, Result, TextDelta, TurnContext

DEFAULT_HISTORY = 20


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
    ) -> None:
        self.name = name
        self._url = base_url.rstrip("/") + "/chat/completions"
        self._model = model
        self._api_key = api_key
        self._system_prompt = system_prompt
        self._history = history
        self._timeout = timeout

    async def messages(self, ctx: TurnContext) -> list[dict[str, str]]:
        """What the model is sent: system prompt, earlier turns of the thread, this prompt.

        A chat hook's message list (`ctx.state["messages"]`) replaces the default one."""
        given = ctx.state.get("messages")
        if isinstance(given, list) and given:
            return [m for m in given if isinstance(m, dict)]
        messages: list[dict[str, str]] = []
        if self._system_prompt:
            messages.append({"role": "system", "content": self._system_prompt})
        if self._history:
            for entry in await ctx.history(self._history + 1):
                if entry.message_id == ctx.message.id:
                    continue  # this turn's own message: it is the prompt below
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
        pieces: list[str] = []
        usage: dict[str, int] = {}
        timeout = aiohttp.ClientTimeout(total=self._timeout)
        try:
            async with (
                aiohttp.ClientSession(timeout=timeout) as session,
                session.post(self._url, json=body, headers=headers) as response,
            ):
                if response.status != 200:
                    message = await _describe(response)
                    if self._api_key:  # some servers quote the key they refused
                        message = message.replace(self._api_key, "***")
                    yield Error(message=message, code=_code(response.status))
                    return
                async for raw in response.content:
                    line = raw.decode("utf-8", "replace").strip()
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    chunk = json.loads(data)
                    usage = _usage(chunk) or usage
                    for choice in chunk.get("choices") or ():
                        text = (choice.get("delta") or {}).get("content")
                        if text:
                            pieces.append(text)
                            yield TextDelta(text=text)
        except (aiohttp.ClientError, TimeoutError) as exc:
            reason = "no answer in time" if isinstance(exc, TimeoutError) else type(exc).__name__
            yield Error(message=f"the model at {self._url} could not be reached: {reason}")
            return
        except (ValueError, AttributeError) as exc:
            yield Error(message=f"the model at {self._url} sent an unreadable stream: {exc}")
            return
        yield Result(text="".join(pieces), usage=usage)


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


def _usage(chunk: dict[str, Any]) -> dict[str, int]:
    usage = chunk.get("usage")
    if not isinstance(usage, dict):
        return {}
    return {k: v for k, v in usage.items() if isinstance(v, int)}
