"""OpenAIProvider against a server speaking the real Chat Completions wire format."""

from __future__ import annotations

import pytest

from keylane.llm import (
    LlmRequest,
    OpenAIProvider,
    ProviderRequestError,
    ProviderTimeout,
    ProviderUnavailable,
    RateLimitError,
    ServerError,
    ToolCall,
)
from keylane.testing.processes import free_port
from tests.llm_servers import FakeOpenAIServer

WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


async def test_text_completion_and_token_counts(
    openai: OpenAIProvider, openai_server: FakeOpenAIServer
) -> None:
    openai_server.reply_text("Hello there.", prompt_tokens=12, completion_tokens=3)

    response = await openai.complete(
        LlmRequest(
            model_id="",
            messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
            sampling_params={"max_tokens": 50, "temperature": 0.2, "top_p": 0.9, "stop": ["\n\n"]},
        )
    )

    turn = response.turn()
    assert (turn.text, turn.tool_calls, turn.stop_reason) == ("Hello there.", [], "stop")
    assert (response.prompt_tokens, response.completion_tokens) == (12, 3)
    assert response.model_id == "gpt-test-0001"  # what the server reports
    assert response.metadata["provider"] == "openai"
    [request] = openai_server.requests
    assert request.headers["Authorization"] == "Bearer sk-test"
    assert request.json == {
        "model": "gpt-test",  # model_id was empty: the configured model
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        "max_tokens": 50,
        "temperature": 0.2,
        "top_p": 0.9,
        "stop": ["\n\n"],
    }


async def test_request_model_id_wins_and_no_key_sends_no_authorization(
    openai_server: FakeOpenAIServer,
) -> None:
    provider = OpenAIProvider(openai_server.base_url, "configured")
    openai_server.reply_text("ok")
    try:
        await provider.complete(LlmRequest(model_id="per-request", messages=["a bare string is a user turn"]))
    finally:
        await provider.aclose()
    [request] = openai_server.requests
    assert "Authorization" not in request.headers
    assert request.json["model"] == "per-request"
    assert request.json["messages"] == [{"role": "user", "content": "a bare string is a user turn"}]


