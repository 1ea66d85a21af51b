"""KeyRuntime through AgentHarness: what one activation commits, publishes, or leaves alone."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Callable

import pytest

from keylane import ids
from keylane.authoring.api import AgentConfig, Complete, Suspend
from keylane.authoring.context import ActivationContext
from keylane.authoring.tools import SideEffectOutsideIntent, ToolRegistry, tool
from keylane.catalog import EVENTS, INTENTS, OUTPUT
from keylane.core.state import encode_state
from keylane.llm import FakeLLM, LlmRequest, LlmResponse, match_any, respond_with
from keylane.testing import AgentHarness, ManualClock

KEY = b"customer-1"
REQUEST = LlmRequest(model_id="fake-1", messages=[{"role": "user", "content": "hi"}])


def fake_llm(answer: bytes = b"model says hi") -> FakeLLM:
    return FakeLLM([(match_any(), respond_with(answer))])


async def echo(ctx: ActivationContext) -> Complete:
    return Complete(b"echo:" + ctx.event)


def harness_of(agent: Callable[[ActivationContext], object], **config: object) -> AgentHarness:
    return AgentHarness(agent, AgentConfig(**config), clock=ManualClock())  # type: ignore[arg-type]


async def test_complete_publishes_its_output_under_the_physical_key_with_a_deterministic_id() -> None:
    harness = harness_of(echo)

    decision = await harness.send_event(b"hot-entity#2", "hello")

    assert harness.outputs() == [(b"hot-entity#2", b"echo:hello")]
    [emit] = decision.emits
    assert emit.topic == OUTPUT
    assert emit.record_id == ids.output_id(b"hot-entity#2", 0)


async def test_seq_advances_by_one_per_committed_activation_and_names_each_output() -> None:
    harness = harness_of(echo)

    for n in range(3):
        await harness.send_event(KEY, f"event-{n}")
        assert harness.state(KEY).seq == n + 1

    output_ids = [e.record_id for e in harness.published if e.topic == OUTPUT]
    assert output_ids == [ids.output_id(KEY, 0), ids.output_id(KEY, 1), ids.output_id(KEY, 2)]


async def test_memory_ring_accumulates_across_activations_per_key() -> None:
    async def remember(ctx: ActivationContext) -> Complete:
        ctx.memory.append("seen", ctx.event.decode())
        return Complete(",".join(ctx.memory.ring("seen")).encode())

    harness = harness_of(remember)
    for event in ["a", "b", "c", "d"]:
        await harness.send_event(KEY, event)
    await harness.send_event(b"customer-2", "z")

    assert harness.outputs()[3] == (KEY, b"a,b,c,d")
    assert harness.state(KEY).memory.entries["seen"].value == ["a", "b", "c", "d"]
    assert harness.state(b"customer-2").memory.entries["seen"].value == ["z"]


async def fails_on_boom(ctx: ActivationContext) -> Complete:
    ctx.memory.set("last", ctx.event.decode())
    if ctx.event == b"boom":
        raise RuntimeError("the agent broke")
    return Complete(b"ok")


async def test_a_raising_agent_changes_nothing_and_publishes_activation_error_with_the_raw_record() -> None:
    harness = harness_of(fails_on_boom)
    await harness.send_event(KEY, "fine")
    before = harness.store[KEY]

    decision = await harness.send_event(KEY, "boom")

    assert decision.new_state is None
    assert harness.store[KEY] == before
    assert harness.outputs() == [(KEY, b"ok")]
    [error] = harness.errors()
    sent = harness.records[-1]
    assert error.reason == "activation_error"
    assert "RuntimeError('the agent broke')" in error.detail
    assert error.entity_key == KEY.decode()
    assert error.raw_value_b64 is not None
    assert base64.b64decode(error.raw_value_b64) == sent.value
    assert error.origin is not None
    assert (error.origin.topic, error.origin.partition, error.origin.offset) == (EVENTS, 0, sent.offset)


async def test_an_agent_over_its_activation_timeout_changes_nothing_and_publishes_activation_timeout() -> (
    None
):
    async def slow_on_request(ctx: ActivationContext) -> Complete:
        ctx.memory.set("touched", True)
        if ctx.event == b"slow":
            await asyncio.sleep(1)
        return Complete(b"ok")

    harness = harness_of(slow_on_request, activation_timeout_s=0.05)
    await harness.send_event(KEY, "fast")
    before = harness.store[KEY]

    await harness.send_event(KEY, "slow")

    assert harness.store[KEY] == before
    assert [e.reason for e in harness.errors()] == ["activation_timeout"]
    assert "exceeded 0.05s" in harness.errors()[0].detail
    assert harness.outputs() == [(KEY, b"ok")]


async def test_an_agent_returning_something_other_than_complete_or_suspend_is_an_activation_error() -> None:
    async def returns_bytes(ctx: ActivationContext) -> bytes:
        return b"not an outcome"

    harness = harness_of(returns_bytes)

    decision = await harness.send_event(KEY, "x")

    assert decision.new_state is None
    assert KEY not in harness.store
    [error] = harness.errors()
    assert error.reason == "activation_error"
    assert "agent returned bytes, expected Complete or Suspend" in error.detail


async def test_a_redelivered_event_calls_no_model_changes_nothing_and_republishes_the_same_output() -> None:
    llm = fake_llm()

    async def asks_the_model(ctx: ActivationContext) -> Complete:
        answer = await ctx.call_model(REQUEST)
        return Complete(answer.response)

    harness = AgentHarness(asks_the_model, AgentConfig(), provider=llm, clock=ManualClock())
    await harness.send_event(KEY, "hello")
    committed = harness.store[KEY]
    calls = llm.call_count

    decision = await harness.redeliver(harness.records[0])

    assert llm.call_count == calls == 1
    # The unchanged state is written again: that heals a changelog that lost its last record.
    assert decision.new_state is not None and encode_state(decision.new_state) == committed
    assert harness.store[KEY] == committed
    assert harness.state(KEY).seq == 1
    first, again = [e for e in harness.published if e.topic == OUTPUT]
    assert again.record_id == first.record_id == ids.output_id(KEY, 0)
    assert again.value == first.value == b"model says hi"


async def test_intent_ids_are_the_same_in_two_harnesses_fed_the_same_events() -> None:
    async def refunds_twice(ctx: ActivationContext) -> Complete:
        ctx.act("refund", '{"amount": 1}')
        ctx.act("refund", '{"amount": 2}')
        return Complete(b"")

    runs = []
    for _ in range(2):
        harness = harness_of(refunds_twice)
        await harness.send_event(KEY, "first")
        await harness.send_event(KEY, "second")
        runs.append([i.intent_id for i in harness.intents()])

    expected = [ids.intent_id(KEY, seq, step) for seq in (0, 1) for step in (0, 1)]
    assert runs[0] == runs[1] == expected
    assert len(set(expected)) == 4


async def test_act_on_a_read_only_tool_fails_the_activation_and_stages_no_intent() -> None:
    registry = ToolRegistry()
    registry.register("lookup_order", lambda args: {"status": "shipped"})

    async def misuses_act(ctx: ActivationContext) -> Complete:
        ctx.act("lookup_order", "{}")
        return Complete(b"")

    harness = harness_of(misuses_act, tools=registry)

    await harness.send_event(KEY, "x")

    assert harness.intents() == []
    [error] = harness.errors()
    assert error.reason == "activation_error"
    assert "ToolMisuse" in error.detail
    assert "read-only" in error.detail


async def test_a_side_effect_tool_called_directly_raises_and_fails_the_activation() -> None:
    registry = ToolRegistry()

    @tool("refund", side_effect=True, registry=registry)
    def refund(args: dict[str, int]) -> dict[str, bool]:
        return {"refunded": True}

    with pytest.raises(SideEffectOutsideIntent, match=r"ctx\.act\('refund'"):
        refund({"amount": 5})
    assert registry.get("refund").fn({"amount": 5}) == {"refunded": True}

    async def calls_it_directly(ctx: ActivationContext) -> Complete:
        refund({"amount": 5})
        return Complete(b"")

    harness = harness_of(calls_it_directly, tools=registry)
    await harness.send_event(KEY, "x")

    assert [e.reason for e in harness.errors()] == ["activation_error"]
    assert "SideEffectOutsideIntent" in harness.errors()[0].detail
    assert harness.intents() == []


async def test_a_request_changed_after_its_call_is_a_new_call_and_both_replay_on_the_resume() -> None:
    llm = FakeLLM([(match_any(), lambda request, attempt: _answer_turn(request))])
    answers: list[list[bytes | bool]] = []

    async def conversation(ctx: ActivationContext) -> Complete | Suspend:
        request = LlmRequest(model_id="m", messages=["hello"])
        first = await ctx.call_model(request)
        request.messages.append(first.response.decode())  # the same object, one turn longer
        second = await ctx.call_model(request)
        answers.append([first.response, first.cached, second.response, second.cached])
        if not ctx.is_resume:
            ctx.act("notify", "{}")
            return Suspend(snapshot=b"")
        return Complete(second.response)

    harness = AgentHarness(conversation, AgentConfig(), provider=llm, clock=ManualClock())
    await harness.send_event(KEY, "go")
    [intent] = harness.intents()
    await harness.send_result(harness.result_for(intent))

    assert answers == [[b"turn 1", False, b"turn 2", False], [b"turn 1", True, b"turn 2", True]]
    assert llm.call_count == 2


async def _answer_turn(request: LlmRequest) -> LlmResponse:
    return LlmResponse(response=b"turn %d" % len(request.messages))


async def test_a_resume_continues_the_suspended_activation_and_replays_its_model_call() -> None:
    llm = fake_llm(b"plan: refund")
    seen: dict[str, object] = {}

    async def refund_then_report(ctx: ActivationContext) -> Complete | Suspend:
        plan = await ctx.call_model(REQUEST)
        if not ctx.is_resume:
            ctx.act("refund", '{"amount": 5}')
            return Suspend(snapshot=b"waiting for refund")
        assert ctx.resume_result is not None
        seen.update(
            step=ctx.step_index,
            status=ctx.resume_result.status,
            result=ctx.resume_result.result_json,
            snapshot=ctx.snapshot,
            cached=plan.cached,
            event=ctx.event,
        )
        return Complete(plan.response + b" done")

    harness = AgentHarness(refund_then_report, AgentConfig(), provider=llm, clock=ManualClock())
    await harness.send_event(KEY, "please refund")
    [intent] = harness.intents()
    suspended = harness.state(KEY)
    assert suspended.continuation is not None
    assert suspended.continuation.step_index == 2
    assert intent.intent_id == ids.intent_id(KEY, 0, 1)
    assert harness.outputs() == []

    await harness.send_result(harness.result_for(intent, result_json='{"refunded":true}'))

    assert seen == {
        "step": 3,  # 2 where the suspension left it, +1 for the replayed model call
        "status": "OK",
        "result": '{"refunded":true}',
        "snapshot": b"waiting for refund",
        "cached": True,
        "event": b"",
    }
    assert llm.call_count == 1
    assert harness.outputs() == [(KEY, b"plan: refund done")]
    [output] = [e for e in harness.published if e.topic == OUTPUT]
    assert output.record_id == ids.output_id(KEY, 0)
    state = harness.state(KEY)
    assert state.continuation is None
    assert state.pending == {}
    assert state.seq == 2


async def test_events_arriving_while_suspended_wait_and_run_in_order_after_the_resume() -> None:
    async def suspends_on_first(ctx: ActivationContext) -> Complete | Suspend:
        if ctx.is_resume:
            return Complete(b"resumed")
        if ctx.event == b"start":
            ctx.act("refund", "{}")
            return Suspend()
        return Complete(b"ran " + ctx.event)

    harness = harness_of(suspends_on_first)
    await harness.send_event(KEY, "start")
    [intent] = harness.intents()

    for event in ["e1", "e2", "e3"]:
        decision = await harness.send_event(KEY, event)
        assert decision.emits == []
    queued = harness.state(KEY)
    assert [b.payload for b in queued.buffered] == [b"e1", b"e2", b"e3"]
    assert [b.origin_offset for b in queued.buffered] == [1, 2, 3]
    assert queued.seq == 1
    assert harness.outputs() == []

    await harness.send_result(harness.result_for(intent))

    assert [value for _, value in harness.outputs()] == [b"resumed", b"ran e1", b"ran e2", b"ran e3"]
    drained = harness.state(KEY)
    assert drained.buffered == []
    assert drained.continuation is None
    assert drained.seq == 5
    assert [e.topic for e in harness.published] == [INTENTS, OUTPUT, OUTPUT, OUTPUT, OUTPUT]


@pytest.mark.parametrize(
    "outcome",
    [Complete(output="text"), Suspend(snapshot="text")],  # type: ignore[arg-type]
    ids=["str-output", "str-snapshot"],
)
async def test_an_outcome_state_cannot_carry_fails_the_activation_and_changes_nothing(
    outcome: Complete | Suspend,
) -> None:
    async def returns_text(ctx: ActivationContext) -> Complete | Suspend:
        return outcome

    harness = AgentHarness(returns_text, AgentConfig(), clock=ManualClock())
    decision = await harness.send_event(KEY, "hello")

    assert decision.new_state is None
    [error] = harness.errors()
    assert error.reason == "activation_error" and "must be bytes" in error.detail
    await harness.send_event(KEY, "again")  # the key's state still decodes
    assert harness.state(KEY).seq == 0


async def test_a_float_intent_ttl_fails_the_activation() -> None:
    async def float_ttl(ctx: ActivationContext) -> Complete:
        ctx.act("refund", "{}", ttl_ms=1.5)  # type: ignore[arg-type]
        return Complete(b"x")

    harness = AgentHarness(float_ttl, AgentConfig(), clock=ManualClock())
    await harness.send_event(KEY, "hello")

    [error] = harness.errors()
    assert error.reason == "activation_error" and "whole number" in error.detail
    assert harness.state(KEY).seq == 0
