"""Human-in-the-loop timeouts and durable per-key timers, broker-free.

A ManualClock makes hours pass at once; ``harness.fire_due_timers()`` sends a TimerFired for
every due timer through the real runtime, as the worker's scan would. Each test checks what a
user would see: the records on agent.output / agent.errors / agent.approval-requests, and the
key's committed state.
"""

from __future__ import annotations

import base64
import json
import re
from typing import Any

import pytest

from keylane import ids
from keylane.authoring.api import AgentConfig, Complete, Suspend
from keylane.authoring.context import ActivationContext
from keylane.authoring.hitl import Deny, Drop, Escalate, FallbackContext, HitlPolicy, TimeoutDecision
from keylane.catalog import TIMERS
from keylane.core.activation import Decision
from keylane.core.state import ArmedTimer, Continuation, KeyState
from keylane.core.timers import HITL, RESEND_AFTER_MS, TTL, TimerIndex, arm, timer_token
from keylane.testing import AgentHarness, ManualClock
from keylane.wire import Approval, ErrorRecord, TimerFired, TimerKind, decode, encode

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


# 1. Which timers a committed state arms ----------------------------------------------------


async def test_a_suspension_arms_hitl_at_its_deadline_and_ttl_counted_from_the_deadline() -> None:
    clock = ManualClock()
    asked_at = clock.now_ms
    harness, _ = await asked(clock)

    state = harness.state(KEY)
    assert state.continuation is not None
    deadline = asked_at + WAIT_MS
    assert state.continuation.deadline_ms == deadline
    assert state.timers == {
        HITL: ArmedTimer(deadline_ms=deadline, token=timer_token(HITL, 1, deadline)),
        TTL: ArmedTimer(deadline_ms=deadline + TTL_MS, token=timer_token(TTL, 1, deadline + TTL_MS)),
    }


async def test_a_completed_activation_leaves_only_a_ttl_timer_at_now_plus_ttl() -> None:
    clock = ManualClock()
    harness = harness_of(AsksForApproval(), clock)

    await harness.send_event(KEY, "hello")

    assert harness.outputs() == [(KEY, b"ran hello")]
    expected = clock.now_ms + TTL_MS
    assert harness.state(KEY).timers == {
        TTL: ArmedTimer(deadline_ms=expected, token=timer_token(TTL, 1, expected))
    }


async def test_a_resume_that_completes_disarms_hitl_and_counts_ttl_from_the_resume() -> None:
    clock = ManualClock()
    harness, _ = await asked(clock)
    [request] = harness.approval_requests()

    clock.advance(3 * MINUTE)
    await harness.send_approval(approval(request.intent_id))

    assert harness.outputs() == [(KEY, b"approved after ask")]
    assert set(harness.state(KEY).timers) == {TTL}
    assert harness.state(KEY).timers[TTL].deadline_ms == clock.now_ms + TTL_MS


async def test_every_committed_input_rearms_ttl_with_a_new_token() -> None:
    clock = ManualClock()
    harness = harness_of(AsksForApproval(), clock)
    armed: list[ArmedTimer] = []

    for _ in range(3):
        await harness.send_event(KEY, "hello")
        armed.append(harness.state(KEY).timers[TTL])
        clock.advance(5 * MINUTE)

    assert [t.deadline_ms for t in armed] == [
        armed[0].deadline_ms,
        armed[0].deadline_ms + 5 * MINUTE,
        armed[0].deadline_ms + 10 * MINUTE,
    ]
    assert len({t.token for t in armed}) == 3


async def test_an_orphaned_input_commits_nothing_and_does_not_rearm_ttl() -> None:
    clock = ManualClock()
    harness = harness_of(AsksForApproval(), clock)
    await harness.send_event(KEY, "hello")
    before = harness.store[KEY]

    clock.advance(5 * MINUTE)
    await harness.send_approval(approval("nobody-asked"))

    assert harness.store[KEY] == before
    assert [e.reason for e in harness.errors()] == ["orphaned_result"]


