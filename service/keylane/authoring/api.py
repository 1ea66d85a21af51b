"""The authoring API's values: what an agent returns, and how it is configured.

An agent is ``async def agent(ctx: ActivationContext) -> Complete | Suspend``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import msgspec

from keylane.authoring.hitl import HitlPolicy
from keylane.authoring.ratelimit import RateLimit
from keylane.authoring.tools import ToolRegistry, default_registry
from keylane.keys import Assignment
from keylane.llm.types import Provider

if TYPE_CHECKING:
    from keylane.authoring.context import ActivationContext

HOUR_MS = 60 * 60 * 1000
MIN_STATE_BYTES = 4096
"""The smallest ``max_state_bytes`` accepted: below it a key's bookkeeping alone may not fit."""


# Complete, Suspend and LlmResponse are msgspec Structs, not frozen dataclasses: every
# activation builds one (and every model call an LlmResponse) after its model answered, and a
# frozen dataclass sets each field through object.__setattr__ (0.33-0.44 µs here, where a
# Struct takes about 0.1). All three are immutable, compare by value and take the same
# arguments.
class Complete(msgspec.Struct, frozen=True):
    """The activation is done; ``output`` goes to agent.output under the physical key."""

    output: bytes = b""


class Suspend(msgspec.Struct, frozen=True):
    """Persist a continuation and release the key until a result or approval resumes it.

    ``snapshot`` is handed back as ``ctx.snapshot`` on resume. ``timeout_ms`` bounds the wait
    (default: the HITL policy's ``timeout_ms``); the deadline is also capped by the earliest
    expiry of the intents staged in this activation.
    """

    snapshot: bytes = b""
    timeout_ms: int | None = None

    def __post_init__(self) -> None:
        if self.timeout_ms is not None and (
            not isinstance(self.timeout_ms, int) or isinstance(self.timeout_ms, bool) or self.timeout_ms <= 0
        ):
            raise ValueError(
                f"Suspend.timeout_ms must be None or a positive number of ms, got {self.timeout_ms!r}"
            )


AgentFn = Callable[["ActivationContext"], Awaitable[Complete | Suspend]]
ProviderFactory = Callable[[], Provider]
EventsWhileSuspended = Literal["queue"]
BufferFullPolicy = Literal["dead_letter"]
LaneMode = Literal["partition", "key"]


