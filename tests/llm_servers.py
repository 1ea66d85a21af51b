"""In-process model servers that speak the real OpenAI and Anthropic wire formats.

Each server answers from a queue of scripted replies (then from an optional default reply)
and records every request it received. Use it as an async context manager inside a test::

    async with FakeOpenAIServer() as server:
        server.reply_text("hello", prompt_tokens=5, completion_tokens=1)
        provider = OpenAIProvider(server.base_url, "gpt-test")
        ...
        assert server.count == 1 and server.bodies[0]["model"] == "gpt-test"

or from synchronous code (an end-to-end test, a script) on its own event loop in a thread::

    server = FakeAnthropicServer()
    base_url = server.start_in_thread()
    try: ...
    finally: server.stop()

A request arriving when nothing is scripted gets a 400 in the provider's error format that
says so, which a provider raises as a non-retriable error: a test never gets an answer it
did not script. Scripting and inspection are thread-safe.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, ClassVar, Self

from aiohttp import web

ToolCallSpec = tuple[str, str, Mapping[str, Any]]
"""(id, name, arguments) of a tool call a scripted reply carries."""


@dataclass(frozen=True)
class RecordedRequest:
    """One request a server received, as it arrived."""

    method: str
    path: str
    headers: Mapping[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        """The body decoded as JSON (None when it is not JSON)."""
        try:
            return json.loads(self.body)
        except ValueError:
            return None


@dataclass(frozen=True, kw_only=True)
class Reply:
    """A scripted answer: status, raw body, headers, and how long to wait before sending it."""

    status: int = 200
    body: bytes = b""
    headers: Mapping[str, str] = field(default_factory=dict)
    delay_s: float = 0.0


class _ScriptedServer:
    """Shared machinery; subclasses set the endpoint path and the wire format."""

    endpoint: ClassVar[str]
    url_suffix: ClassVar[str] = ""

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0, model: str = "scripted-model") -> None:
        self.host = host
        self.port = port
        self.model = model
        self.requests: list[RecordedRequest] = []
        self._replies: deque[Reply] = deque()
        self._default: Reply | None = None
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # --- scripting -------------------------------------------------------------------------

    def reply(
        self,
        *,
        status: int = 200,
        json_body: Any = None,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        delay_s: float = 0.0,
        times: int = 1,
        always: bool = False,
    ) -> Self:
        """Queue a raw reply ``times`` times (``always``: answer it whenever the queue is empty).

        ``json_body`` is encoded as JSON; ``body`` is sent as it is (e.g. a broken body).
        """
        raw = body if body is not None else json.dumps(json_body).encode() if json_body is not None else b""
        all_headers = dict(headers or {})
        if json_body is not None:
            all_headers.setdefault("content-type", "application/json")
        scripted = Reply(status=status, body=raw, headers=all_headers, delay_s=delay_s)
        with self._lock:
            if always:
                self._default = scripted
            else:
                self._replies.extend([scripted] * times)
        return self

    def reply_text(
        self,
        text: str,
        *,
        prompt_tokens: int = 10,
        completion_tokens: int = 5,
        delay_s: float = 0.0,
        times: int = 1,
        always: bool = False,
    ) -> Self:
        """Queue a successful answer with ``text`` and these token counts."""
        return self.reply(
            json_body=self.answer_body(
                text, [], prompt_tokens=prompt_tokens, completion_tokens=completion_tokens
            ),
            delay_s=delay_s,
            times=times,
            always=always,
        )

    def reply_tool_calls(
        self,
        calls: Iterable[ToolCallSpec],
        *,
        text: str = "",
        prompt_tokens: int = 10,
        completion_tokens: int = 5,
    ) -> Self:
        """Queue an answer asking for these tool calls (with optional text before them)."""
        return self.reply(
            json_body=self.answer_body(
                text, list(calls), prompt_tokens=prompt_tokens, completion_tokens=completion_tokens
            )
        )

    def reply_error(
        self,
        status: int,
        message: str,
        *,
        headers: Mapping[str, str] | None = None,
        times: int = 1,
        always: bool = False,
    ) -> Self:
        """Queue an error reply in the provider's own error format."""
        return self.reply(
            status=status,
            json_body=self.error_body(status, message),
            headers=headers,
            times=times,
            always=always,
        )

    def answer_body(
        self, text: str, calls: list[ToolCallSpec], *, prompt_tokens: int, completion_tokens: int
    ) -> dict[str, Any]:
        """The provider's success body (subclasses)."""
        raise NotImplementedError

    def error_body(self, status: int, message: str) -> dict[str, Any]:
        """The provider's error body (subclasses)."""
        raise NotImplementedError

    # --- inspection ------------------------------------------------------------------------

    @property
    def count(self) -> int:
        """How many requests reached the endpoint."""
        with self._lock:
            return len(self.requests)

    @property
    def bodies(self) -> list[Any]:
        """Every request's JSON body, in arrival order."""
        with self._lock:
            return [request.json for request in self.requests]

    @property
    def base_url(self) -> str:
        """What to configure the provider with (valid once started)."""
        if self._runner is None:
            raise RuntimeError(f"{type(self).__name__} is not started")
        return f"http://{self.host}:{self.port}{self.url_suffix}"

    # --- lifecycle -------------------------------------------------------------------------

    async def start(self) -> str:
        """Listen (port 0 picks a free one) on the running loop; returns ``base_url``."""
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        # handler_cancellation: a client that gave up (a timeout test) does not keep a
        # delayed handler, and so close(), waiting.
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=0.5)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port)
        await site.start()
        self.port = runner.addresses[0][1]
        self._runner = runner
        return self.base_url

    async def close(self) -> None:
        """Stop listening and drop open connections."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def start_in_thread(self) -> str:
        """Start on a new event loop in a daemon thread (for synchronous callers); returns base_url."""
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name=f"{type(self).__name__}", daemon=True)
        thread.start()
        self._loop, self._thread = loop, thread
        return asyncio.run_coroutine_threadsafe(self.start(), loop).result(timeout=10)

    def stop(self) -> None:
        """Stop a server started with start_in_thread, and its loop and thread."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        asyncio.run_coroutine_threadsafe(self.close(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()
        self._loop = self._thread = None

    # --- serving ---------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        if request.method != "POST" or request.path != self.endpoint:
            return self._json(404, self.error_body(404, f"no route for {request.method} {request.path}"))
        with self._lock:
            self.requests.append(RecordedRequest(request.method, request.path, dict(request.headers), body))
            number = len(self.requests)
            scripted = self._replies.popleft() if self._replies else self._default
        if scripted is None:
            message = f"{type(self).__name__}: no scripted reply left for request #{number}"
            return self._json(400, self.error_body(400, message))
        if scripted.delay_s:
            await asyncio.sleep(scripted.delay_s)
        return web.Response(status=scripted.status, body=scripted.body, headers=dict(scripted.headers))

    @staticmethod
    def _json(status: int, body: Any) -> web.Response:
        return web.Response(status=status, body=json.dumps(body).encode(), content_type="application/json")


