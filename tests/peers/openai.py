"""A local OpenAI-compatible chat-completions server (HTTP + server-sent events) for agent tests."""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import Callable
from typing import Any

from aiohttp import web

from tests.peers.http import serve

Reply = Callable[[list[dict[str, Any]]], list[str]]


class ChatCompletionsPeer:
    """Answers `POST /v1/chat/completions`; `reply(messages)` gives the pieces to stream."""

    def __init__(self, api_key: str, reply: Reply | None = None) -> None:
        self.api_key = api_key
        self.reply: Reply = reply or (lambda messages: ["You said: ", messages[-1]["content"]])
        self.requests: list[dict[str, Any]] = []
        self.fail_next: tuple[int, dict[str, Any]] | None = None
        self.failures: deque[tuple[int, dict[str, Any], dict[str, str]]] = deque()
        """Answers (status, body, headers) given before any stream, one request each."""
        self.answer_as = "stream"
        """`stream` (SSE), `json` (one completion although a stream was asked for), `tools`
        (a streamed tool call and no text), or `error` (the pieces, then an error object)."""
        self.models: list[str] | None = ["tiny-1"]
        """What `GET /v1/models` lists; None: no such endpoint (404), as on some proxies."""
        self.finish_reason = "stop"
        """The last piece's `finish_reason` (`length`: the model hit its token limit)."""
        self.spread_events = False
        """Send each chunk's JSON over several `data:` lines (CRLF line ends), between events
        with no data and comments: all legal server-sent events."""
        self.piece_gap = 0.0
        """Seconds between streamed pieces: a slow model, whose answer takes longer than one
        piece does (the pacing a real server has, done here as the server's own)."""
        self._runner: web.AppRunner | None = None
        self.base_url = ""

    async def __aenter__(self) -> ChatCompletionsPeer:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._completions)
        app.router.add_get("/v1/models", self._models)
        self._runner, port = await serve(app)
        self.base_url = f"http://127.0.0.1:{port}/v1"
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def _refused(self, request: web.Request) -> web.Response | None:
        """401 for a wrong key, quoting it back as OpenAI does (a secret that must not show)."""
        if request.headers.get("Authorization") == f"Bearer {self.api_key}":
            return None
        error = {"message": f"Incorrect API key provided: {request.headers.get('Authorization')}"}
        return web.json_response({"error": error}, status=401)

    async def _models(self, request: web.Request) -> web.Response:
        if (refused := self._refused(request)) is not None:
            return refused
        if self.models is None:
            return web.json_response({"error": {"message": "not found"}}, status=404)
        data = [{"id": m, "object": "model", "owned_by": "peer"} for m in self.models]
        return web.json_response({"object": "list", "data": data})

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        if (refused := self._refused(request)) is not None:
            return refused
        body = await request.json()
        self.requests.append(body)
        if self.fail_next is not None:
            status, payload = self.fail_next
            self.fail_next = None
            return web.json_response(payload, status=status)
        if self.failures:
            status, payload, headers = self.failures.popleft()
            return web.json_response(payload, status=status, headers=headers)
        pieces = self.reply(body["messages"])
        if self.answer_as == "json":
            message = {"role": "assistant", "content": "".join(pieces)}
            return web.json_response({"choices": [{"index": 0, "message": message}]})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        if self.answer_as == "tools":
            call = {"index": 0, "id": "call_1", "type": "function"}
            call["function"] = {"name": "get_weather", "arguments": '{"city": "Paris"}'}
            chunk = {"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]}
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
            pieces = []
        for n, piece in enumerate(pieces):
            if n and self.piece_gap:
                await asyncio.sleep(self.piece_gap)
            choice: dict[str, Any] = {"index": 0, "delta": {"content": piece}}
            if n == len(pieces) - 1:
                choice["finish_reason"] = self.finish_reason
            await response.write(self._event({"choices": [choice]}))
        if self.answer_as == "error":
            error = {"error": {"message": "the model overloaded", "type": "server_error"}}
            await response.write(f"data: {json.dumps(error)}\n\n".encode())
        usage = {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3}}
        await response.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
        await response.write_eof()
        return response

    def _event(self, chunk: dict[str, Any]) -> bytes:
        if not self.spread_events:
            return f"data: {json.dumps(chunk)}\n\n".encode()
        lines = "".join(f"data:{line}\r\n" for line in json.dumps(chunk, indent=1).split("\n"))
        return f": keep-alive\r\n\r\ndata:\r\n\r\nevent: chunk\r\n{lines}\r\n".encode()
