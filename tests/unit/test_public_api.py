"""The public API is exactly what service/keylane/__init__.py re-exports: adding or removing a name
is a decision, so this list changes with it."""

from __future__ import annotations

import keylane

PUBLIC = [
    "ActivationContext",
    "AgentConfig",
    "Approval",
    "AssistantTurn",
    "BudgetExceeded",
    "Complete",
    "Deny",
    "Drop",
    "Escalate",
    "FakeLLM",
    "FallbackContext",
    "HitlPolicy",
    "KeylaneError",
    "LlmRequest",
    "LlmResponse",
    "Memory",
    "MemoryOverflow",
    "Provider",
    "ProviderError",
    "RateLimit",
    "ShardKeys",
    "SideEffectOutsideIntent",
    "Suspend",
    "ToolCall",
    "ToolIntent",
    "ToolLoop",
    "ToolRegistry",
    "ToolResult",
    "fail_then_succeed",
    "match_any",
    "match_contains",
    "match_model_id",
    "raise_error",
    "respond_with",
    "shard_key",
    "tool",
    "unshard_key",
]


def test_public_names_are_frozen() -> None:
    assert sorted(keylane.__all__) == PUBLIC


def test_every_public_name_exists_and_is_documented() -> None:
    for name in keylane.__all__:
        value = getattr(keylane, name)
        assert (value.__doc__ or "").strip(), f"{name} has no docstring"
