"""Model calls: the provider seam, the offline FakeLLM, and the per-key replay cache."""

from service.llm.fake import (
    FakeLLM,
    fail_then_succeed,
    match_any,
    match_contains,
    match_model_id,
    raise_error,
    respond_with,
)
from service.llm.types import LlmRequest, LlmResponse, Provider, ProviderError

__all__ = [
    "FakeLLM",
    "LlmRequest",
    "LlmResponse",
    "Provider",
    "ProviderError",
    "fail_then_succeed",
    "match_any",
    "match_contains",
    "match_model_id",
    "raise_error",
    "respond_with",
]
