"""Human-in-the-loop policy: how long a suspension may wait, and what happens when it times out.

Timeouts fail closed. When a suspension's HITL timer fires (only if the continuation still
exists and the fire is at or after its deadline), the policy's ``on_timeout`` decides — a
pure function of a FallbackContext, or one fixed decision:

* ``Deny(output=b"__hitl_timeout__")`` (default): the output goes to agent.output, the
  continuation and its pending intents are cleared;
* ``Drop()``: a ``hitl_timeout`` record goes to agent.errors, the continuation is cleared;
* ``Escalate(tool_name, args_json, timeout_ms)``: a new approval request is published on
  channel ``tool_name``, the deadline moves to now + timeout_ms; once ``max_escalations``
  escalations happened, the next timeout is a Deny.

A policy that raises is treated as Drop (``hitl_timeout`` with the error); the worker goes on.

An operator's ``keylane cancel`` ends a suspension the same way before its deadline: the
policy decides with ``FallbackContext.cancelled`` set, and an Escalate is taken as Deny (a
cancel ends the wait).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

HOUR_MS = 60 * 60 * 1000


@dataclass(frozen=True)
class Deny:
    """Fail closed with an output the downstream recognises."""

    output: bytes = b"__hitl_timeout__"

    def __post_init__(self) -> None:
        if not isinstance(self.output, bytes):
            raise ValueError(f"Deny.output must be bytes, got {type(self.output).__name__}; encode it first")


@dataclass(frozen=True)
class Drop:
    """Fail closed with a dead letter (hitl_timeout) and no output."""


@dataclass(frozen=True)
class Escalate:
    """Ask someone else: a new approval request on channel ``tool_name``, a new deadline."""

    tool_name: str
    args_json: str
    timeout_ms: int

    def __post_init__(self) -> None:
        if not isinstance(self.tool_name, str) or not self.tool_name:
            raise ValueError("Escalate.tool_name must be a non-empty channel name")
        if not isinstance(self.args_json, str):
            raise ValueError(f"Escalate.args_json must be a str, got {type(self.args_json).__name__}")
        if not isinstance(self.timeout_ms, int) or isinstance(self.timeout_ms, bool) or self.timeout_ms <= 0:
            raise ValueError(f"Escalate.timeout_ms must be a positive number of ms, got {self.timeout_ms!r}")


TimeoutDecision = Deny | Drop | Escalate


@dataclass(frozen=True, kw_only=True)
class FallbackContext:
    """What a timeout policy may look at. It gets no clock and no I/O: a pure decision."""

    entity_key: bytes
    seq: int
    pending_intent_ids: tuple[str, ...]
    escalations: int
    snapshot: bytes
    deadline_ms: int
    cancelled: str | None = None
    """Set when an operator cancelled the suspension (``keylane cancel``) instead of its
    deadline passing: who and why, e.g. ``"by ann: provider outage"``. A cancel ends the
    suspension whatever the policy decides: an Escalate is taken as Deny."""


TimeoutPolicy = TimeoutDecision | Callable[[FallbackContext], TimeoutDecision]


@dataclass(frozen=True, kw_only=True)
class HitlPolicy:
    """Limits of suspensions and intents, validated when the AgentConfig is built.

    ``timeout_ms``: default wait of a Suspend (24 h). ``intent_ttl_ms``: default lifetime of
    an intent before the effector refuses it as EXPIRED (1 h). ``approval_channel``: the
    channel of ``ctx.request_approval`` requests. ``max_escalations``: how many Escalate
    decisions are honoured before a timeout denies. ``on_timeout``: see the module docstring.
    """

    timeout_ms: int = 24 * HOUR_MS
    intent_ttl_ms: int = HOUR_MS
    approval_channel: str = "approval"
    max_escalations: int = 0
    on_timeout: TimeoutPolicy = field(default_factory=Deny)

    def __post_init__(self) -> None:
        for name in ("timeout_ms", "intent_ttl_ms"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(
                    f"HitlPolicy.{name} must be a positive number of milliseconds, got {value!r}"
                )
        if not isinstance(self.approval_channel, str) or not self.approval_channel:
            raise ValueError("HitlPolicy.approval_channel must be a non-empty string")
        if not isinstance(self.max_escalations, int) or self.max_escalations < 0:
            raise ValueError(f"HitlPolicy.max_escalations must be >= 0, got {self.max_escalations!r}")
        if not (isinstance(self.on_timeout, Deny | Drop | Escalate) or callable(self.on_timeout)):
            raise ValueError(
                "HitlPolicy.on_timeout must be Deny(), Drop(), Escalate(...) or a function of FallbackContext"
            )

    def decide(self, context: FallbackContext) -> TimeoutDecision:
        """The decision for a timed-out suspension; Deny once escalations are used up."""
        policy = self.on_timeout
        decision = policy if isinstance(policy, Deny | Drop | Escalate) else policy(context)
        if not isinstance(decision, Deny | Drop | Escalate):
            raise TypeError(f"on_timeout returned {type(decision).__name__}, expected Deny, Drop or Escalate")
        if isinstance(decision, Escalate) and (
            context.escalations >= self.max_escalations or context.cancelled is not None
        ):
            return Deny()
        return decision
