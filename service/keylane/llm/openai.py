"""OpenAIProvider: the Chat Completions API, as spoken by OpenAI, vLLM, llama.cpp and Ollama.

One call is one ``POST {base_url}/chat/completions`` (``base_url`` ends in ``/v1``). The
provider-neutral request (see ``keylane.llm.types``) is translated as follows:

* ``model``: ``LlmRequest.model_id`` when it is not empty, else the configured model;
* an assistant message's tool calls become ``{"id", "type": "function", "function":
  {"name", "arguments": <JSON text>}}``; a tool message becomes ``{"role": "tool",
  "tool_call_id", "content"}``;
* tools become ``{"type": "function", "function": {"name", "description", "parameters"}}``;
* sampling parameters are sent as they are (``max_tokens``, ``temperature``, ``top_p``,
  ``stop`` and any other key the server understands).

The answer is ``choices[0]``: its message's content and tool calls (arguments decoded from
JSON text into a dict), its ``finish_reason`` as the stop reason, and ``usage`` for token
counts (0 when the server sends none).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx
import msgspec

from keylane.llm.http_provider import (
    DEFAULT_CONNECT_TIMEOUT_S,
    DEFAULT_TIMEOUT_S,
    HttpProvider,
    NeutralMessage,
    neutral_messages,
    neutral_tools,
)
from keylane.llm.types import AssistantTurn, LlmRequest, ToolCall


class OpenAIProvider(HttpProvider):
    """A Provider over an OpenAI-compatible ``/chat/completions`` endpoint.

    Safe to share between every key of a worker: one pooled HTTP client, no per-call state.
    The ``Authorization: Bearer`` header is sent only when ``api_key`` is set (local servers
    such as vLLM or Ollama need none).
    """

    name = "openai"
    endpoint = "/chat/completions"
    usage_fields = ("prompt_tokens", "completion_tokens")

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        extra_headers: Mapping[str, str] | None = None,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        headers = {"content-type": "application/json", "accept": "application/json"}
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"
        headers.update(extra_headers or {})
        super().__init__(
            base_url=base_url,
            model=model,
            headers=headers,
            timeout_s=timeout_s,
            connect_timeout_s=connect_timeout_s,
            client=client,
        )

    def request_body(self, request: LlmRequest) -> dict[str, Any]:
        """The JSON body sent for ``request`` (public so a reader can see the translation)."""
        body: dict[str, Any] = {
            "model": self.model_for(request),
            "messages": [_wire_message(m) for m in neutral_messages(self.name, request.messages)],
        }
        tools = neutral_tools(self.name, request.tools_schema)
        if tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
                }
                for t in tools
            ]
        for key, value in (request.sampling_params or {}).items():
            body.setdefault(key, value)
        return body

    def parse_turn(self, data: dict[str, Any]) -> AssistantTurn:
        choices = data.get("choices")
        if not isinstance(choices, list) or not choices:
            found = "an empty list" if choices == [] else f"keys {sorted(data)}"
            raise self._malformed(f"no 'choices' in the answer ({found})")
        choice = choices[0]
        message = choice.get("message") if isinstance(choice, dict) else None
        if not isinstance(message, dict):
            raise self._malformed("choices[0] has no 'message' object")
        text = message.get("content")
        if text is None:
            text = ""
        if not isinstance(text, str):
            raise self._malformed(f"choices[0].message.content is a {type(text).__name__}, expected a string")
        finish = choice.get("finish_reason")
        return AssistantTurn(
            text=text,
            tool_calls=[self._tool_call(i, call) for i, call in enumerate(message.get("tool_calls") or [])],
            stop_reason=finish if isinstance(finish, str) else "",
        )

    def _tool_call(self, index: int, call: Any) -> ToolCall:
        where = f"choices[0].message.tool_calls[{index}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            raise self._malformed(f"{where} has no 'function' object")
        call_id, name, raw = call.get("id"), function.get("name"), function.get("arguments")
        if not isinstance(call_id, str) or not isinstance(name, str) or not name:
            raise self._malformed(f"{where} needs a string 'id' and 'function.name'")
        if isinstance(raw, dict):  # some servers send the object, not its JSON text
            return ToolCall(call_id, name, raw)
        if raw is None or raw == "":
            return ToolCall(call_id, name, {})
        try:
            arguments = msgspec.json.decode(raw) if isinstance(raw, str) else None
        except msgspec.DecodeError:
            arguments = None
        if not isinstance(arguments, dict):
            raise self._malformed(f"{where} ({name!r}) arguments are not a JSON object: {str(raw)[:200]!r}")
        return ToolCall(call_id, name, arguments)


def _wire_message(message: NeutralMessage) -> dict[str, Any]:
    if message.role == "tool":
        return {"role": "tool", "tool_call_id": message.tool_call_id, "content": message.content}
    wire: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        wire["content"] = message.content or None  # OpenAI: null content beside tool calls
        wire["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": msgspec.json.encode(call.arguments).decode()},
            }
            for call in message.tool_calls
        ]
    return wire
