"""ToolLoop and token budgets, driven through the in-process AgentHarness."""

from __future__ import annotations

import json
from typing import Any

import pytest

from keylane import (
    ActivationContext,
    AgentConfig,
    Complete,
    FakeLLM,
    LlmRequest,
    LlmResponse,
    Suspend,
    match_any,
    respond_with,
)
from keylane.authoring.tool_loop import ToolLoop
from keylane.authoring.tools import ToolRegistry
from keylane.llm.types import AssistantTurn, ToolCall, encode_turn
from keylane.testing import AgentHarness

registry = ToolRegistry()
registry.register(
    "lookup_order",
    lambda args: {"order": args["order_id"], "state": "shipped"},
    description="Look up an order.",
    parameters={"type": "object", "properties": {"order_id": {"type": "string"}}},
)
registry.register("refund", lambda args: {"refunded": True}, side_effect=True, description="Refund.")


def _rounds(request: LlmRequest) -> int:
    return sum(1 for m in request.messages if isinstance(m, dict) and m.get("role") == "assistant")


class ScriptedModel(FakeLLM):
    """Answers round n of a loop with ``turns[n]``, reporting 10 + 5 tokens per call."""

    def __init__(self, turns: list[AssistantTurn]) -> None:
        super().__init__([])
        self.turns = turns

    async def complete(self, request: LlmRequest) -> LlmResponse:
        self.requests.append(request)
        turn = self.turns[min(_rounds(request), len(self.turns) - 1)]
        return LlmResponse(response=encode_turn(turn), model_id="m", prompt_tokens=10, completion_tokens=5)


LOOP = ToolLoop(model="m", tools=["lookup_order", "refund"])


async def support(ctx: ActivationContext) -> Complete | Suspend:
    return await LOOP.run(ctx, [{"role": "user", "content": ctx.event.decode()}])


def harness(model: FakeLLM, **config: Any) -> AgentHarness:
    return AgentHarness(support, AgentConfig(tools=registry, **config), provider=model)


async def test_read_only_inline_side_effect_as_intent_then_final_answer() -> None:
    model = ScriptedModel(
        [
            AssistantTurn(tool_calls=[ToolCall(id="c1", name="lookup_order", arguments={"order_id": "A7"})]),
            AssistantTurn(tool_calls=[ToolCall(id="c2", name="refund", arguments={"order_id": "A7"})]),
            AssistantTurn(text="Refunded order A7."),
        ]
    )
    h = harness(model)
    await h.send_event(b"cust-1", "refund A7 please")
    assert h.outputs() == [], "suspended on the refund"
    [intent] = h.intents()
    assert (intent.tool, json.loads(intent.args_json)) == ("refund", {"order_id": "A7"})
    assert model.call_count == 2
    second = model.requests[1]
    assert second.tools_schema == [
        {
            "name": "lookup_order",
            "description": "Look up an order.",
            "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}},
        },
        {"name": "refund", "description": "Refund.", "parameters": {"type": "object"}},
    ]
    assert second.messages[-1] == {
        "role": "tool",
        "tool_call_id": "c1",
        "content": '{"order":"A7","state":"shipped"}',
    }

    await h.send_result(h.result_for(intent, result_json='{"refunded":true}'))
    assert h.outputs() == [(b"cust-1", b"Refunded order A7.")]
    last = model.requests[-1]
    assert last.messages[0] == {"role": "user", "content": "refund A7 please"}, "history survived suspension"
    assert last.messages[-1] == {"role": "tool", "tool_call_id": "c2", "content": '{"refunded":true}'}
    assert model.call_count == 3


async def test_two_side_effects_in_one_round_resume_only_when_both_are_back() -> None:
    model = ScriptedModel(
        [
            AssistantTurn(
                tool_calls=[
                    ToolCall(id="a", name="refund", arguments={"n": 1}),
                    ToolCall(id="b", name="refund", arguments={"n": 2}),
                ]
            ),
            AssistantTurn(text="both done"),
        ]
    )
    h = harness(model)
    await h.send_event(b"k", "go")
    first, second = h.intents()
    await h.send_result(h.result_for(second, status="ERROR", result_json=None, error="card declined"))
    assert h.outputs() == [] and model.call_count == 1, "still waiting for the first refund"
    await h.send_result(h.result_for(first))
    assert h.outputs() == [(b"k", b"both done")]
    tool_messages = [m for m in model.requests[-1].messages if m["role"] == "tool"]
    assert tool_messages == [
        {"role": "tool", "tool_call_id": "b", "content": '{"status":"ERROR","error":"card declined"}'},
        {"role": "tool", "tool_call_id": "a", "content": "null"},
    ]


