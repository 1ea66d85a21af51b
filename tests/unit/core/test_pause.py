"""`keylane pause` / `keylane resume`: a paused key holds every input in its state, in order,
while other keys run; resuming runs them as they would have run on arrival; the pause and the
held inputs are in the key's state (they survive a restart) and timers wait for the resume."""

from __future__ import annotations

from keylane.authoring.api import AgentConfig
from keylane.authoring.hitl import Deny, HitlPolicy
from keylane.catalog import EVENTS
from keylane.core.state import UNPAUSED_SCHEMA_VERSION, decode_state, encode_state
from keylane.signing import Keyring
from keylane.testing import AgentHarness, ManualClock
from keylane.wire import KeyAction, KeyCommand
from tests.unit.hitl_support import HOUR, KEY, TIMEOUT_OUTPUT, WAIT_MS, AsksForApproval, approval, asked

OTHER = b"claim-7"


def command(action: KeyAction, n: int = 1, key: bytes = KEY) -> KeyCommand:
    return KeyCommand(
        command_id=f"{action}-{n}", entity_key=key.decode(), action=action, operator="ann", reason="loops"
    )


def harness(clock: ManualClock | None = None, **config: object) -> AgentHarness:
    return AgentHarness(AsksForApproval(), AgentConfig(**config), clock=clock or ManualClock())  # type: ignore[arg-type]


async def test_a_paused_key_holds_its_events_in_order_while_another_key_runs() -> None:
    h = harness()
    await h.send_command(command("pause"))
    await h.send_event(KEY, "one")
    await h.send_event(OTHER, "meanwhile")
    await h.send_event(KEY, "two")

    assert h.outputs() == [(OTHER, b"ran meanwhile")]
    state = h.state(KEY)
    assert state.paused is not None and state.paused.operator == "ann" and state.paused.reason == "loops"
    assert [e.payload for e in state.held] == [b"one", b"two"]

    await h.send_command(command("resume"))
    assert h.outputs() == [(OTHER, b"ran meanwhile"), (KEY, b"ran one"), (KEY, b"ran two")]
    resumed = h.state(KEY)
    assert (resumed.paused, resumed.held, resumed.seq) == (None, [], 2)
    assert decode_state(encode_state(resumed)).state_schema_version == UNPAUSED_SCHEMA_VERSION


async def test_results_and_approvals_are_held_too_and_resume_the_suspension_in_order() -> None:
    clock = ManualClock()
    h, _ = await asked(clock)
    (request,) = h.approval_requests()
    await h.send_command(command("pause"))
    await h.send_approval(approval(request.intent_id))
    await h.send_event(KEY, "after")
    assert h.outputs() == []

    await h.send_command(command("resume"))
    assert h.outputs() == [(KEY, b"approved after ask"), (KEY, b"ran after")]


async def test_a_redelivered_resume_publishes_the_held_inputs_records_again_and_runs_nothing_twice() -> None:
    h = harness()
    await h.send_command(command("pause"))
    await h.send_event(KEY, "one")
    await h.send_command(command("resume"))
    resume = h.records[-1]
    first = h.outputs()

    again = await h.redeliver(resume)  # a crash before the resume's offset was committed
    assert [e.value for e in again.emits] == [b"ran one"]
    assert h.state(KEY).seq == 1
    assert len({e.record_id for e in h.published}) == len(first)


async def test_pause_and_resume_that_change_nothing_are_counted_and_applied_once() -> None:
    h = harness()
    await h.send_command(command("resume"))
    await h.send_command(command("pause", 1))
    await h.send_command(command("pause", 2))
    assert h.state(KEY).paused is not None and h.state(KEY).paused.command_id == "pause-1"  # type: ignore[union-attr]
    pause_record = h.records[-2]
    await h.send_command(command("resume"))
    await h.redeliver(pause_record)  # the first pause again: a copy, not a new pause
    assert h.state(KEY).paused is None


async def test_timers_wait_for_the_resume_and_a_deadline_that_passed_fires_after_it() -> None:
    clock = ManualClock()
    h, _ = await asked(clock, policy=HitlPolicy(timeout_ms=WAIT_MS, on_timeout=Deny(TIMEOUT_OUTPUT)))
    await h.send_command(command("pause"))
    clock.advance(2 * HOUR)
    assert await h.fire_due_timers() == [], "a paused key's timers do not fire"
    assert h.outputs() == []

    await h.send_command(command("resume"))
    await h.fire_due_timers()
    assert h.outputs() == [(KEY, TIMEOUT_OUTPUT)]


async def test_a_cancel_for_a_paused_key_waits_for_the_resume() -> None:
    h, _ = await asked(ManualClock())
    await h.send_command(command("pause"))
    await h.send_command(command("cancel"))
    assert h.state(KEY).continuation is not None
    await h.send_command(command("resume"))
    assert h.state(KEY).continuation is None
    assert h.outputs() == [(KEY, TIMEOUT_OUTPUT)]


async def test_the_hold_is_bounded_and_a_full_hold_dead_letters_with_the_reason() -> None:
    h = harness(max_buffered_events=2)
    await h.send_command(command("pause"))
    for n in range(3):
        await h.send_event(KEY, f"e{n}")
    (error,) = h.errors()
    assert error.reason == "buffer_full" and "paused by ann" in error.detail
    assert error.origin is not None and error.origin.topic == EVENTS and error.origin.offset == 2
    await h.send_command(command("resume"))
    assert h.outputs() == [(KEY, b"ran e0"), (KEY, b"ran e1")]


async def test_an_unsigned_pause_is_refused_when_approvals_must_be_signed() -> None:
    h = harness()
    h.runtime.keyring = Keyring.parse("k1:secret")
    h.runtime.approval_signatures = "require"
    await h.send_command(command("pause"))
    assert [e.reason for e in h.errors()] == ["unsigned_command"]
    assert h.state(KEY).paused is None
