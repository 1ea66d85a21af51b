"""What the HITL, timer and TTL tests share (tests/unit/authoring/test_hitl_policy.py,
tests/unit/core/test_timers.py, test_ttl.py, test_approvals.py): an agent that asks for
approval, a harness on a ManualClock, and helpers to fire timers and read what a key did.

A ManualClock makes hours pass at once; ``harness.fire_due_timers()`` sends a TimerFired for
every due timer through the real runtime, as the worker's scan would. Each test checks what a
user would see: the records on agent.output / agent.errors / agent.approval-requests, and the
key's committed state.
"""

from __future__ import annotations

from typing import Any

from keylane.authoring.api import AgentConfig, Complete, Suspend
from keylane.authoring.context import ActivationContext
from keylane.authoring.hitl import HitlPolicy
from keylane.catalog import TIMERS
from keylane.core.activation import Decision
from keylane.testing import AgentHarness, ManualClock
from keylane.wire import Approval, ErrorRecord, TimerFired, TimerKind, encode

KEY = b"claim-42"
MINUTE = 60 * 1000
HOUR = 60 * MINUTE
WAIT_MS = 10 * MINUTE  # the HITL policy timeout used unless a test says otherwise
TTL_MS = 30 * MINUTE
TIMEOUT_OUTPUT = b"__hitl_timeout__"
ARGS = '{"refund": 500}'


class AsksForApproval:
    """Events starting with "ask" request one approval and suspend; other events complete
    with "ran <event>"; a resume completes with the decision it saw."""

    def __init__(
        self,
        *,
        suspend_timeout_ms: int | None = None,
        channel: str | None = None,
        approval_ttl_ms: int | None = None,
    ) -> None:
        self.suspend_timeout_ms = suspend_timeout_ms
        self.channel = channel
        self.approval_ttl_ms = approval_ttl_ms
        self.events: list[bytes] = []
        self.decisions: list[Approval] = []

    async def __call__(self, ctx: ActivationContext) -> Complete | Suspend:
        if ctx.resume_approval is not None:
            self.decisions.append(ctx.resume_approval)
            verdict = b"approved" if ctx.resume_approval.approved else b"denied"
            return Complete(verdict + b" after " + ctx.snapshot)
        self.events.append(ctx.event)
        if ctx.event.startswith(b"ask"):
            ctx.request_approval(ARGS, channel=self.channel, ttl_ms=self.approval_ttl_ms)
            return Suspend(snapshot=ctx.event, timeout_ms=self.suspend_timeout_ms)
        return Complete(b"ran " + ctx.event)


def harness_of(
    agent: Any, clock: ManualClock, *, policy: HitlPolicy | None = None, ttl_ms: int = TTL_MS
) -> AgentHarness:
    config = AgentConfig(hitl_policy=policy or HitlPolicy(timeout_ms=WAIT_MS), ttl_ms=ttl_ms)
    return AgentHarness(agent, config, clock=clock)


async def asked(
    clock: ManualClock, *, policy: HitlPolicy | None = None, ttl_ms: int = TTL_MS, **agent: Any
) -> tuple[AgentHarness, AsksForApproval]:
    """A harness whose KEY is suspended on one approval request, asked at clock.now_ms."""
    approver = AsksForApproval(**agent)
    harness = harness_of(approver, clock, policy=policy, ttl_ms=ttl_ms)
    await harness.send_event(KEY, "ask")
    assert harness.state(KEY).continuation is not None
    return harness, approver


def approval(intent_id: str, *, approved: bool = True, approver: str = "ana") -> Approval:
    return Approval(intent_id=intent_id, entity_key=KEY.decode(), approved=approved, approver=approver)


async def send_fire(harness: AgentHarness, kind: TimerKind, token: str, deadline_ms: int = 0) -> Decision:
    """A TimerFired sent by hand into the key's lane, bypassing the timer index."""
    fired = TimerFired(entity_key=KEY.decode(), kind=kind, token=token, deadline_ms=deadline_ms)
    return await harness.send_raw(TIMERS, KEY, encode(fired))


def deadline_of(harness: AgentHarness) -> int:
    cont = harness.state(KEY).continuation
    assert cont is not None
    return cont.deadline_ms


def the_error(harness: AgentHarness) -> ErrorRecord:
    [error] = harness.errors()
    return error


def assert_changed_nothing(
    harness: AgentHarness, decision: Decision, store_before: bytes | None, published_before: int
) -> None:
    assert (decision.new_state, decision.emits) == (None, [])
    assert harness.store.get(KEY) == store_before
    assert len(harness.published) == published_before