async def test_an_unknown_tool_is_answered_with_an_error_the_model_can_read() -> None:
    model = ScriptedModel(
        [
            AssistantTurn(tool_calls=[ToolCall(id="x", name="delete_everything", arguments={})]),
            AssistantTurn(text="ok"),
        ]
    )
    h = harness(model)
    await h.send_event(b"k", "hi")
    assert h.outputs() == [(b"k", b"ok")]
    assert model.requests[1].messages[-1]["content"] == '{"error":"unknown tool \'delete_everything\'"}'


async def test_a_model_that_never_stops_calling_tools_fails_after_max_iterations() -> None:
    looping = ScriptedModel(
        [AssistantTurn(tool_calls=[ToolCall(id="c", name="lookup_order", arguments={"order_id": "1"})])]
    )
    h = harness(looping)
    await h.send_event(b"k", "loop")
    [error] = h.errors()
    assert error.reason == "activation_error"
    assert "after 10 rounds (max_iterations)" in error.detail
    assert looping.call_count == 10
    assert h.state(b"k").seq == 0, "nothing committed"


async def test_exceeding_the_token_budget_fails_as_budget_exceeded_and_changes_nothing() -> None:
    model = ScriptedModel(
        [
            AssistantTurn(tool_calls=[ToolCall(id="c1", name="lookup_order", arguments={"order_id": "A"})]),
            AssistantTurn(text="done"),
        ]
    )
    h = harness(model, max_tokens_per_activation=20)  # each call costs 15
    await h.send_event(b"k", "x")
    [error] = h.errors()
    assert error.reason == "budget_exceeded"
    assert "used 30 tokens, over its budget of 20" in error.detail
    assert h.outputs() == [] and h.state(b"k").seq == 0


async def ask_before_and_after_suspending(ctx: ActivationContext) -> Complete | Suspend:
    await ctx.call_model(LlmRequest(model_id="m", messages=["first"]))  # a cache hit on the resume
    if not ctx.is_resume:
        ctx.act("refund", "{}")
        return Suspend()
    await ctx.call_model(LlmRequest(model_id="m", messages=["second"]))
    return Complete(b"ok")


@pytest.mark.parametrize(("budget", "completes"), [(30, True), (25, False)])
async def test_cache_hits_are_charged_so_a_replay_decides_like_the_first_run(
    budget: int, completes: bool
) -> None:
    model = FakeLLM([(match_any(), respond_with(b"x", prompt_tokens=10, completion_tokens=5))])
    h = AgentHarness(
        ask_before_and_after_suspending,
        AgentConfig(tools=registry, max_tokens_per_activation=budget),
        provider=model,
    )
    await h.send_event(b"k", "x")
    [intent] = h.intents()
    await h.send_result(h.result_for(intent))
    assert model.call_count == 2, "the resume's first call came from the replay cache"
    if completes:
        assert h.outputs() == [(b"k", b"ok")]
    else:
        [error] = h.errors()
        assert error.reason == "budget_exceeded" and "used 30 tokens" in error.detail
        assert h.state(b"k").continuation is not None, "the resume changed nothing"


@pytest.mark.parametrize("budget", [0, -5])
def test_budget_must_be_positive(budget: int) -> None:
    with pytest.raises(ValueError, match="max_tokens_per_activation"):
        AgentConfig(max_tokens_per_activation=budget)


async def test_a_resume_offers_the_tools_the_run_started_with() -> None:
    tools = ToolRegistry()
    tools.register("refund", lambda args: None, side_effect=True, description="Refund, v1.")
    model = ScriptedModel(
        [AssistantTurn(tool_calls=[ToolCall(id="r", name="refund", arguments={})]), AssistantTurn(text="ok")]
    )
    loop = ToolLoop(model="m", tools=["refund"])

    async def agent(ctx: ActivationContext) -> Complete | Suspend:
        return await loop.run(ctx, [{"role": "user", "content": "go"}])

    h = AgentHarness(agent, AgentConfig(tools=tools), provider=model)
    await h.send_event(b"k", "go")
    tools.register("refund", lambda args: None, side_effect=True, description="Refund, v2.")  # a deploy
    await h.send_result(h.result_for(h.intents()[0]))
    assert h.outputs() == [(b"k", b"ok")]
    assert [r.tools_schema for r in model.requests] == [
        [{"name": "refund", "description": "Refund, v1.", "parameters": {"type": "object"}}]
    ] * 2
