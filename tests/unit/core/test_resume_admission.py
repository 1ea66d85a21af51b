"""Resume admission: which tool results and approvals may resume a suspended key.

Every ``orphaned_result`` detail is produced here by constructing it; each orphan is
checked to change nothing and to be labelled as an orphan, not as an agent error.
"""

from __future__ import annotations

from keylane.authoring.api import AgentConfig, Complete, Suspend
from keylane.authoring.context import ActivationContext
from keylane.catalog import ERRORS
from keylane.core.activation import Decision
from keylane.records import Emit
from keylane.testing import AgentHarness, ManualClock
from keylane.wire import Approval, ErrorRecord, ToolResult, decode

KEY = b"order-7"


class Recorder:
    """An agent that suspends on one refund intent and records what each resume saw."""

    def __init__(self, *, suspend_timeout_ms: int | None = None, ttl_ms: int | None = None) -> None:
        self.suspend_timeout_ms = suspend_timeout_ms
        self.ttl_ms = ttl_ms
        self.resumes: list[tuple[str, str]] = []

    async def __call__(self, ctx: ActivationContext) -> Complete | Suspend:
        if ctx.resume_result is not None:
            self.resumes.append((ctx.resume_result.intent_id, ctx.resume_result.status))
            return Complete(b"resumed:" + ctx.resume_result.status.encode())
        ctx.act("refund", '{"amount": 5}', ttl_ms=self.ttl_ms)
        return Suspend(snapshot=b"s", timeout_ms=self.suspend_timeout_ms)


def the_orphan(decision: Decision) -> tuple[Emit, ErrorRecord]:
    [emit] = decision.emits
    assert emit.topic == ERRORS
    return emit, decode(emit.value, ErrorRecord)


def assert_orphan(decision: Decision, detail: str, intent_id: str) -> None:
    emit, error = the_orphan(decision)
    assert decision.new_state is None
    assert emit.error_reason is None  # an orphan is not an agent error ...
    assert emit.orphan_detail == detail.split(":", 1)[0]  # ... it is counted by its detail
    assert error.reason == "orphaned_result"
    assert error.detail == detail
    assert error.intent_id == intent_id
    assert error.entity_key == KEY.decode()


def result(intent_id: str, status: str = "OK") -> ToolResult:
    return ToolResult(intent_id=intent_id, entity_key=KEY.decode(), status=status, result_json="null")  # type: ignore[arg-type]


async def suspended_harness(agent: Recorder, clock: ManualClock) -> AgentHarness:
    harness = AgentHarness(agent, AgentConfig(), clock=clock)
    await harness.send_event(KEY, "refund please")
    assert harness.state(KEY).continuation is not None
    return harness


async def test_a_result_for_a_key_that_never_suspended_is_orphaned_no_continuation() -> None:
    agent = Recorder()
    harness = AgentHarness(agent, AgentConfig(), clock=ManualClock())

    decision = await harness.send_result(result("intent-from-nowhere"))

    assert_orphan(decision, "no_continuation", "intent-from-nowhere")
    assert KEY not in harness.store
    assert agent.resumes == []


async def test_an_approval_for_a_key_that_already_completed_is_orphaned_no_continuation() -> None:
    async def completes(ctx: ActivationContext) -> Complete:
        return Complete(b"done")

    harness = AgentHarness(completes, AgentConfig(), clock=ManualClock())
    await harness.send_event(KEY, "hi")
    before = harness.store[KEY]

    decision = await harness.send_approval(
        Approval(intent_id="late", entity_key=KEY.decode(), approved=True, approver="ana")
    )

    assert_orphan(decision, "no_continuation", "late")
    assert harness.store[KEY] == before


async def test_a_result_for_another_intent_is_orphaned_unknown_intent_and_changes_nothing() -> None:
    agent = Recorder()
    harness = await suspended_harness(agent, ManualClock())
    before = harness.store[KEY]

    decision = await harness.send_result(result("someone-elses-intent"))

    assert_orphan(decision, "unknown_intent", "someone-elses-intent")
    assert harness.store[KEY] == before
    assert agent.resumes == []
    [intent] = harness.intents()
    await harness.send_result(harness.result_for(intent))  # the real result still resumes it
    assert agent.resumes == [(intent.intent_id, "OK")]


