"""Approvals, broker-free: the request ``request_approval`` publishes, and how an Approval
resumes the suspended key (or is orphaned when nothing waits for it)."""

from __future__ import annotations

import pytest

from keylane import ids
from keylane.authoring.api import Complete, Suspend
from keylane.authoring.context import ActivationContext
from keylane.authoring.hitl import HitlPolicy
from keylane.testing import ManualClock
from keylane.wire import Approval, ErrorRecord, decode
from tests.unit.hitl_support import (
    ARGS,
    HOUR,
    KEY,
    WAIT_MS,
    AsksForApproval,
    approval,
    asked,
    harness_of,
)


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
