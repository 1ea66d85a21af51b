"""`keylane cancel`: an operator's command in the key's lane ends its suspension through the
HITL policy as a timeout would (told who and why), and the events queued behind it run."""

from __future__ import annotations

from keylane.authoring.hitl import Deny, Drop, Escalate, FallbackContext, HitlPolicy
from keylane.signing import Keyring
from keylane.testing import ManualClock
from keylane.wire import KeyCommand
from tests.unit.hitl_support import KEY, TIMEOUT_OUTPUT, WAIT_MS, approval, asked

CANCEL = KeyCommand(
    command_id="c-1", entity_key=KEY.decode(), action="cancel", operator="ann", reason="outage"
)


async def test_cancel_ends_the_suspension_as_a_timeout_would_and_queued_events_run() -> None:
    clock = ManualClock()
    harness, _ = await asked(clock)
    await harness.send_event(KEY, "queued-1")
    await harness.send_event(KEY, "queued-2")
    assert harness.outputs() == []

    await harness.send_command(CANCEL)

    assert harness.outputs() == [(KEY, TIMEOUT_OUTPUT), (KEY, b"ran queued-1"), (KEY, b"ran queued-2")]
    state = harness.state(KEY)
    assert state.continuation is None and state.buffered == [] and "hitl" not in state.timers
    assert clock() < harness.state(KEY).timers["ttl"].deadline_ms  # long before the deadline


async def test_the_policy_is_told_who_cancelled_and_why_and_cannot_escalate() -> None:
    seen: list[FallbackContext] = []

    def on_timeout(context: FallbackContext) -> Escalate:
        seen.append(context)
        return Escalate(tool_name="managers", args_json="{}", timeout_ms=60_000)

    policy = HitlPolicy(timeout_ms=WAIT_MS, max_escalations=3, on_timeout=on_timeout)
    harness, _ = await asked(ManualClock(), policy=policy)

    await harness.send_command(CANCEL)

    assert [c.cancelled for c in seen] == ["by ann: outage"]
    assert harness.outputs() == [(KEY, TIMEOUT_OUTPUT)], "an Escalate is taken as Deny"
    assert len(harness.approval_requests()) == 1, "no escalation request"


async def test_a_dropping_policy_dead_letters_the_cancel_with_the_operators_reason() -> None:
    harness, _ = await asked(ManualClock(), policy=HitlPolicy(timeout_ms=WAIT_MS, on_timeout=Drop()))

    await harness.send_command(CANCEL)

    (error,) = harness.errors()
    assert error.reason == "hitl_timeout" and error.detail.startswith("cancelled by ann: outage; dropped")


async def test_a_cancel_of_a_key_that_resumed_first_changes_nothing_and_is_not_applied_twice() -> None:
    clock = ManualClock()
    harness, _ = await asked(clock, policy=HitlPolicy(timeout_ms=WAIT_MS, on_timeout=Deny(b"late")))
    (request,) = harness.approval_requests()
    await harness.send_approval(approval(request.intent_id))

    decision = await harness.send_command(CANCEL)
    cancel_record = harness.records[-1]
    await harness.send_event(KEY, "ask-again")  # suspended anew
    await harness.redeliver(cancel_record)  # the cancel again, after a crash before its commit

    assert decision.emits == []
    assert harness.outputs() == [(KEY, b"approved after ask")]
    assert harness.state(KEY).continuation is not None, "the new suspension stands"


async def test_an_unsigned_cancel_is_refused_when_approvals_must_be_signed() -> None:
    harness, _ = await asked(ManualClock())
    harness.runtime.keyring = Keyring.parse("k1:secret")
    harness.runtime.approval_signatures = "require"

    await harness.send_command(CANCEL)
    assert [e.reason for e in harness.errors()] == ["unsigned_command"]
    assert harness.state(KEY).continuation is not None

    await harness.send_command(harness.runtime.keyring.sign(CANCEL))
    assert harness.outputs() == [(KEY, TIMEOUT_OUTPUT)]
