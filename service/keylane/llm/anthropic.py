"""AnthropicProvider: the Anthropic Messages API (``POST {base_url}/v1/messages``).

The provider-neutral request (see ``keylane.llm.types``) is translated as follows:

* system messages are joined (blank line between) into the top-level ``system`` field;
* an assistant message with tool calls becomes content blocks: a ``text`` block (when it has
  text) then one ``tool_use`` block ``{"id", "name", "input"}`` per call;
* consecutive tool messages become ONE user message of ``tool_result`` blocks
  ``{"tool_use_id", "content"}``, in order: the API wants every result of one assistant
  turn in the next user turn;
* tools become ``{"name", "description", "input_schema"}``;
* ``max_tokens`` is required by the API: the request's sampling ``max_tokens``, else
  ``default_max_tokens``; ``stop`` becomes ``stop_sequences``; other keys pass unchanged.

The answer's ``text`` blocks are concatenated and its ``tool_use`` blocks become tool calls,
in order; ``stop_reason`` and ``usage.input_tokens`` / ``output_tokens`` are read as sent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx

from keylane.llm.http_provider import (
    DEFAULT_CONNECT_TIMEOUT_S,
    DEFAULT_TIMEOUT_S,
    HttpProvider,
    NeutralMessage,
    neutral_messages,
    neutral_tools,
)
from keylane.llm.types import AssistantTurn, LlmRequest, ToolCall

DEFAULT_BASE_URL = "https://api.anthropic.com"
DEFAULT_VERSION = "2023-06-01"


class AnthropicProvider(HttpProvider):
    """A Provider over the Anthropic Messages API.

    Safe to share between every key of a worker: one pooled HTTP client, no per-call state.
    ``x-api-key`` is sent only when ``api_key`` is set (a local gateway may need none).
    """

    name = "anthropic"
    endpoint = "/v1/messages"
    usage_fields = ("input_tokens", "output_tokens")

    def __init__(
        self,
        *,
        model: str,
        api_key: str | None,
        base_url: str = DEFAULT_BASE_URL,
        anthropic_version: str = DEFAULT_VERSION,
        default_max_tokens: int = 1024,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        extra_headers: Mapping[str, str] | None = None,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        headers = {
            "content-type": "application/json",
            "accept": "application/json",
            "anthropic-version": anthropic_version,
        }
        if api_key:
            headers["x-api-key"] = api_key
        headers.update(extra_headers or {})
        super().__init__(
            base_url=base_url,
            model=model,
            headers=headers,
            timeout_s=timeout_s,
            connect_timeout_s=connect_timeout_s,
            client=client,
        )
        self.default_max_tokens = default_max_tokens

    def request_body(self, request: LlmRequest) -> dict[str, Any]:
        """The JSON body sent for ``request`` (public so a reader can see the translation)."""
        system: list[str] = []
        messages: list[dict[str, Any]] = []
        results: list[dict[str, Any]] | None = None  # tool_result blocks of the open user turn
        for message in neutral_messages(self.name, request.messages):
            if message.role == "system":
                system.append(message.content)  # top-level: does not close a run of results
            elif message.role == "tool":
                if results is None:
                    results = []
                    messages.append({"role": "user", "content": results})
                results.append(
                    {"type": "tool_result", "tool_use_id": message.tool_call_id, "content": message.content}
                )
            else:
                results = None
                messages.append(_wire_message(message))
        sampling = dict(request.sampling_params or {})
        body: dict[str, Any] = {
            "model": self.model_for(request),
            "max_tokens": sampling.pop("max_tokens", None) or self.default_max_tokens,
            "messages": messages,
        }
        if system:
            body["system"] = "\n\n".join(system)
        tools = neutral_tools(self.name, request.tools_schema)
        if tools:
            body["tools"] = [
                {"name": t.name, "description": t.description, "input_schema": t.parameters} for t in tools
            ]
        stop = sampling.pop("stop", None)
        if stop:
            body["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
        for key, value in sampling.items():
            body.setdefault(key, value)
        return body

    def parse_turn(self, data: dict[str, Any]) -> AssistantTurn:
        content = data.get("content")
        if not isinstance(content, list):
            raise self._malformed(f"no 'content' list in the answer (keys {sorted(data)})")
        texts: list[str] = []
        calls: list[ToolCall] = []
        for index, block in enumerate(content):
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "text":
                text = block.get("text")
                if not isinstance(text, str):
                    raise self._malformed(f"content[{index}] is a text block without a string 'text'")
                texts.append(text)
            elif kind == "tool_use":
                call_id, name, arguments = block.get("id"), block.get("name"), block.get("input")
                if (
                    not isinstance(call_id, str)
                    or not isinstance(name, str)
                    or not isinstance(arguments, dict)
                ):
                    raise self._malformed(
                        f"content[{index}] is a tool_use block without string 'id', 'name' and object 'input'"
                    )
                calls.append(ToolCall(call_id, name, arguments))
            elif kind is None:
                raise self._malformed(f"content[{index}] is not a content block with a 'type'")
            # other block types (thinking, redacted_thinking, ...) carry nothing we return
        stop = data.get("stop_reason")
        return AssistantTurn(
            text="".join(texts), tool_calls=calls, stop_reason=stop if isinstance(stop, str) else ""
        )


def _wire_message(message: NeutralMessage) -> dict[str, Any]:
    if not message.tool_calls:
        return {"role": message.role, "content": message.content}
    blocks: list[dict[str, Any]] = []
    if message.content:
        blocks.append({"type": "text", "text": message.content})
    blocks.extend(
        {"type": "tool_use", "id": call.id, "name": call.name, "input": call.arguments}
        for call in message.tool_calls
    )
    return {"role": "assistant", "content": blocks}
