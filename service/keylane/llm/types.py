"""What a model call is: LlmRequest in, LlmResponse out, through a Provider.

Real providers (``keylane.llm.openai``, ``keylane.llm.anthropic``) speak a provider-neutral
format and translate it to their wire format:

* ``LlmRequest.messages``: dicts ``{"role": "system" | "user" | "assistant" | "tool",
  "content": str}``; an assistant turn may carry ``"tool_calls": [{"id", "name",
  "arguments": dict}]``; a tool message carries ``"tool_call_id"`` and ``"content"`` (the
  result as JSON text). A bare string is taken as a user message.
* ``LlmRequest.tools_schema``: ``[{"name", "description", "parameters": JSON Schema}]``.
* ``LlmRequest.sampling_params``: ``max_tokens``, ``temperature``, ``top_p``, ``stop`` are
  translated; any other key is passed to the provider unchanged.
* ``LlmResponse.response``: the msgspec JSON of an :class:`AssistantTurn`; read it with
  :meth:`LlmResponse.turn`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import msgspec

from keylane.digests import sha256
from keylane.errors import KeylaneError


@dataclass(frozen=True, kw_only=True)
class LlmRequest:
    """One model call. Everything that changes the answer is part of the replay-cache key."""

    model_id: str
    messages: list[Any]
    tools_schema: Any = None
    sampling_params: dict[str, Any] | None = None

    def canonical(self) -> bytes:
        """Canonical JSON of the request (sorted keys, no whitespace): stable across processes."""
        return canonical_json(
            {
                "model_id": self.model_id,
                "messages": self.messages,
                "tools_schema": self.tools_schema,
                "sampling_params": self.sampling_params,
            }
        )


class LlmResponse(msgspec.Struct, frozen=True, kw_only=True):
    """A model's answer. ``cached`` is True when it came from the replay cache.

    A Struct, as keylane.authoring.api's Complete is and for the same reason: one is built
    for every model call, after the model answered."""

    response: bytes
    model_id: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached: bool = False
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)

    def turn(self) -> AssistantTurn:
        """The answer as an AssistantTurn.

        Bytes that are not a JSON object made only of AssistantTurn fields (for example a
        FakeLLM plain payload) become ``AssistantTurn(text=<the bytes as UTF-8>)``.
        """
        try:
            decoded = msgspec.json.decode(self.response)
        except msgspec.DecodeError:
            decoded = None
        if isinstance(decoded, dict) and decoded and decoded.keys() <= _TURN_FIELDS:
            try:
                return msgspec.convert(decoded, AssistantTurn)
            except msgspec.ValidationError:
                pass
        return AssistantTurn(text=self.response.decode("utf-8", "replace"))


class ToolCall(msgspec.Struct, frozen=True):
    """A tool the model asked to call: ``arguments`` is the decoded JSON object."""

    id: str
    name: str
    arguments: dict[str, Any]


class AssistantTurn(msgspec.Struct, frozen=True):
    """What a real provider answered: text, tool calls (in the model's order), stop reason.

    ``stop_reason`` is the provider's own word (``"stop"``, ``"tool_calls"``, ``"end_turn"``,
    ``"tool_use"``, ``"length"``, ``"max_tokens"``...), passed through unchanged.
    """

    text: str = ""
    tool_calls: list[ToolCall] = msgspec.field(default_factory=list)
    stop_reason: str = ""

    def as_message(self) -> dict[str, Any]:
        """This turn as a provider-neutral assistant message, to append to the next request."""
        message: dict[str, Any] = {"role": "assistant", "content": self.text}
        if self.tool_calls:
            message["tool_calls"] = [
                {"id": call.id, "name": call.name, "arguments": call.arguments} for call in self.tool_calls
            ]
        return message


_TURN_FIELDS = frozenset(AssistantTurn.__struct_fields__)


def encode_turn(turn: AssistantTurn) -> bytes:
    """The bytes a real provider puts in ``LlmResponse.response`` for ``turn``.

    Lets a FakeLLM script answer with tool calls:
    ``respond_with(encode_turn(AssistantTurn(tool_calls=[ToolCall("c1", "lookup", {})])))``.
    """
    return msgspec.json.encode(turn)


class ProviderError(KeylaneError):
    """A model provider failed; ``retriable`` says whether trying again can help."""

    retriable = False


@runtime_checkable
class Provider(Protocol):
    """A model provider. Implementations must be safe to share between keys of one worker."""

    async def complete(self, request: LlmRequest) -> LlmResponse:
        """Answer one request, or raise (ProviderError or any exception)."""
        ...


def provider_name(provider: Provider) -> str:
    """Which provider answers, for metrics (``gen_ai_provider_name``): its ``name``
    (``"openai"``, ``"anthropic"``, ``"fake"``, as OpenTelemetry spells them), else its
    class name. Bounded by the code, never by the calls."""
    name = getattr(provider, "name", None)
    return name if isinstance(name, str) and name else type(provider).__name__


def requested_model(provider: Provider, request: LlmRequest) -> str:
    """The model a call asks for, for metrics (``gen_ai_request_model``): the request's
    ``model_id``, else the model the provider is configured with (its ``model``), else ""."""
    if request.model_id:
        return request.model_id
    model = getattr(provider, "model", None)
    return model if isinstance(model, str) else ""


def canonical_json(value: Any) -> bytes:
    """JSON with sorted keys and no whitespace; msgspec's ``order="sorted"`` does both."""
    return msgspec.json.encode(value, order="sorted")


def cache_key(request: LlmRequest, *, entity_key: bytes, seq: int) -> str:
    """sha256 over (model_id, canonical messages, tools_schema, sampling_params, key, seq).

    Scoped to the activation (key, seq): only a retry of the same activation hits.
    """
    return cache_key_of(request_scope(request, entity_key=entity_key, seq=seq))


def request_scope(request: LlmRequest, *, entity_key: bytes, seq: int) -> bytes:
    """What ``cache_key`` digests: the request's canonical JSON and the activation (key, seq).
    Taken when the call is made, since an agent may change a request's messages after it."""
    return request.canonical() + b"\x00" + entity_key + b"\x00" + str(seq).encode()


def cache_key_of(scope: bytes) -> str:
    """The cache key of a ``request_scope``: its sha256, in hex."""
    return sha256(scope).hexdigest()