async def test_an_event_queued_while_suspended_keeps_ttl_at_deadline_plus_ttl() -> None:
    clock = ManualClock()
    harness, _ = await asked(clock)
    deadline = deadline_of(harness)
    timers_before = harness.state(KEY).timers

    clock.advance(WAIT_MS // 2)
    await harness.send_event(KEY, "meanwhile")

    assert harness.state(KEY).timers == timers_before
    assert harness.state(KEY).timers[TTL].deadline_ms == deadline + TTL_MS


async def test_an_event_queued_after_the_deadline_counts_ttl_from_now_and_keeps_the_hitl_timer() -> None:
    clock = ManualClock()
    harness, _ = await asked(clock)
    hitl_before = harness.state(KEY).timers[HITL]

    clock.advance(WAIT_MS + 7 * MINUTE)  # past the deadline; the HITL fire has not arrived yet
    await harness.send_event(KEY, "late")

    timers = harness.state(KEY).timers
    assert timers[HITL] == hitl_before
    assert timers[TTL].deadline_ms == clock.now_ms + TTL_MS


def test_arm_counts_ttl_from_the_later_of_now_and_the_deadline() -> None:
    idle = KeyState(seq=4)
    state = KeyState(
        seq=4, continuation=Continuation(seq=3, step_index=1, pending_intent_ids=["i"], deadline_ms=500)
    )
    assert arm(idle, ttl_ms=100, now_ms=1_000).timers == {
        TTL: ArmedTimer(deadline_ms=1_100, token="ttl:4:1100")
    }
    assert arm(state, ttl_ms=100, now_ms=1_000).timers == {
        HITL: ArmedTimer(deadline_ms=500, token="hitl:4:500"),
        TTL: ArmedTimer(deadline_ms=1_100, token="ttl:4:1100"),
    }
    assert arm(state, ttl_ms=100, now_ms=200).timers[TTL].deadline_ms == 600


# 2. The deadline of a suspension -------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "agent", "expected_wait_ms"),
    [
        pytest.param(HitlPolicy(timeout_ms=7_000), {}, 7_000, id="policy-timeout"),
        pytest.param(
            HitlPolicy(timeout_ms=7_000), {"suspend_timeout_ms": 5_000}, 5_000, id="suspend-timeout"
        ),
        pytest.param(
            HitlPolicy(timeout_ms=7_000),
            {"suspend_timeout_ms": 9_000, "approval_ttl_ms": 3_000},
            3_000,
            id="capped-by-the-approval-expiry",
        ),
        pytest.param(HitlPolicy(), {}, HOUR, id="default-24h-capped-by-default-1h-intent-ttl"),
        pytest.param(
            HitlPolicy(timeout_ms=7_000, intent_ttl_ms=2_000), {}, 2_000, id="capped-by-policy-intent-ttl"
        ),
    ],
)
async def test_the_deadline_is_the_wait_capped_by_the_earliest_staged_expiry(
    policy: HitlPolicy, agent: dict[str, Any], expected_wait_ms: int
) -> None:
    clock = ManualClock()
    asked_at = clock.now_ms

    harness, _ = await asked(clock, policy=policy, **agent)

    assert deadline_of(harness) == asked_at + expected_wait_ms
    [request] = harness.approval_requests()
    assert request.deadline_ms == asked_at + expected_wait_ms
    assert harness.state(KEY).timers[HITL].deadline_ms == asked_at + expected_wait_ms


async def test_the_earliest_of_several_staged_intents_caps_the_deadline() -> None:
    async def acts_and_asks(ctx: ActivationContext) -> Suspend:
        ctx.act("ship", "{}", ttl_ms=50_000)
        ctx.act("charge", "{}", ttl_ms=4_000)
        ctx.request_approval(ARGS, ttl_ms=6_000)
        return Suspend(timeout_ms=20_000)

    clock = ManualClock()
    harness = harness_of(acts_and_asks, clock)
    await harness.send_event(KEY, "go")

    assert deadline_of(harness) == clock.now_ms + 4_000


async def test_a_resuspension_is_not_capped_by_intents_staged_earlier() -> None:
    async def asks_twice(ctx: ActivationContext) -> Complete | Suspend:
        if ctx.resume_approval is None:
            ctx.request_approval(ARGS, ttl_ms=2_000)  # short-lived
            return Suspend(snapshot=b"first")
        if ctx.snapshot == b"first":
            return Suspend(snapshot=b"second", timeout_ms=60_000)  # stages nothing
        return Complete(b"done")

    clock = ManualClock()
    harness = harness_of(asks_twice, clock)
    await harness.send_event(KEY, "go")
    [request] = harness.approval_requests()
    clock.advance(1_000)

    await harness.send_approval(approval(request.intent_id))

    assert deadline_of(harness) == clock.now_ms + 60_000


# 3. Deny, the default ------------------------------------------------------------------------


async def test_the_default_policy_denies_after_the_deadline_with_the_timeout_output() -> None:
    clock = ManualClock()
    harness, approver = await asked(clock, policy=HitlPolicy(timeout_ms=WAIT_MS))
    published_before = len(harness.published)

    clock.advance(WAIT_MS - 1)
    assert await harness.fire_due_timers() == []
    assert len(harness.published) == published_before

    clock.advance(1)
    [decision] = await harness.fire_due_timers()

    assert decision.new_state is not None
    assert harness.outputs() == [(KEY, TIMEOUT_OUTPUT)]
    assert [e.record_id for e in decision.emits] == [ids.output_id(KEY, 0)]
    state = harness.state(KEY)
    assert state.continuation is None
    assert state.pending == {}
    assert harness.errors() == []
    assert approver.decisions == []
    assert set(state.timers) == {TTL}
    assert state.timers[TTL].deadline_ms == clock.now_ms + TTL_MS


async def test_deny_with_a_custom_output_emits_that_output() -> None:
    clock = ManualClock()
    policy = HitlPolicy(timeout_ms=WAIT_MS, on_timeout=Deny(output=b"custom"))
    harness, _ = await asked(clock, policy=policy)

    clock.advance(WAIT_MS)
    await harness.fire_due_timers()

    assert harness.outputs() == [(KEY, b"custom")]
    assert harness.state(KEY).continuation is None
    assert harness.errors() == []


async def test_an_approval_after_the_deny_is_orphaned_and_does_not_reach_the_agent() -> None:
    clock = ManualClock()
    harness, approver = await asked(clock)
    [request] = harness.approval_requests()
    clock.advance(WAIT_MS)
    await harness.fire_due_timers()
    before = harness.store[KEY]

    decision = await harness.send_approval(approval(request.intent_id))

    assert decision.new_state is None
    assert harness.store[KEY] == before
    error = the_error(harness)
    assert (error.reason, error.detail, error.intent_id) == (
        "orphaned_result",
        "no_continuation",
        request.intent_id,
    )
    assert approver.decisions == []
    assert harness.outputs() == [(KEY, TIMEOUT_OUTPUT)]


