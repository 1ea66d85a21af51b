"""keylane: a Kafka-native runtime for keyed LLM agents.

The public API, re-exported here; tests/unit/test_public_api.py freezes this list.
"""

from service.errors import KeylaneError
from service.keys import shard_key, unshard_key
from service.llm import (
    AssistantTurn,
    FakeLLM,
    LlmRequest,
    LlmResponse,
    Provider,
    ProviderError,
    ToolCall,
    fail_then_succeed,
    match_any,
    match_contains,
    match_model_id,
    raise_error,
    respond_with,
)
from service.runtime.api import AgentConfig, Complete, Suspend
from service.runtime.context import ActivationContext, BudgetExceeded
from service.runtime.hitl import Deny, Drop, Escalate, FallbackContext, HitlPolicy
from service.runtime.memory import Memory, MemoryOverflow
from service.runtime.ratelimit import RateLimit
from service.runtime.tool_loop import ToolLoop
from service.shard_keys import ShardKeys
from service.tools import SideEffectOutsideIntent, ToolRegistry, tool
from service.wire import Approval, ToolIntent, ToolResult

__all__ = [
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