async def test_a_result_at_the_suspend_deadline_is_orphaned_deadline_passed() -> None:
    clock = ManualClock()
    agent = Recorder(suspend_timeout_ms=10_000)
    harness = await suspended_harness(agent, clock)
    [intent] = harness.intents()
    before = harness.store[KEY]
    assert harness.state(KEY).continuation.deadline_ms == clock.now_ms + 10_000  # type: ignore[union-attr]

    clock.advance(10_000)
    decision = await harness.send_result(harness.result_for(intent))

    assert_orphan(decision, "deadline_passed", intent.intent_id)
    assert harness.store[KEY] == before
    assert agent.resumes == []


async def test_a_result_one_millisecond_before_the_suspend_deadline_resumes() -> None:
    clock = ManualClock()
    agent = Recorder(suspend_timeout_ms=10_000)
    harness = await suspended_harness(agent, clock)
    [intent] = harness.intents()

    clock.advance(9_999)
    await harness.send_result(harness.result_for(intent))

    assert agent.resumes == [(intent.intent_id, "OK")]
    assert harness.outputs() == [(KEY, b"resumed:OK")]


class ChargeThenShip:
    """Stages a short-lived ``charge`` and a longer-lived ``ship`` intent, then suspends.

    The first suspension's deadline is capped by the charge's expiry. After the charge's
    result it suspends again staging nothing new, so the new deadline (now + timeout) no
    longer includes the ship intent's expiry: the ship result can outlive its intent while
    the suspension is still live. That is the only way to reach ``intent_expired``.
    """

    CHARGE_TTL_MS = 1_000
    SHIP_TTL_MS = 100_000
    WAIT_MS = 1_000_000

    def __init__(self) -> None:
        self.resumes: list[tuple[bytes, str]] = []

    async def __call__(self, ctx: ActivationContext) -> Complete | Suspend:
        if not ctx.is_resume:
            ctx.act("charge", "{}", ttl_ms=self.CHARGE_TTL_MS)
            ctx.act("ship", "{}", ttl_ms=self.SHIP_TTL_MS)
            return Suspend(snapshot=b"waiting for both", timeout_ms=self.WAIT_MS)
        assert ctx.resume_result is not None
        self.resumes.append((ctx.snapshot, ctx.resume_result.status))
        if ctx.snapshot == b"waiting for both":
            return Suspend(snapshot=b"waiting for ship", timeout_ms=self.WAIT_MS)
        return Complete(b"ship:" + ctx.resume_result.status.encode())


async def charged_and_waiting_for_ship(clock: ManualClock) -> tuple[AgentHarness, ChargeThenShip, str]:
    agent = ChargeThenShip()
    harness = AgentHarness(agent, AgentConfig(), clock=clock)
    start = clock.now_ms
    await harness.send_event(KEY, "order")
    charge, ship = harness.intents()
    assert harness.state(KEY).continuation.deadline_ms == start + agent.CHARGE_TTL_MS  # type: ignore[union-attr]

    clock.advance(500)
    await harness.send_result(harness.result_for(charge))
    waiting = harness.state(KEY)
    assert waiting.continuation is not None
    assert waiting.continuation.pending_intent_ids == [ship.intent_id]
    assert waiting.continuation.deadline_ms == start + 500 + agent.WAIT_MS
    assert waiting.pending[ship.intent_id].expires_at_ms == start + agent.SHIP_TTL_MS

    clock.advance(agent.SHIP_TTL_MS - 500)  # exactly at the ship intent's expiry
    return harness, agent, ship.intent_id


async def test_a_result_after_its_intent_expired_is_orphaned_intent_expired_while_the_key_waits() -> None:
    harness, agent, ship_id = await charged_and_waiting_for_ship(ManualClock())
    before = harness.store[KEY]

    decision = await harness.send_result(result(ship_id, "OK"))

    assert_orphan(decision, f"intent_expired:{ship_id}", ship_id)
    assert harness.store[KEY] == before
    assert agent.resumes == [(b"waiting for both", "OK")]


async def test_an_expired_tool_result_reaching_a_live_suspension_resumes_the_agent() -> None:
    harness, agent, ship_id = await charged_and_waiting_for_ship(ManualClock())

    decision = await harness.send_result(result(ship_id, "EXPIRED"))

    assert decision.new_state is not None
    assert agent.resumes == [(b"waiting for both", "OK"), (b"waiting for ship", "EXPIRED")]
    assert harness.outputs() == [(KEY, b"ship:EXPIRED")]
    assert harness.state(KEY).continuation is None
    assert harness.errors() == []