async def test_an_approval_between_the_deadline_and_the_fire_is_orphaned_then_the_fire_denies() -> None:
    clock = ManualClock()
    harness, approver = await asked(clock)
    [request] = harness.approval_requests()
    clock.advance(WAIT_MS)

    await harness.send_approval(approval(request.intent_id))
    await harness.fire_due_timers()

    assert [(e.reason, e.detail) for e in harness.errors()] == [("orphaned_result", "deadline_passed")]
    assert approver.decisions == []
    assert harness.outputs() == [(KEY, TIMEOUT_OUTPUT)]


# 4. Drop -----------------------------------------------------------------------------------


async def test_drop_dead_letters_a_hitl_timeout_and_publishes_no_output() -> None:
    clock = ManualClock()
    harness, _ = await asked(clock, policy=HitlPolicy(timeout_ms=WAIT_MS, on_timeout=Drop()))
    [request] = harness.approval_requests()
    deadline = deadline_of(harness)

    clock.advance(WAIT_MS)
    [decision] = await harness.fire_due_timers()

    assert decision.new_state is not None
    assert harness.outputs() == []
    error = the_error(harness)
    assert error.reason == "hitl_timeout"
    assert error.entity_key == KEY.decode()
    assert "dropped by policy" in error.detail
    assert str(deadline) in error.detail
    assert request.intent_id in error.detail
    assert error.origin is not None and error.origin.topic == TIMERS
    state = harness.state(KEY)
    assert state.continuation is None
    assert state.pending == {}


# 5. Escalate ---------------------------------------------------------------------------------

ESCALATE = Escalate(tool_name="managers", args_json='{"escalated": true}', timeout_ms=2 * HOUR)


async def escalated_once(clock: ManualClock) -> tuple[AgentHarness, AsksForApproval]:
    policy = HitlPolicy(timeout_ms=WAIT_MS, max_escalations=1, on_timeout=ESCALATE)
    harness, approver = await asked(clock, policy=policy)
    clock.advance(WAIT_MS)
    [decision] = await harness.fire_due_timers()
    assert decision.new_state is not None
    return harness, approver


async def test_the_first_timeout_escalates_with_a_new_request_on_the_escalation_channel() -> None:
    clock = ManualClock()
    harness, _ = await escalated_once(clock)

    original, escalation = harness.approval_requests()
    assert escalation.intent_id != original.intent_id
    assert escalation.intent_id == ids.intent_id(KEY, 0, 1)
    assert escalation.channel == "managers"
    assert escalation.entity_key == KEY.decode()
    assert escalation.args_json == '{"escalated": true}'
    assert escalation.created_at_ms == clock.now_ms
    assert escalation.deadline_ms == clock.now_ms + 2 * HOUR
    assert escalation.expires_at_ms == clock.now_ms + 2 * HOUR

    state = harness.state(KEY)
    assert state.continuation is not None
    assert state.continuation.escalations == 1
    assert state.continuation.snapshot == b"ask"
    assert state.continuation.deadline_ms == clock.now_ms + 2 * HOUR
    assert state.continuation.pending_intent_ids == [original.intent_id, escalation.intent_id]
    assert state.pending[escalation.intent_id].kind == "approval"
    assert state.pending[escalation.intent_id].tool == "managers"
    assert state.timers[HITL].deadline_ms == clock.now_ms + 2 * HOUR
    assert harness.outputs() == []
    assert harness.errors() == []


async def test_an_approval_for_the_escalated_request_resumes_the_agent() -> None:
    clock = ManualClock()
    harness, approver = await escalated_once(clock)
    _, escalation = harness.approval_requests()

    clock.advance(HOUR)
    await harness.send_approval(approval(escalation.intent_id, approver="manager-bo"))

    assert [(d.intent_id, d.approver) for d in approver.decisions] == [(escalation.intent_id, "manager-bo")]
    assert harness.outputs() == [(KEY, b"approved after ask")]
    assert harness.state(KEY).continuation is None
    assert set(harness.state(KEY).timers) == {TTL}


async def test_a_second_timeout_after_the_last_allowed_escalation_denies() -> None:
    clock = ManualClock()
    harness, approver = await escalated_once(clock)

    clock.advance(2 * HOUR - 1)
    assert await harness.fire_due_timers() == []
    clock.advance(1)
    await harness.fire_due_timers()

    assert harness.outputs() == [(KEY, TIMEOUT_OUTPUT)]
    assert len(harness.approval_requests()) == 2  # no third request
    assert harness.state(KEY).continuation is None
    assert harness.state(KEY).pending == {}
    assert approver.decisions == []
    assert harness.errors() == []


async def test_escalate_with_no_escalations_allowed_denies_at_once() -> None:
    clock = ManualClock()
    policy = HitlPolicy(timeout_ms=WAIT_MS, max_escalations=0, on_timeout=ESCALATE)
    harness, _ = await asked(clock, policy=policy)

    clock.advance(WAIT_MS)
    await harness.fire_due_timers()

    assert harness.outputs() == [(KEY, TIMEOUT_OUTPUT)]
    assert [r.channel for r in harness.approval_requests()] == ["approval"]
    assert harness.state(KEY).continuation is None


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"tool_name": "", "args_json": "{}", "timeout_ms": 1}, "tool_name"),
        ({"tool_name": "managers", "args_json": "{}", "timeout_ms": 0}, "timeout_ms"),
    ],
)
def test_escalate_refuses_an_empty_channel_or_a_non_positive_timeout(
    kwargs: dict[str, Any], field: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(f"Escalate.{field}")):
        Escalate(**kwargs)


