"""The HTTP plumbing real providers share: one pooled client, and HTTP failures as errors.

A provider instance is shared by every key of a worker, so it owns one
``httpx.AsyncClient`` (HTTP/2 where the server offers it over TLS, a bounded connection
pool, explicit timeouts) for its whole life; :meth:`HttpProvider.aclose` closes it. The
mapping from what went wrong to an error class is the same for every provider:

* connect/read/write/pool timeout, or HTTP 408 -> ProviderTimeout (retriable);
* connection refused, reset or broken -> ProviderUnavailable (retriable);
* HTTP 429 -> RateLimitError with ``Retry-After`` (seconds or an HTTP-date) or
  ``retry-after-ms`` parsed (retriable);
* HTTP 5xx -> ServerError (retriable);
* any other non-2xx, a body that is not JSON, or not a JSON object -> ProviderRequestError.

Error messages start with the provider's name and carry the provider's own error message
(``{"error": {"message": ...}}`` and the usual variants) when the body has one.
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC
from typing import Any, ClassVar, Literal

import httpx
import msgspec

from keylane.llm.errors import (
    ProviderRequestError,
    ProviderTimeout,
    ProviderUnavailable,
    RateLimitError,
    ServerError,
)
from keylane.llm.types import (
    AssistantTurn,
    LlmRequest,
    LlmResponse,
    ProviderError,
    ToolCall,
    encode_turn,
)

DEFAULT_TIMEOUT_S = 60.0
DEFAULT_CONNECT_TIMEOUT_S = 5.0
MAX_CONNECTIONS = 100
MAX_KEEPALIVE_CONNECTIONS = 20
_SNIPPET_CHARS = 300
_HINTS = {
    401: "check the API key (api_key_env / api_key_file in the provider URL)",
    403: "check that the API key may use this model",
    404: "check the base URL (OpenAI-compatible servers end in /v1) and the model name",
}


class HttpProvider:
    """Base of the HTTP providers: owns the client and turns HTTP outcomes into errors.

    ``client`` lets a caller supply its own ``httpx.AsyncClient`` (for example with a
    custom transport); the provider then neither configures nor closes it.
    """

    name: ClassVar[str] = "http"
    endpoint: ClassVar[str]
    """The path under ``base_url`` that one call POSTs to."""
    usage_fields: ClassVar[tuple[str, str]]
    """The names of the prompt and completion token counts in the answer's ``usage``."""

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        headers: Mapping[str, str],
        timeout_s: float = DEFAULT_TIMEOUT_S,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self._headers = dict(headers)
        self._owns_client = client is None
        self._client = client or httpx.AsyncClient(
            http2=True,
            limits=httpx.Limits(
                max_connections=MAX_CONNECTIONS, max_keepalive_connections=MAX_KEEPALIVE_CONNECTIONS
            ),
            timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s),
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(base_url={self.base_url!r}, model={self.model!r})"

    def model_for(self, request: LlmRequest) -> str:
        """The request's model, or the configured one when the request names none."""
        return request.model_id or self.model

    def request_body(self, request: LlmRequest) -> dict[str, Any]:
        """The JSON body sent for ``request`` (public so a reader can see the translation)."""
        raise NotImplementedError

    def parse_turn(self, data: dict[str, Any]) -> AssistantTurn:
        """The answer of a 2xx JSON object, or ProviderRequestError when it is malformed."""
        raise NotImplementedError

    async def complete(self, request: LlmRequest) -> LlmResponse:
        """One call; raises a ProviderError subclass on any failure."""
        data, response = await self._post_json(self.endpoint, self.request_body(request))
        turn = self.parse_turn(data)
        usage = data.get("usage")
        usage = usage if isinstance(usage, dict) else {}
        model = data.get("model")
        prompt, completion = self.usage_fields
        return LlmResponse(
            response=encode_turn(turn),
            model_id=model if isinstance(model, str) and model else self.model_for(request),
            prompt_tokens=as_int(usage.get(prompt)),
            completion_tokens=as_int(usage.get(completion)),
            metadata={
                "provider": self.name,
                "response_id": data.get("id") if isinstance(data.get("id"), str) else "",
                "http_version": response.http_version,
            },
        )

    async def aclose(self) -> None:
        """Close the HTTP client (when this provider created it). Idempotent."""
        if self._owns_client:
            await self._client.aclose()

    async def _post_json(self, path: str, body: dict[str, Any]) -> tuple[dict[str, Any], httpx.Response]:
        """POST ``body`` to ``base_url + path``; the decoded JSON object of a 2xx answer, or raise."""
        url = self.base_url + path
        try:
            response = await self._client.post(url, content=msgspec.json.encode(body), headers=self._headers)
        except httpx.TimeoutException as exc:
            raise ProviderTimeout(f"{self.name}: {_timeout_kind(exc)} timeout calling {url}") from exc
        except httpx.TransportError as exc:
            raise ProviderUnavailable(
                f"{self.name}: cannot reach {url}: {type(exc).__name__}: {str(exc) or 'no detail'}"
            ) from exc
        if not 200 <= response.status_code < 300:
            raise self._status_error(response, url)
        return self._json_object(response), response

    def _status_error(self, response: httpx.Response, url: str) -> ProviderError:
        status = response.status_code
        message = f"{self.name}: HTTP {status} from {url}: {error_message(response)}"
        if status in _HINTS:
            message += f"; {_HINTS[status]}"
        if status == 408:
            return ProviderTimeout(message)
        if status == 429:
            return RateLimitError(message, retry_after_s=retry_after_s(response.headers))
        if 500 <= status <= 599:
            return ServerError(message, status=status, retry_after_s=retry_after_s(response.headers))
        return ProviderRequestError(message, status=status)

    def _json_object(self, response: httpx.Response) -> dict[str, Any]:
        body = response.content
        try:
            decoded = msgspec.json.decode(body)
        except msgspec.DecodeError:
            raise ProviderRequestError(
                f"{self.name}: response body is not valid JSON "
                f"(status {response.status_code}, {len(body)} bytes): {_snippet(body)}",
                status=response.status_code,
            ) from None
        if not isinstance(decoded, dict):
            raise ProviderRequestError(
                f"{self.name}: response body is a JSON {type(decoded).__name__}, expected an object "
                f"(status {response.status_code})",
                status=response.status_code,
            )
        return decoded

    def _malformed(self, what: str) -> ProviderRequestError:
        """A 2xx answer that is JSON but not the provider's format."""
        return ProviderRequestError(f"{self.name}: malformed response: {what}", status=200)


