"""AssistantTurn and ToolCall: what real providers return, and how FakeLLM scripts the same."""

from __future__ import annotations

from keylane.llm import (
    AssistantTurn,
    FakeLLM,
    LlmRequest,
    LlmResponse,
    ToolCall,
    encode_turn,
    match_any,
    respond_with,
)


def test_a_turn_round_trips_through_the_response_bytes() -> None:
    turn = AssistantTurn(
        text="checking",
        tool_calls=[ToolCall("c1", "lookup", {"id": 7, "tags": ["a"]})],
        stop_reason="tool_calls",
    )
    assert LlmResponse(response=encode_turn(turn)).turn() == turn


def test_plain_payloads_become_text() -> None:
    assert LlmResponse(response=b"just words").turn() == AssistantTurn(text="just words")
    assert LlmResponse(response=b'{"answer": 42}').turn() == AssistantTurn(text='{"answer": 42}')
    assert LlmResponse(response=b"{}").turn() == AssistantTurn(text="{}")
    assert LlmResponse(response=b'{"text": 5}').turn() == AssistantTurn(text='{"text": 5}')
    assert LlmResponse(response=b"\xff caf\xc3\xa9").turn().text == "\ufffd café"


def test_defaults_are_not_shared_between_turns() -> None:
    first, second = AssistantTurn(), AssistantTurn()
    first.tool_calls.append(ToolCall("x", "y", {}))
    assert second.tool_calls == []


def test_as_message_is_the_neutral_assistant_message() -> None:
    assert AssistantTurn(text="hi").as_message() == {"role": "assistant", "content": "hi"}
    assert AssistantTurn(tool_calls=[ToolCall("c1", "f", {"a": 1})]).as_message() == {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "c1", "name": "f", "arguments": {"a": 1}}],
    }


async def test_fake_llm_can_script_tool_calls() -> None:
    turn = AssistantTurn(
        tool_calls=[ToolCall("c1", "get_weather", {"city": "Oslo"})], stop_reason="tool_calls"
    )
    llm = FakeLLM([(match_any(), respond_with(encode_turn(turn)))])
    response = await llm.complete(LlmRequest(model_id="m", messages=["weather?"]))
    assert response.turn().tool_calls == [ToolCall("c1", "get_weather", {"city": "Oslo"})]