# 6. A policy function ------------------------------------------------------------------------


async def test_a_policy_function_sees_the_suspension_and_its_decision_is_applied() -> None:
    seen: list[FallbackContext] = []

    def decide(context: FallbackContext) -> TimeoutDecision:
        seen.append(context)
        return Deny(output=b"decided by function")

    clock = ManualClock()
    harness = harness_of(AsksForApproval(), clock, policy=HitlPolicy(timeout_ms=WAIT_MS, on_timeout=decide))
    await harness.send_event(KEY, "hello")  # seq 0 completes: the suspension is seq 1
    await harness.send_event(KEY, "ask-1")
    [request] = harness.approval_requests()
    deadline = deadline_of(harness)

    clock.advance(WAIT_MS)
    await harness.fire_due_timers()

    assert seen == [
        FallbackContext(
            entity_key=KEY,
            seq=1,
            pending_intent_ids=(request.intent_id,),
            escalations=0,
            snapshot=b"ask-1",
            deadline_ms=deadline,
        )
    ]
    assert harness.outputs() == [(KEY, b"ran hello"), (KEY, b"decided by function")]
    assert harness.published[-1].record_id == ids.output_id(KEY, 1)
    assert harness.state(KEY).continuation is None


async def test_a_policy_function_may_escalate_twice_then_drop() -> None:
    seen: list[tuple[int, int]] = []

    def decide(context: FallbackContext) -> TimeoutDecision:
        seen.append((context.escalations, context.deadline_ms))
        if context.escalations < 2:
            return Escalate(tool_name=f"level-{context.escalations + 1}", args_json="{}", timeout_ms=HOUR)
        return Drop()

    clock = ManualClock()
    policy = HitlPolicy(timeout_ms=WAIT_MS, max_escalations=5, on_timeout=decide)
    harness, _ = await asked(clock, policy=policy)
    start = clock.now_ms

    clock.advance(WAIT_MS)
    await harness.fire_due_timers()
    clock.advance(HOUR)
    await harness.fire_due_timers()
    clock.advance(HOUR)
    await harness.fire_due_timers()

    assert seen == [(0, start + WAIT_MS), (1, start + WAIT_MS + HOUR), (2, start + WAIT_MS + 2 * HOUR)]
    assert [r.channel for r in harness.approval_requests()] == ["approval", "level-1", "level-2"]
    assert len({r.intent_id for r in harness.approval_requests()}) == 3
    assert [e.reason for e in harness.errors()] == ["hitl_timeout"]
    assert harness.outputs() == []
    assert harness.state(KEY).continuation is None


async def test_a_policy_that_raises_fails_closed_with_hitl_timeout_and_the_runtime_goes_on() -> None:
    def broken(context: FallbackContext) -> TimeoutDecision:
        raise RuntimeError("policy store unreachable")

    clock = ManualClock()
    harness, _ = await asked(clock, policy=HitlPolicy(timeout_ms=WAIT_MS, on_timeout=broken))

    clock.advance(WAIT_MS)
    [decision] = await harness.fire_due_timers()

    assert decision.new_state is not None
    error = the_error(harness)
    assert error.reason == "hitl_timeout"
    assert "policy store unreachable" in error.detail
    assert "RuntimeError" in error.detail
    assert harness.outputs() == []
    assert harness.state(KEY).continuation is None
    assert harness.state(KEY).pending == {}

    await harness.send_event(KEY, "next")
    assert harness.outputs() == [(KEY, b"ran next")]


async def test_a_policy_returning_something_else_fails_closed_with_hitl_timeout() -> None:
    clock = ManualClock()
    policy = HitlPolicy(timeout_ms=WAIT_MS, on_timeout=lambda context: "deny")  # type: ignore[arg-type, return-value]
    harness, _ = await asked(clock, policy=policy)

    clock.advance(WAIT_MS)
    await harness.fire_due_timers()

    error = the_error(harness)
    assert error.reason == "hitl_timeout"
    assert "on_timeout returned str" in error.detail
    assert harness.state(KEY).continuation is None


# 7. Stale, duplicate and early fires change nothing -----------------------------------------


def assert_changed_nothing(
    harness: AgentHarness, decision: Decision, store_before: bytes | None, published_before: int
) -> None:
    assert (decision.new_state, decision.emits) == (None, [])
    assert harness.store.get(KEY) == store_before
    assert len(harness.published) == published_before


async def test_a_fire_with_a_wrong_token_changes_nothing() -> None:
    clock = ManualClock()
    harness, approver = await asked(clock)
    deadline = deadline_of(harness)
    clock.advance(WAIT_MS)
    before, published = harness.store[KEY], len(harness.published)

    decision = await send_fire(harness, HITL, timer_token(HITL, 0, deadline), deadline)

    assert_changed_nothing(harness, decision, before, published)
    assert approver.decisions == []


async def test_a_fire_of_the_right_token_under_the_other_kind_changes_nothing() -> None:
    clock = ManualClock()
    harness, _ = await asked(clock)
    hitl = harness.state(KEY).timers[HITL]
    clock.advance(WAIT_MS + TTL_MS)
    before, published = harness.store[KEY], len(harness.published)

    decision = await send_fire(harness, TTL, hitl.token, hitl.deadline_ms)

    assert_changed_nothing(harness, decision, before, published)