def _error_type(status: int) -> str:
    return {
        400: "invalid_request_error",
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        429: "rate_limit_error",
        529: "overloaded_error",
    }.get(status, "api_error")


class FakeOpenAIServer(_ScriptedServer):
    """Speaks ``POST /v1/chat/completions``; ``base_url`` ends in ``/v1`` like OpenAI's."""

    endpoint = "/v1/chat/completions"
    url_suffix = "/v1"

    def answer_body(
        self, text: str, calls: list[ToolCallSpec], *, prompt_tokens: int, completion_tokens: int
    ) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": text or (None if calls else "")}
        if calls:
            message["tool_calls"] = [
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
                for call_id, name, args in calls
            ]
        return {
            "id": f"chatcmpl-{next(self._ids)}",
            "object": "chat.completion",
            "created": 1_700_000_000,
            "model": self.model,
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }

    def error_body(self, status: int, message: str) -> dict[str, Any]:
        kind = "server_error" if status >= 500 else _error_type(status)
        return {"error": {"message": message, "type": kind, "param": None, "code": None}}


class FakeAnthropicServer(_ScriptedServer):
    """Speaks ``POST /v1/messages``; ``base_url`` is the bare origin like api.anthropic.com."""

    endpoint = "/v1/messages"

    def answer_body(
        self, text: str, calls: list[ToolCallSpec], *, prompt_tokens: int, completion_tokens: int
    ) -> dict[str, Any]:
        content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text or not calls else []
        content += [
            {"type": "tool_use", "id": call_id, "name": name, "input": dict(args)}
            for call_id, name, args in calls
        ]
        return {
            "id": f"msg_{next(self._ids)}",
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": "tool_use" if calls else "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": prompt_tokens, "output_tokens": completion_tokens},
        }

    def error_body(self, status: int, message: str) -> dict[str, Any]:
        return {"type": "error", "error": {"type": _error_type(status), "message": message}}
