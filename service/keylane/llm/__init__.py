"""Model calls: the provider seam, the offline FakeLLM, real HTTP providers with retries and
a circuit breaker, and provider URLs. The per-key replay cache is keylane.core.replay_cache."""

from keylane.llm.anthropic import AnthropicProvider
from keylane.llm.errors import (
    CircuitOpen,
    ProviderRequestError,
    ProviderTimeout,
    ProviderUnavailable,
    RateLimitError,
    ServerError,
)
from keylane.llm.fake import (
    FakeLLM,
    fail_then_succeed,
    match_any,
    match_contains,
    match_model_id,
    raise_error,
    respond_with,
)
from keylane.llm.openai import OpenAIProvider
from keylane.llm.provider_config import ProviderConfigError, ProviderSettings, parse_provider_url
from keylane.llm.resilience import CALL_DEADLINE, CircuitBreaker, ResilientProvider, RetryPolicy
from keylane.llm.types import (
    AssistantTurn,
    LlmRequest,
    LlmResponse,
    Provider,
    ProviderError,
    ToolCall,
    encode_turn,
)

__all__ = [
    "CALL_DEADLINE",
    "AnthropicProvider",
    "AssistantTurn",
    "CircuitBreaker",
    "CircuitOpen",
    "FakeLLM",
    "LlmRequest",
    "LlmResponse",
    "OpenAIProvider",
    "Provider",
    "ProviderConfigError",
    "ProviderError",
    "ProviderRequestError",
    "ProviderSettings",
    "ProviderTimeout",
    "ProviderUnavailable",
    "RateLimitError",
    "ResilientProvider",
    "RetryPolicy",
    "ServerError",
    "ToolCall",
    "encode_turn",
    "fail_then_succeed",
    "match_any",
    "match_contains",
    "match_model_id",
    "parse_provider_url",
    "raise_error",
    "respond_with",
]