async def test_a_second_fire_of_an_applied_token_changes_nothing() -> None:
    clock = ManualClock()
    harness, _ = await asked(clock)
    hitl = harness.state(KEY).timers[HITL]
    clock.advance(WAIT_MS)
    await harness.fire_due_timers()
    assert harness.outputs() == [(KEY, TIMEOUT_OUTPUT)]
    before, published = harness.store[KEY], len(harness.published)

    decision = await send_fire(harness, HITL, hitl.token, hitl.deadline_ms)

    assert_changed_nothing(harness, decision, before, published)
    assert harness.outputs() == [(KEY, TIMEOUT_OUTPUT)]


async def test_a_fire_before_the_deadline_changes_nothing_and_the_timer_still_fires_when_due() -> None:
    clock = ManualClock()
    harness, _ = await asked(clock)
    hitl = harness.state(KEY).timers[HITL]
    clock.advance(WAIT_MS - 1)
    before, published = harness.store[KEY], len(harness.published)

    decision = await send_fire(harness, HITL, hitl.token, hitl.deadline_ms)

    assert_changed_nothing(harness, decision, before, published)
    clock.advance(1)
    await harness.fire_due_timers()
    assert harness.outputs() == [(KEY, TIMEOUT_OUTPUT)]


async def test_a_fire_superseded_by_a_resume_changes_nothing() -> None:
    clock = ManualClock()
    harness, _ = await asked(clock)
    hitl = harness.state(KEY).timers[HITL]
    [request] = harness.approval_requests()
    await harness.send_approval(approval(request.intent_id))
    clock.advance(WAIT_MS)
    before, published = harness.store[KEY], len(harness.published)

    decision = await send_fire(harness, HITL, hitl.token, hitl.deadline_ms)

    assert_changed_nothing(harness, decision, before, published)
    assert harness.outputs() == [(KEY, b"approved after ask")]


async def test_a_ttl_fire_for_a_key_already_collected_changes_nothing() -> None:
    clock = ManualClock()
    harness = harness_of(AsksForApproval(), clock)
    await harness.send_event(KEY, "hello")
    ttl = harness.state(KEY).timers[TTL]
    clock.advance(TTL_MS)
    await harness.fire_due_timers()
    assert_collected(harness)
    published = len(harness.published)
    before = harness.store[KEY]

    decision = await send_fire(harness, TTL, ttl.token, ttl.deadline_ms)

    assert_changed_nothing(harness, decision, before, published)


async def test_the_scan_sends_each_due_timer_once() -> None:
    clock = ManualClock()
    harness, _ = await asked(clock)
    clock.advance(WAIT_MS)

    first = await harness.fire_due_timers()
    second = await harness.fire_due_timers()

    assert len(first) == 1
    assert second == []
    assert harness.outputs() == [(KEY, TIMEOUT_OUTPUT)]


# 8. Events queued behind a suspension run once the timeout ends it ---------------------------


async def test_events_queued_while_suspended_run_in_order_after_the_timeout() -> None:
    clock = ManualClock()
    harness, approver = await asked(clock)
    await harness.send_event(KEY, "a")
    await harness.send_event(KEY, "b")
    assert harness.outputs() == []
    assert [b.payload for b in harness.state(KEY).buffered] == [b"a", b"b"]

    clock.advance(WAIT_MS)
    await harness.fire_due_timers()

    assert [v for _, v in harness.outputs()] == [TIMEOUT_OUTPUT, b"ran a", b"ran b"]
    assert approver.events == [b"ask", b"a", b"b"]
    assert harness.state(KEY).buffered == []
    assert harness.state(KEY).continuation is None


async def test_events_queued_behind_a_dropped_suspension_still_run() -> None:
    clock = ManualClock()
    harness, _ = await asked(clock, policy=HitlPolicy(timeout_ms=WAIT_MS, on_timeout=Drop()))
    await harness.send_event(KEY, "a")

    clock.advance(WAIT_MS)
    await harness.fire_due_timers()

    assert harness.outputs() == [(KEY, b"ran a")]
    assert [e.reason for e in harness.errors()] == ["hitl_timeout"]


async def test_a_queued_event_that_suspends_again_is_released_by_its_own_timeout() -> None:
    clock = ManualClock()
    harness, _ = await asked(clock)
    for event in ["a", "ask-2", "b"]:
        await harness.send_event(KEY, event)

    clock.advance(WAIT_MS)
    await harness.fire_due_timers()

    assert [v for _, v in harness.outputs()] == [TIMEOUT_OUTPUT, b"ran a"]
    state = harness.state(KEY)
    assert state.continuation is not None
    assert state.continuation.snapshot == b"ask-2"
    assert state.continuation.deadline_ms == clock.now_ms + WAIT_MS
    assert [b.payload for b in state.buffered] == [b"b"]

    clock.advance(WAIT_MS)
    await harness.fire_due_timers()

    assert [v for _, v in harness.outputs()] == [TIMEOUT_OUTPUT, b"ran a", TIMEOUT_OUTPUT, b"ran b"]
    assert harness.state(KEY).continuation is None
    assert harness.state(KEY).buffered == []
    assert harness.errors() == []


async def test_escalation_keeps_the_queued_events_waiting() -> None:
    clock = ManualClock()
    harness, _ = await escalated_once(clock)
    await harness.send_event(KEY, "a")
    _, escalation = harness.approval_requests()

    await harness.send_approval(approval(escalation.intent_id, approved=False))

    assert [v for _, v in harness.outputs()] == [b"denied after ask", b"ran a"]