async def test_tool_call_round_trip(openai: OpenAIProvider, openai_server: FakeOpenAIServer) -> None:
    openai_server.reply_tool_calls([("call_1", "get_weather", {"city": "Oslo"})], prompt_tokens=40)
    openai_server.reply_text("It is 3 degrees in Oslo.")
    history: list[object] = [{"role": "user", "content": "Weather in Oslo?"}]

    first = await openai.complete(
        LlmRequest(model_id="gpt-test", messages=history, tools_schema=[WEATHER_TOOL])
    )
    turn = first.turn()
    assert turn.tool_calls == [ToolCall("call_1", "get_weather", {"city": "Oslo"})]
    assert turn.stop_reason == "tool_calls"
    assert first.prompt_tokens == 40

    history += [turn.as_message(), {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 3}'}]
    second = await openai.complete(
        LlmRequest(model_id="gpt-test", messages=history, tools_schema=[WEATHER_TOOL])
    )
    assert second.turn().text == "It is 3 degrees in Oslo."

    first_body, second_body = openai_server.bodies
    assert first_body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Current weather for a city",
                "parameters": WEATHER_TOOL["parameters"],
            },
        }
    ]
    assert second_body["messages"] == [
        {"role": "user", "content": "Weather in Oslo?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 3}'},
    ]


async def test_tool_arguments_that_are_not_json_are_a_request_error(
    openai: OpenAIProvider, openai_server: FakeOpenAIServer
) -> None:
    body = openai_server.answer_body("", [("c1", "get_weather", {})], prompt_tokens=1, completion_tokens=1)
    body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = '{"city": "Os'
    openai_server.reply(json_body=body)
    with pytest.raises(
        ProviderRequestError, match=r"tool_calls\[0\] \('get_weather'\) arguments are not a JSON"
    ):
        await openai.complete(LlmRequest(model_id="m", messages=["hi"]))


async def test_a_body_that_is_not_json_is_a_request_error(
    openai: OpenAIProvider, openai_server: FakeOpenAIServer
) -> None:
    openai_server.reply(body=b"<html>bad gateway page</html>")
    with pytest.raises(ProviderRequestError) as caught:
        await openai.complete(LlmRequest(model_id="m", messages=["hi"]))
    assert str(caught.value).startswith("openai: response body is not valid JSON (status 200, 29 bytes)")
    assert not caught.value.retriable


async def test_json_without_choices_is_a_request_error(
    openai: OpenAIProvider, openai_server: FakeOpenAIServer
) -> None:
    openai_server.reply(json_body={"id": "x", "object": "chat.completion"})
    with pytest.raises(ProviderRequestError, match=r"openai: malformed response: no 'choices' in the answer"):
        await openai.complete(LlmRequest(model_id="m", messages=["hi"]))


async def test_a_400_carries_the_server_message(
    openai: OpenAIProvider, openai_server: FakeOpenAIServer
) -> None:
    openai_server.reply_error(400, "This model's maximum context length is 8192 tokens.")
    with pytest.raises(ProviderRequestError) as caught:
        await openai.complete(LlmRequest(model_id="m", messages=["hi"]))
    assert caught.value.status == 400
    assert "HTTP 400" in str(caught.value)
    assert "maximum context length is 8192 tokens. (invalid_request_error)" in str(caught.value)


@pytest.mark.parametrize(
    ("status", "error"),
    [(408, ProviderTimeout), (429, RateLimitError), (500, ServerError), (503, ServerError)],
)
async def test_status_codes_map_to_retriable_errors(
    openai: OpenAIProvider, openai_server: FakeOpenAIServer, status: int, error: type[Exception]
) -> None:
    openai_server.reply_error(status, "try later", headers={"Retry-After": "2"})
    with pytest.raises(error, match="try later") as caught:
        await openai.complete(LlmRequest(model_id="m", messages=["hi"]))
    assert caught.value.retriable  # type: ignore[attr-defined]
    if status in (429, 503):
        assert caught.value.retry_after_s == 2.0  # type: ignore[attr-defined]


async def test_a_read_timeout_is_a_provider_timeout(openai_server: FakeOpenAIServer) -> None:
    provider = OpenAIProvider(openai_server.base_url, "m", timeout_s=0.2)
    openai_server.reply_text("too late", delay_s=3)
    try:
        with pytest.raises(ProviderTimeout, match=r"openai: read timeout calling http://127\.0\.0\.1:"):
            await provider.complete(LlmRequest(model_id="m", messages=["hi"]))
    finally:
        await provider.aclose()


async def test_nobody_listening_is_provider_unavailable() -> None:
    port = free_port()
    provider = OpenAIProvider(f"http://127.0.0.1:{port}/v1", "m", connect_timeout_s=1)
    try:
        with pytest.raises(
            ProviderUnavailable, match=f"openai: cannot reach http://127.0.0.1:{port}/v1"
        ) as caught:
            await provider.complete(LlmRequest(model_id="m", messages=["hi"]))
    finally:
        await provider.aclose()
    assert caught.value.retriable


async def test_a_bad_message_fails_before_any_request(
    openai: OpenAIProvider, openai_server: FakeOpenAIServer
) -> None:
    with pytest.raises(ProviderRequestError, match=r"messages\[1\]: role 'robot' is not one of"):
        await openai.complete(LlmRequest(model_id="m", messages=["hi", {"role": "robot", "content": "x"}]))
    with pytest.raises(ProviderRequestError, match=r"messages\[0\]: a tool message needs 'tool_call_id'"):
        await openai.complete(LlmRequest(model_id="m", messages=[{"role": "tool", "content": "{}"}]))
    assert openai_server.count == 0


async def test_a_wrong_base_url_or_key_says_what_to_check(openai_server: FakeOpenAIServer) -> None:
    without_v1 = openai_server.base_url.removesuffix("/v1")
    provider = OpenAIProvider(without_v1, "m")
    try:
        with pytest.raises(ProviderRequestError, match=r"HTTP 404 .*; check the base URL \(.* end in /v1\)"):
            await provider.complete(LlmRequest(model_id="m", messages=["hi"]))
    finally:
        await provider.aclose()
    openai_server.reply_error(401, "Incorrect API key provided")
    provider = OpenAIProvider(openai_server.base_url, "m", api_key="wrong")
    try:
        with pytest.raises(ProviderRequestError, match=r"Incorrect API key provided .*; check the API key"):
            await provider.complete(LlmRequest(model_id="m", messages=["hi"]))
    finally:
        await provider.aclose()
