"""AnthropicProvider against a server speaking the real Messages API wire format."""

from __future__ import annotations

import pytest

from keylane.llm import (
    AnthropicProvider,
    LlmRequest,
    ProviderRequestError,
    ProviderTimeout,
    RateLimitError,
    ServerError,
    ToolCall,
)
from tests.llm_servers import FakeAnthropicServer

SEARCH_TOOL = {
    "name": "search",
    "description": "Search the knowledge base",
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
}
CLOCK_TOOL = {"name": "now", "description": "The current time"}


async def test_text_completion_and_token_counts(
    anthropic: AnthropicProvider, anthropic_server: FakeAnthropicServer
) -> None:
    anthropic_server.reply_text("Bonjour.", prompt_tokens=21, completion_tokens=4)

    response = await anthropic.complete(
        LlmRequest(
            model_id="",
            messages=[
                {"role": "system", "content": "Answer in French."},
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hello"},
            ],
            sampling_params={"temperature": 0.5, "stop": "END"},
        )
    )

    turn = response.turn()
    assert (turn.text, turn.tool_calls, turn.stop_reason) == ("Bonjour.", [], "end_turn")
    assert (response.prompt_tokens, response.completion_tokens) == (21, 4)
    assert response.model_id == "claude-test-0001"
    [request] = anthropic_server.requests
    assert request.headers["x-api-key"] == "ak-test"
    assert request.headers["anthropic-version"] == "2023-06-01"
    assert request.json == {
        "model": "claude-test",
        "max_tokens": 1024,  # the API requires it: the provider's default when unset
        "system": "Answer in French.\n\nBe brief.",
        "messages": [{"role": "user", "content": "Hello"}],
        "temperature": 0.5,
        "stop_sequences": ["END"],
    }


async def test_tool_call_round_trip(
    anthropic: AnthropicProvider, anthropic_server: FakeAnthropicServer
) -> None:
    anthropic_server.reply_tool_calls(
        [("toolu_1", "search", {"q": "refund policy"}), ("toolu_2", "now", {})], text="Let me check."
    )
    anthropic_server.reply_text("Refunds take 5 days.")
    history: list[object] = [
        {"role": "system", "content": "You are support."},
        {"role": "user", "content": "How long do refunds take?"},
    ]

    first = await anthropic.complete(
        LlmRequest(
            model_id="claude-test",
            messages=history,
            tools_schema=[SEARCH_TOOL, CLOCK_TOOL],
            sampling_params={"max_tokens": 300},
        )
    )
    turn = first.turn()
    assert turn.text == "Let me check."
    assert turn.tool_calls == [
        ToolCall("toolu_1", "search", {"q": "refund policy"}),
        ToolCall("toolu_2", "now", {}),
    ]
    assert turn.stop_reason == "tool_use"

    history += [
        turn.as_message(),
        {"role": "tool", "tool_call_id": "toolu_1", "content": '{"days": 5}'},
        {"role": "tool", "tool_call_id": "toolu_2", "content": '"2025-01-01T00:00:00Z"'},
    ]
    second = await anthropic.complete(LlmRequest(model_id="claude-test", messages=history))
    assert second.turn().text == "Refunds take 5 days."

    first_body, second_body = anthropic_server.bodies
    assert first_body["max_tokens"] == 300
    assert first_body["tools"] == [
        {
            "name": "search",
            "description": "Search the knowledge base",
            "input_schema": SEARCH_TOOL["parameters"],
        },
        {
            "name": "now",
            "description": "The current time",
            "input_schema": {"type": "object", "properties": {}},
        },
    ]
    assert second_body["system"] == "You are support."
    assert second_body["messages"] == [
        {"role": "user", "content": "How long do refunds take?"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me check."},
                {"type": "tool_use", "id": "toolu_1", "name": "search", "input": {"q": "refund policy"}},
                {"type": "tool_use", "id": "toolu_2", "name": "now", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [  # both results in ONE user turn
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": '{"days": 5}'},
                {"type": "tool_result", "tool_use_id": "toolu_2", "content": '"2025-01-01T00:00:00Z"'},
            ],
        },
    ]


async def test_error_bodies_and_statuses(
    anthropic: AnthropicProvider, anthropic_server: FakeAnthropicServer
) -> None:
    anthropic_server.reply_error(400, "max_tokens: must be at most 8192")
    anthropic_server.reply_error(
        429, "Number of request tokens has exceeded your rate limit", headers={"retry-after": "7"}
    )
    anthropic_server.reply_error(529, "Overloaded")
    anthropic_server.reply_error(408, "Request timed out")
    request = LlmRequest(model_id="m", messages=["hi"])

    with pytest.raises(ProviderRequestError, match=r"must be at most 8192 \(invalid_request_error\)"):
        await anthropic.complete(request)
    with pytest.raises(RateLimitError, match="exceeded your rate limit") as limited:
        await anthropic.complete(request)
    assert limited.value.retry_after_s == 7.0
    with pytest.raises(
        ServerError, match=r"anthropic: HTTP 529 .*Overloaded \(overloaded_error\)"
    ) as overloaded:
        await anthropic.complete(request)
    assert overloaded.value.status == 529
    with pytest.raises(ProviderTimeout, match="HTTP 408"):
        await anthropic.complete(request)


async def test_a_body_without_content_is_a_request_error(
    anthropic: AnthropicProvider, anthropic_server: FakeAnthropicServer
) -> None:
    anthropic_server.reply(json_body={"id": "msg_1", "type": "message", "usage": {}})
    with pytest.raises(ProviderRequestError, match=r"anthropic: malformed response: no 'content' list"):
        await anthropic.complete(LlmRequest(model_id="m", messages=["hi"]))


async def test_no_api_key_sends_no_key_header(anthropic_server: FakeAnthropicServer) -> None:
    provider = AnthropicProvider(
        base_url=anthropic_server.base_url, model="m", api_key=None, default_max_tokens=64
    )
    anthropic_server.reply_text("ok")
    try:
        await provider.complete(LlmRequest(model_id="", messages=["hi"]))
    finally:
        await provider.aclose()
    [request] = anthropic_server.requests
    assert "x-api-key" not in request.headers
    assert request.json["max_tokens"] == 64