# 9. TTL collection ---------------------------------------------------------------------------


async def counts(ctx: ActivationContext) -> Complete:
    n = ctx.memory.get("n", 0) + 1
    ctx.memory.set("n", n)
    return Complete(str(n).encode())


def assert_collected(harness: AgentHarness) -> None:
    """TTL collected the key: only a tombstone (seq, applied offsets) is left, with no timers."""
    state = harness.state(KEY)
    assert state.memory.entries == {} and state.continuation is None and state.pending == {}
    assert state.llm_cache == [] and state.buffered == [] and state.outbox == []
    assert state.timers == {}
    assert KEY in harness.store


async def test_an_idle_key_is_collected_after_ttl_and_starts_over() -> None:
    clock = ManualClock()
    harness = harness_of(counts, clock)
    await harness.send_event(KEY, "x")
    await harness.send_event(KEY, "x")

    clock.advance(TTL_MS - 1)
    assert await harness.fire_due_timers() == []
    assert KEY in harness.store

    clock.advance(1)
    [decision] = await harness.fire_due_timers()

    assert decision.new_state is not None
    assert_collected(harness)
    assert harness.state(KEY).seq == 2, "the tombstone keeps seq, so ids are never minted twice"
    assert harness.errors() == []
    assert len(harness.timers) == 0
    await harness.send_event(KEY, "x")
    assert [v for _, v in harness.outputs()] == [b"1", b"2", b"1"]


async def test_an_input_before_the_ttl_keeps_the_key() -> None:
    clock = ManualClock()
    harness = harness_of(counts, clock)
    await harness.send_event(KEY, "x")

    clock.advance(TTL_MS - 1)
    await harness.send_event(KEY, "x")
    clock.advance(1)
    assert await harness.fire_due_timers() == []  # the first TTL was superseded
    assert KEY in harness.store

    clock.advance(TTL_MS - 1)
    [decision] = await harness.fire_due_timers()
    assert decision.new_state is not None
    assert_collected(harness)


async def test_a_key_collected_by_ttl_does_not_reuse_the_intent_ids_of_its_previous_life() -> None:
    # The effector's claim store runs each intent id once and answers a repeated id with the
    # stored result: a new intent must never carry the id of an intent that already ran.
    async def refunds(ctx: ActivationContext) -> Complete:
        ctx.act("refund", '{"amount": ' + ctx.event.decode() + "}")
        return Complete(b"refunding")

    clock = ManualClock()
    harness = harness_of(refunds, clock)
    await harness.send_event(KEY, "5")
    clock.advance(TTL_MS)
    await harness.fire_due_timers()
    assert_collected(harness)

    await harness.send_event(KEY, "900")

    first, second = harness.intents()
    assert (first.args_json, second.args_json) == ('{"amount": 5}', '{"amount": 900}')
    assert second.intent_id != first.intent_id


async def test_a_key_collected_by_ttl_does_not_reuse_the_output_ids_of_its_previous_life() -> None:
    clock = ManualClock()
    harness = harness_of(counts, clock)
    await harness.send_event(KEY, "x")
    clock.advance(TTL_MS)
    await harness.fire_due_timers()

    await harness.send_event(KEY, "x")

    first, second = (e for e in harness.published if e.topic == "agent.output")
    assert second.record_id != first.record_id


async def test_when_both_timers_are_due_in_one_scan_the_hitl_fire_wins_and_the_key_survives() -> None:
    clock = ManualClock()
    harness, _ = await asked(clock)

    clock.advance(WAIT_MS + TTL_MS + HOUR)
    decisions = await harness.fire_due_timers()

    assert len(decisions) == 2  # HITL first, then the TTL fire it made stale
    assert decisions[1].new_state is None
    assert harness.outputs() == [(KEY, TIMEOUT_OUTPUT)]
    assert harness.errors() == []
    assert KEY in harness.store
    assert harness.state(KEY).timers == {
        TTL: ArmedTimer(deadline_ms=clock.now_ms + TTL_MS, token=timer_token(TTL, 1, clock.now_ms + TTL_MS))
    }


async def test_a_ttl_fire_reaching_a_live_suspension_wipes_it_and_says_so() -> None:
    clock = ManualClock()
    harness, approver = await asked(clock)
    [request] = harness.approval_requests()
    ttl = harness.state(KEY).timers[TTL]

    clock.advance(WAIT_MS + TTL_MS)  # the HITL fire was never delivered
    decision = await send_fire(harness, TTL, ttl.token, ttl.deadline_ms)

    assert decision.new_state is not None
    assert_collected(harness)
    error = the_error(harness)
    assert error.reason == "ttl_wiped_suspension"
    assert error.entity_key == KEY.decode()
    assert str(TTL_MS) in error.detail
    assert "seq 0" in error.detail
    assert harness.outputs() == []

    assert await harness.fire_due_timers() == []  # the undelivered HITL timer went with the state
    late = await harness.send_approval(approval(request.intent_id))
    assert late.new_state is None
    assert [(e.reason, e.detail) for e in harness.errors()][1:] == [("orphaned_result", "no_continuation")]
    assert approver.decisions == []


# 10. Validation ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"timeout_ms": 0}, "timeout_ms"),
        ({"timeout_ms": -5}, "timeout_ms"),
        ({"timeout_ms": True}, "timeout_ms"),
        ({"intent_ttl_ms": -1}, "intent_ttl_ms"),
        ({"approval_channel": ""}, "approval_channel"),
        ({"max_escalations": -1}, "max_escalations"),
        ({"on_timeout": "deny"}, "on_timeout"),
    ],
)
def test_hitl_policy_refuses_bad_values_naming_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=re.escape(f"HitlPolicy.{field}")):
        HitlPolicy(**kwargs)


