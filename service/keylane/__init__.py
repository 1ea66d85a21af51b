"""keylane: a Kafka-native runtime for keyed LLM agents.

The public API, re-exported here; tests/unit/test_public_api.py freezes this list.
"""

from keylane.authoring.api import AgentConfig, Complete, Suspend
from keylane.authoring.context import ActivationContext, BudgetExceeded
from keylane.authoring.hitl import Deny, Drop, Escalate, FallbackContext, HitlPolicy
from keylane.authoring.memory import Memory, MemoryOverflow
from keylane.authoring.ratelimit import RateLimit
from keylane.authoring.tool_loop import ToolLoop
from keylane.authoring.tools import SideEffectOutsideIntent, ToolRegistry, tool
from keylane.errors import KeylaneError
from keylane.keys import shard_key, unshard_key
from keylane.llm import (
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
from keylane.stages.shard_keys import ShardKeys
from keylane.wire import Approval, ToolIntent, ToolResult

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