def error_message(response: httpx.Response) -> str:
    """The provider's own error message from an error body, else a snippet of the body."""
    try:
        decoded = msgspec.json.decode(response.content)
    except msgspec.DecodeError:
        decoded = None
    if isinstance(decoded, dict):
        error = decoded.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            kind = error.get("type")
            return f"{error['message']} ({kind})" if isinstance(kind, str) and kind else error["message"]
        for candidate in (error, decoded.get("message"), decoded.get("detail")):
            if isinstance(candidate, str) and candidate:
                return candidate
    return _snippet(response.content) or response.reason_phrase or "empty body"


def retry_after_s(headers: httpx.Headers, *, now: float | None = None) -> float | None:
    """Seconds to wait from ``retry-after-ms``, or ``Retry-After`` as seconds or an HTTP-date.

    None when absent or unreadable; never negative. ``now`` (epoch seconds) is for tests.
    """
    millis = headers.get("retry-after-ms")
    if millis is not None:
        try:
            return max(0.0, float(millis) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # "-0000" means UTC with no zone given
        when = when.replace(tzinfo=UTC)
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def _timeout_kind(exc: httpx.TimeoutException) -> str:
    kinds: dict[type[httpx.TimeoutException], str] = {
        httpx.ConnectTimeout: "connect",
        httpx.ReadTimeout: "read",
        httpx.WriteTimeout: "write",
        httpx.PoolTimeout: "connection-pool",
    }
    return kinds.get(type(exc), "request")


def _snippet(body: bytes) -> str:
    text = body.decode("utf-8", "replace").strip()
    return text if len(text) <= _SNIPPET_CHARS else text[:_SNIPPET_CHARS] + "..."


Role = Literal["system", "user", "assistant", "tool"]
_ROLES: frozenset[str] = frozenset(("system", "user", "assistant", "tool"))


@dataclass(frozen=True, kw_only=True)
class NeutralMessage:
    """One validated provider-neutral message (see ``keylane.llm.types``)."""

    role: Role
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str = ""


def neutral_messages(provider: str, messages: list[Any]) -> list[NeutralMessage]:
    """Validate ``LlmRequest.messages``; a wrong message raises ProviderRequestError naming it."""
    result = []
    for index, message in enumerate(messages):
        where = f"{provider}: messages[{index}]"
        if isinstance(message, str):
            message = {"role": "user", "content": message}
        if not isinstance(message, dict):
            raise ProviderRequestError(
                f"{where} is a {type(message).__name__}; expected a dict with 'role' and 'content'"
            )
        role = message.get("role")
        if role not in _ROLES:
            raise ProviderRequestError(f"{where}: role {role!r} is not one of system, user, assistant, tool")
        content = message.get("content")
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise ProviderRequestError(f"{where}: content is a {type(content).__name__}; expected a string")
        tool_call_id = message.get("tool_call_id", "")
        if role == "tool" and not (isinstance(tool_call_id, str) and tool_call_id):
            raise ProviderRequestError(f"{where}: a tool message needs 'tool_call_id' (the call's id)")
        raw_calls = message.get("tool_calls") or []
        if raw_calls and role != "assistant":
            raise ProviderRequestError(f"{where}: only an assistant message can carry tool_calls")
        if not isinstance(raw_calls, list):
            raise ProviderRequestError(f"{where}: tool_calls must be a list")
        try:
            calls = tuple(msgspec.convert(call, ToolCall) for call in raw_calls)
        except msgspec.ValidationError as exc:
            raise ProviderRequestError(
                f"{where}: a tool call must be {{'id': str, 'name': str, 'arguments': dict}}: {exc}"
            ) from None
        result.append(
            NeutralMessage(role=role, content=content, tool_calls=calls, tool_call_id=tool_call_id or "")
        )
    return result


class NeutralTool(msgspec.Struct, frozen=True):
    """One validated entry of ``LlmRequest.tools_schema``."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = msgspec.field(default_factory=lambda: {"type": "object", "properties": {}})


def neutral_tools(provider: str, tools_schema: Any) -> list[NeutralTool]:
    """Validate ``LlmRequest.tools_schema`` (None or empty: no tools)."""
    if not tools_schema:
        return []
    if not isinstance(tools_schema, list):
        kind = type(tools_schema).__name__
        raise ProviderRequestError(f"{provider}: tools_schema is a {kind}; expected a list")
    try:
        return [msgspec.convert(tool, NeutralTool) for tool in tools_schema]
    except msgspec.ValidationError as exc:
        raise ProviderRequestError(
            f"{provider}: a tools_schema entry must be {{'name': str, 'description': str, "
            f"'parameters': JSON Schema dict}}: {exc}"
        ) from None


def as_int(value: Any) -> int:
    """A token count from a usage block: a non-negative int, else 0 (servers differ)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0