@pytest.mark.parametrize("ttl_ms", [0, -1])
def test_agent_config_refuses_a_non_positive_ttl(ttl_ms: int) -> None:
    with pytest.raises(ValueError, match=re.escape("AgentConfig.ttl_ms")):
        AgentConfig(ttl_ms=ttl_ms)


def test_agent_config_refuses_a_policy_that_is_not_a_hitl_policy() -> None:
    with pytest.raises(ValueError, match=re.escape("AgentConfig.hitl_policy")):
        AgentConfig(hitl_policy=Deny())  # type: ignore[arg-type]


def test_hitl_policy_defaults() -> None:
    policy = HitlPolicy()
    assert (policy.timeout_ms, policy.intent_ttl_ms, policy.approval_channel, policy.max_escalations) == (
        24 * HOUR,
        HOUR,
        "approval",
        0,
    )
    assert policy.on_timeout == Deny(output=TIMEOUT_OUTPUT)


# 11. request_approval ------------------------------------------------------------------------


async def test_request_approval_publishes_a_request_when_the_activation_suspends() -> None:
    clock = ManualClock()
    asked_at = clock.now_ms
    harness, _ = await asked(clock, policy=HitlPolicy(timeout_ms=WAIT_MS, intent_ttl_ms=HOUR))

    [request] = harness.approval_requests()
    assert request.intent_id == ids.intent_id(KEY, 0, 0)
    assert request.entity_key == KEY.decode()
    assert request.channel == "approval"
    assert request.args_json == ARGS
    assert request.created_at_ms == asked_at
    assert request.expires_at_ms == asked_at + HOUR
    assert request.deadline_ms == asked_at + WAIT_MS
    assert harness.intents() == []  # an approval is not a tool intent
    pending = harness.state(KEY).pending[request.intent_id]
    assert (pending.kind, pending.tool) == ("approval", "approval")


async def test_request_approval_uses_the_given_channel_or_the_policys_channel() -> None:
    clock = ManualClock()
    given, _ = await asked(clock, channel="finance")
    policy_channel, _ = await asked(clock, policy=HitlPolicy(timeout_ms=WAIT_MS, approval_channel="ops"))

    assert [r.channel for r in given.approval_requests()] == ["finance"]
    assert [r.channel for r in policy_channel.approval_requests()] == ["ops"]


async def test_request_approval_returns_the_id_the_approver_answers() -> None:
    returned: list[str] = []

    async def asks(ctx: ActivationContext) -> Complete | Suspend:
        if ctx.resume_approval is not None:
            return Complete(ctx.resume_approval.intent_id.encode())
        ctx.act("lookup", "{}")
        returned.append(ctx.request_approval(ARGS))
        return Suspend()

    harness = harness_of(asks, ManualClock())
    await harness.send_event(KEY, "go")

    [request] = harness.approval_requests()
    assert returned == [request.intent_id] == [ids.intent_id(KEY, 0, 1)]
    await harness.send_approval(approval(request.intent_id))
    assert harness.outputs() == [(KEY, request.intent_id.encode())]


@pytest.mark.parametrize(
    ("approved", "output"), [(True, b"approved after ask"), (False, b"denied after ask")]
)
async def test_an_approval_resumes_the_agent_with_the_decision(approved: bool, output: bytes) -> None:
    clock = ManualClock()
    harness, approver = await asked(clock)
    [request] = harness.approval_requests()

    clock.advance(WAIT_MS - 1)
    await harness.send_approval(
        Approval(
            intent_id=request.intent_id,
            entity_key=KEY.decode(),
            approved=approved,
            approver="ana",
            reason="looks fine" if approved else "too large",
        )
    )

    [seen] = approver.decisions
    assert (seen.intent_id, seen.approved, seen.approver) == (request.intent_id, approved, "ana")
    assert seen.reason == ("looks fine" if approved else "too large")
    assert harness.outputs() == [(KEY, output)]
    assert harness.state(KEY).continuation is None
    assert harness.state(KEY).pending == {}
    assert harness.errors() == []
    clock.advance(1)
    assert await harness.fire_due_timers() == []  # the HITL timer went with the suspension


async def test_an_approval_for_a_key_with_no_continuation_is_orphaned_no_continuation() -> None:
    harness = harness_of(AsksForApproval(), ManualClock())

    decision = await harness.send_approval(approval("never-asked"))

    assert decision.new_state is None
    assert KEY not in harness.store
    [emit] = decision.emits
    error = decode(emit.value, ErrorRecord)
    assert (error.reason, error.detail, error.intent_id) == (
        "orphaned_result",
        "no_continuation",
        "never-asked",
    )
    assert emit.orphan_detail == "no_continuation"


# 12. TimerIndex -------------------------------------------------------------------------------


def timers(**deadlines: int) -> KeyState:
    """A state with the given timers armed, each token naming its kind and deadline."""
    return KeyState(
        timers={
            kind: ArmedTimer(deadline_ms=deadline, token=timer_token(kind, 1, deadline))  # type: ignore[misc]
            for kind, deadline in deadlines.items()
        }
    )


def due_of(index: TimerIndex, now_ms: int) -> list[tuple[bytes, str, int]]:
    return [(key, kind, timer.deadline_ms) for key, kind, timer in index.due(now_ms)]