@dataclass(frozen=True, kw_only=True)
class AgentConfig:
    """Runtime options of one agent.

    * ``provider_factory``: builds the model provider once per worker (None: the agent
      must not call models);
    * ``hitl_policy``: suspension and intent lifetimes, and the fail-closed timeout policy;
    * ``ttl_ms``: a key idle this long has its state garbage-collected (re-armed by every
      input; a suspended key's TTL counts from its deadline);
    * ``activation_timeout_s``: an activation running longer is cancelled and changes
      nothing (activation_timeout on agent.errors);
    * ``shards``: fan each logical key out over N physical keys through ShardKeys (only
      for memory-free agents: see docs/sharding.md); ``shard_assignment``: "hash" (default,
      deterministic) or "round_robin" (forfeits retry determinism);
    * ``events_while_suspended``: "queue" — events for a suspended key wait, in order, and
      run after the suspension ends;
    * ``max_buffered_events`` / ``max_buffered_bytes``: how many events, and how many bytes
      of their record values, one key may hold queued behind its suspension;
      ``on_buffer_full``: what happens to an event that would go past either cap, or past
      the key's state limit: "dead_letter" (the only policy) sends it to agent.errors as
      ``buffer_full`` (raw bytes, origin) and leaves the key's state as it was; the events
      already queued keep their place and run in order (see docs/runtime.md);
    * ``max_state_bytes``: a cap on a key's whole encoded state (memory, replay cache,
      outbox, queued events, continuation and bookkeeping), below what one changelog record
      can carry (the worker's limit, which always applies); an activation whose next state
      would not fit, even after the replay cache is emptied, fails as ``state_too_large``
      and changes nothing (None: the changelog's limit only);
    * ``tools``: the registry ``ctx.run_tool`` and ``ctx.act`` consult;
    * ``rate_limit``: provider calls per physical key and per worker (None: unlimited);
    * ``lanes``: "key" (default) runs different keys of a partition concurrently, each key
      still serially in offset order; "partition" makes the whole partition one serial lane
      (see docs/lanes.md); ``max_in_flight`` bounds concurrent records per partition (and the
      unacked window that pauses fetching), ``worker_max_in_flight`` per worker;
    * ``rebalance_grace_s``: when the worker loses its partitions, activations still running
      get this long to finish; then they are cancelled and, with the records not started
      yet, left uncommitted for the partitions' next owner;
    * ``max_tokens_per_activation``: prompt + completion tokens one activation may spend,
      replay-cache hits included (so a replay decides exactly as the first run did);
      exceeding it fails the activation as ``budget_exceeded`` and changes nothing (None:
      no budget).
    """

    provider_factory: ProviderFactory | None = None
    hitl_policy: HitlPolicy = field(default_factory=HitlPolicy)
    ttl_ms: int = HOUR_MS
    activation_timeout_s: float = 30.0
    shards: int | None = None
    shard_assignment: Assignment = "hash"
    events_while_suspended: EventsWhileSuspended = "queue"
    tools: ToolRegistry = field(default_factory=lambda: default_registry)
    rate_limit: RateLimit | None = None
    lanes: LaneMode = "key"
    max_in_flight: int = 64
    worker_max_in_flight: int = 1024
    rebalance_grace_s: float = 10.0
    max_tokens_per_activation: int | None = None
    max_buffered_events: int = 1000
    max_buffered_bytes: int = 256 * 1024
    on_buffer_full: BufferFullPolicy = "dead_letter"
    max_state_bytes: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.hitl_policy, HitlPolicy):
            raise ValueError("AgentConfig.hitl_policy must be a HitlPolicy")
        if not isinstance(self.ttl_ms, int) or isinstance(self.ttl_ms, bool) or self.ttl_ms <= 0:
            raise ValueError(f"AgentConfig.ttl_ms must be a positive number of ms, got {self.ttl_ms!r}")
        if self.activation_timeout_s <= 0:
            raise ValueError(f"AgentConfig.activation_timeout_s must be > 0, got {self.activation_timeout_s}")
        if self.shards is not None and self.shards < 1:
            raise ValueError(f"AgentConfig.shards must be None or >= 1, got {self.shards}")
        if self.shard_assignment not in ("hash", "round_robin"):
            raise ValueError(
                f"AgentConfig.shard_assignment must be 'hash' or 'round_robin', got {self.shard_assignment!r}"
            )
        if self.lanes not in ("partition", "key"):
            raise ValueError(f"AgentConfig.lanes must be 'partition' or 'key', got {self.lanes!r}")
        if self.max_in_flight < 1 or self.worker_max_in_flight < 1:
            raise ValueError("AgentConfig.max_in_flight and worker_max_in_flight must be >= 1")
        if self.rebalance_grace_s < 0:
            raise ValueError(f"AgentConfig.rebalance_grace_s must be >= 0, got {self.rebalance_grace_s}")
        if self.max_tokens_per_activation is not None and self.max_tokens_per_activation < 1:
            budget = self.max_tokens_per_activation
            raise ValueError(f"AgentConfig.max_tokens_per_activation must be None or >= 1, got {budget}")
        if self.events_while_suspended != "queue":
            raise ValueError("AgentConfig.events_while_suspended supports only 'queue'")
        for name in ("max_buffered_events", "max_buffered_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"AgentConfig.{name} must be a whole number >= 0, got {value!r}")
        if self.on_buffer_full != "dead_letter":
            raise ValueError(
                f"AgentConfig.on_buffer_full supports only 'dead_letter', got {self.on_buffer_full!r}"
            )
        state_cap = self.max_state_bytes
        if state_cap is not None and (
            not isinstance(state_cap, int) or isinstance(state_cap, bool) or state_cap < MIN_STATE_BYTES
        ):
            raise ValueError(
                f"AgentConfig.max_state_bytes must be None or a whole number >= {MIN_STATE_BYTES}, "
                f"got {state_cap!r}"
            )
