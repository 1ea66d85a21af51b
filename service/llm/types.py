"""What a model call is: LlmRequest in, LlmResponse out, through a Provider."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import msgspec

from service.errors import KeylaneError


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


@dataclass(frozen=True, kw_only=True)
class LlmResponse:
    """A model's answer. ``cached`` is True when it came from the replay cache."""

    response: bytes
    model_id: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached: bool = False
    metadata: dict[str, Any] = field(default_factory=dict)


class ProviderError(KeylaneError):
    """A model provider failed; ``retriable`` says whether trying again can help."""

    retriable = False


@runtime_checkable
class Provider(Protocol):
    """A model provider. Implementations must be safe to share between keys of one worker."""

    async def complete(self, request: LlmRequest) -> LlmResponse:
        """Answer one request, or raise (ProviderError or any exception)."""
        ...


def canonical_json(value: Any) -> bytes:
    """JSON with sorted keys and no whitespace; msgspec's ``order="sorted"`` does both."""
    return msgspec.json.encode(value, order="sorted")


def cache_key(request: LlmRequest, *, entity_key: bytes, seq: int) -> str:
    """sha256 over (model_id, canonical messages, tools_schema, sampling_params, key, seq).

    Scoped to the activation (key, seq): only a retry of the same activation hits.
    """
    digest = hashlib.sha256()
    digest.update(request.canonical())
    digest.update(b"\x00" + entity_key + b"\x00" + str(seq).encode())
    return digest.hexdigest()