def test_timer_index_returns_due_timers_in_deadline_order_once_per_token() -> None:
    index = TimerIndex()
    index.update(b"a", timers(hitl=100, ttl=300))
    index.update(b"b", timers(ttl=50))

    assert due_of(index, 99) == [(b"b", "ttl", 50)]
    assert due_of(index, 300) == [(b"a", "hitl", 100), (b"a", "ttl", 300)]
    assert due_of(index, 10_000) == []
    assert len(index) == 2


def test_timer_index_returns_a_timer_recorded_twice_with_the_same_token_once() -> None:
    index = TimerIndex()
    index.update(b"a", timers(ttl=100))
    index.update(b"a", timers(ttl=100))

    assert due_of(index, 100) == [(b"a", "ttl", 100)]
    index.update(b"a", timers(ttl=100))  # re-armed with a token already sent
    assert due_of(index, 200) == []


def test_timer_index_skips_tokens_superseded_by_an_update() -> None:
    index = TimerIndex()
    index.update(b"a", timers(hitl=100, ttl=200))
    index.update(b"a", timers(ttl=500))  # the suspension ended; TTL moved

    assert due_of(index, 499) == []
    assert due_of(index, 500) == [(b"a", "ttl", 500)]


def test_timer_index_forgets_a_deleted_key() -> None:
    index = TimerIndex()
    index.update(b"a", timers(ttl=100))
    index.update(b"a", None)

    assert len(index) == 0
    assert due_of(index, 1_000) == []


def test_timer_index_rebuild_starts_over_from_the_given_states() -> None:
    index = TimerIndex()
    index.update(b"a", timers(ttl=100))
    index.update(b"gone", timers(ttl=100))
    assert len(due_of(index, 100)) == 2

    index.rebuild([(b"a", timers(ttl=100)), (b"new", timers(hitl=150)), (b"idle", KeyState())])

    assert len(index) == 2
    assert due_of(index, 200) == [
        (b"a", "ttl", 100),
        (b"new", "hitl", 150),
    ]  # sent again: a crash may have lost it
    assert due_of(index, 200) == []


def test_timer_index_resend_makes_a_timer_due_again_unless_superseded() -> None:
    index = TimerIndex()
    index.update(b"a", timers(ttl=100))
    [(key, kind, timer)] = index.due(100)

    index.resend(key, kind, timer)
    assert due_of(index, 100) == [(b"a", "ttl", 100)]
    assert due_of(index, 100) == []

    index.resend(key, kind, timer)
    index.update(b"a", timers(ttl=900))
    assert due_of(index, 100) == []


# Fixes found by these tests ---------------------------------------------------------------


async def test_events_queued_behind_a_suspension_ttl_collected_are_each_dead_lettered_with_their_bytes() -> (
    None
):
    clock = ManualClock()
    harness, _ = await asked(clock)
    await harness.send_event(KEY, "queued-1", event_id="e-1")
    await harness.send_event(KEY, "queued-2", event_id="e-2")
    ttl = harness.state(KEY).timers[TTL]

    clock.advance(WAIT_MS + TTL_MS)
    await send_fire(harness, TTL, ttl.token, ttl.deadline_ms)

    errors = harness.errors()
    assert [e.reason for e in errors] == ["ttl_wiped_suspension"] * 3
    kept = [base64.b64decode(e.raw_value_b64 or "") for e in errors[1:]]
    assert [json.loads(k)["event_id"] for k in kept] == ["e-1", "e-2"], "nothing is lost silently"


@pytest.mark.parametrize("timeout_ms", [0, -1, True, 1.5])
def test_suspend_refuses_a_timeout_that_is_not_a_positive_whole_number(timeout_ms: object) -> None:
    with pytest.raises(ValueError, match=r"Suspend\.timeout_ms"):
        Suspend(timeout_ms=timeout_ms)  # type: ignore[arg-type]


def test_a_sent_fire_is_sent_again_while_the_state_still_holds_its_token() -> None:
    index = TimerIndex()
    state = arm(KeyState(seq=3), ttl_ms=1_000, now_ms=0)
    index.update(KEY, state)

    assert [kind for _, kind, _ in index.due(1_000)] == [TTL]
    assert index.due(1_000 + RESEND_AFTER_MS - 1) == [], "not again before the resend interval"
    assert [kind for _, kind, _ in index.due(1_000 + RESEND_AFTER_MS)] == [TTL], (
        "sent again: it was not applied"
    )
    index.update(KEY, KeyState(seq=4))
    assert index.due(1_000 + 3 * RESEND_AFTER_MS) == [], "once the state moved on, never again"


def test_the_timer_index_grows_with_keys_not_with_commits() -> None:
    """Every commit re-arms the TTL; 200 commits per key over 100 keys must not leave 20,000
    heap entries behind (it grew by one entry per commit)."""
    from keylane.core.timers import COMPACT_FACTOR, COMPACT_SLACK

    index = TimerIndex()
    for commit in range(200):
        for k in range(100):
            state = arm(KeyState(seq=commit), ttl_ms=3_600_000, now_ms=1_000 * commit)
            index.update(f"k{k}".encode(), state)
    assert len(index) == 100
    assert len(index._heap) <= COMPACT_FACTOR * 100 + COMPACT_SLACK
    due = index.due(1_000 * 199 + 3_600_000)
    assert len(due) == 100, "each key's latest TTL is still due exactly once"