async def test_the_effectors_expired_answer_after_the_deadline_still_reaches_the_live_suspension() -> None:
    # The deadline is capped by the intent's expiry, and the effector says EXPIRED only once
    # that expiry has passed: the EXPIRED result always arrives at or after the deadline.
    clock = ManualClock()
    agent = Recorder(suspend_timeout_ms=60_000, ttl_ms=1_000)
    harness = await suspended_harness(agent, clock)
    [intent] = harness.intents()
    assert harness.state(KEY).continuation.deadline_ms == intent.expires_at_ms  # type: ignore[union-attr]

    clock.advance(1_000)
    late_ok = await harness.send_result(harness.result_for(intent))
    expired = await harness.send_result(harness.result_for(intent, status="EXPIRED", result_json=None))

    assert_orphan(late_ok, "deadline_passed", intent.intent_id)
    assert expired.new_state is not None
    assert agent.resumes == [(intent.intent_id, "EXPIRED")]


async def test_an_expired_tool_result_before_the_deadline_resumes_with_status_expired() -> None:
    clock = ManualClock()
    agent = Recorder(suspend_timeout_ms=60_000, ttl_ms=120_000)
    harness = await suspended_harness(agent, clock)
    [intent] = harness.intents()

    clock.advance(30_000)
    await harness.send_result(harness.result_for(intent, status="EXPIRED", result_json=None))

    assert agent.resumes == [(intent.intent_id, "EXPIRED")]
    assert harness.outputs() == [(KEY, b"resumed:EXPIRED")]


async def test_an_approval_for_the_pending_request_resumes_with_the_decision() -> None:
    decisions: list[tuple[bool, str]] = []

    async def asks_a_human(ctx: ActivationContext) -> Complete | Suspend:
        if ctx.resume_approval is not None:
            decisions.append((ctx.resume_approval.approved, ctx.resume_approval.approver))
            return Complete(b"approved" if ctx.resume_approval.approved else b"denied")
        ctx.request_approval('{"refund": 500}')
        return Suspend()

    harness = AgentHarness(asks_a_human, AgentConfig(), clock=ManualClock())
    await harness.send_event(KEY, "big refund")
    [pending] = harness.state(KEY).pending.values()
    assert pending.kind == "approval"

    stranger = await harness.send_approval(
        Approval(intent_id="not-asked", entity_key=KEY.decode(), approved=True, approver="eve")
    )
    await harness.send_approval(
        Approval(intent_id=pending.intent_id, entity_key=KEY.decode(), approved=False, approver="ana")
    )

    assert_orphan(stranger, "unknown_intent", "not-asked")
    assert decisions == [(False, "ana")]
    assert harness.outputs() == [(KEY, b"denied")]


async def test_an_expired_tool_result_after_the_suspensions_own_timeout_is_left_to_the_timer() -> None:
    # The suspension's own timeout (1 s) passed long before its intent's expiry (120 s): the
    # deadline belongs to the HITL policy, and an EXPIRED answer must not pre-empt it.
    clock = ManualClock()
    agent = Recorder(suspend_timeout_ms=1_000, ttl_ms=120_000)
    harness = await suspended_harness(agent, clock)
    [intent] = harness.intents()
    before = harness.store[KEY]

    clock.advance(1_000)
    decision = await harness.send_result(harness.result_for(intent, status="EXPIRED", result_json=None))

    assert_orphan(decision, "deadline_passed", intent.intent_id)
    assert harness.store[KEY] == before
    assert agent.resumes == []


async def test_a_result_whose_run_ended_before_the_intents_expiry_is_honoured_after_it() -> None:
    # The effector ran ship in time (completed_at_ms before its expiry); the result reached
    # the worker once the expiry had passed, while the key still waits.
    harness, agent, ship_id = await charged_and_waiting_for_ship(ManualClock())
    expires_at = harness.state(KEY).pending[ship_id].expires_at_ms
    ran_in_time = ToolResult(
        intent_id=ship_id,
        entity_key=KEY.decode(),
        status="OK",
        result_json="null",
        completed_at_ms=expires_at - 1,
    )

    decision = await harness.send_result(ran_in_time)

    assert decision.new_state is not None
    assert agent.resumes == [(b"waiting for both", "OK"), (b"waiting for ship", "OK")]
