"""The HITL timeout policy, broker-free: a suspension's deadline, and what Deny, Drop, Escalate
or a policy function do once it passes (tests/unit/hitl_support.py has the shared agent)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from keylane import ids
from keylane.authoring.api import AgentConfig, Complete, Suspend
from keylane.authoring.context import ActivationContext
from keylane.authoring.hitl import Deny, Drop, Escalate, FallbackContext, HitlPolicy, TimeoutDecision
from keylane.catalog import TIMERS
from keylane.core.timers import HITL, TTL
from keylane.testing import AgentHarness, ManualClock
from tests.unit.hitl_support import (
    ARGS,
    HOUR,
    KEY,
    TIMEOUT_OUTPUT,
    TTL_MS,
    WAIT_MS,
    AsksForApproval,
    approval,
    asked,
    deadline_of,
    harness_of,
    the_error,
)

# 1. The deadline of a suspension --------------------------------------------------------------


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


# 2. Deny, the default -------------------------------------------------------------------------


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


# 3. Drop --------------------------------------------------------------------------------------


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


# 4. Escalate ----------------------------------------------------------------------------------

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


# 5. A policy function -------------------------------------------------------------------------


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


# 6. Events queued behind a suspension run once the timeout ends it ----------------------------


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


# 7. Validation --------------------------------------------------------------------------------


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


@pytest.mark.parametrize("timeout_ms", [0, -1, True, 1.5])
def test_suspend_refuses_a_timeout_that_is_not_a_positive_whole_number(timeout_ms: object) -> None:
    with pytest.raises(ValueError, match=r"Suspend\.timeout_ms"):
        Suspend(timeout_ms=timeout_ms)  # type: ignore[arg-type]
