"""Model calls: the provider seam, the offline FakeLLM, real HTTP providers with retries and
a circuit breaker, provider URLs, and the per-key replay cache."""

from service.llm.anthropic import AnthropicProvider
from service.llm.errors import (
    CircuitOpen,
    ProviderRequestError,
    ProviderTimeout,
    ProviderUnavailable,
    RateLimitError,
    ServerError,
)
from service.llm.fake import (
    FakeLLM,
    fail_then_succeed,
    match_any,
    match_contains,
    match_model_id,
    raise_error,
    respond_with,
)
from service.llm.openai import OpenAIProvider
from service.llm.provider_config import ProviderConfigError, ProviderSettings, parse_provider_url
from service.llm.resilience import CALL_DEADLINE, CircuitBreaker, ResilientProvider, RetryPolicy
from service.llm.types import (
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
