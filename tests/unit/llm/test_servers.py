"""The scripted servers themselves, as an end-to-end test would use them: from a thread."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from keylane.llm import AnthropicProvider, LlmRequest, OpenAIProvider, ProviderRequestError
from tests.llm_servers import FakeAnthropicServer, FakeOpenAIServer


def test_openai_server_in_a_thread_serves_synchronous_callers() -> None:
    server = FakeOpenAIServer()
    base_url = server.start_in_thread()
    try:
        server.reply_text("from a thread", always=True)
        assert base_url.startswith("http://127.0.0.1:") and base_url.endswith("/v1")

        async def ask() -> str:
            provider = OpenAIProvider(base_url, "m")
            try:
                return (await provider.complete(LlmRequest(model_id="m", messages=["hi"]))).turn().text
            finally:
                await provider.aclose()

        assert asyncio.run(ask()) == "from a thread"
        answer = httpx.post(f"{base_url}/chat/completions", json={"model": "m", "messages": []})
        assert answer.json()["choices"][0]["message"]["content"] == "from a thread"
        assert server.count == 2
    finally:
        server.stop()
    with pytest.raises(httpx.ConnectError):
        httpx.post(f"{base_url}/chat/completions", json={})


async def test_an_unscripted_request_is_refused_not_answered() -> None:
    async with FakeAnthropicServer() as server:
        provider = AnthropicProvider(base_url=server.base_url, model="m", api_key="k")
        try:
            with pytest.raises(ProviderRequestError, match=r"no scripted reply left for request #1"):
                await provider.complete(LlmRequest(model_id="m", messages=["hi"]))
        finally:
            await provider.aclose()
        assert server.count == 1


async def test_scripted_replies_are_used_in_order_then_the_default() -> None:
    async with FakeOpenAIServer() as server:
        server.reply_text("one").reply_text("two").reply_text("again", always=True)
        provider = OpenAIProvider(server.base_url, "m")
        try:
            texts = [
                (await provider.complete(LlmRequest(model_id="m", messages=["hi"]))).turn().text
                for _ in range(4)
            ]
        finally:
            await provider.aclose()
    assert texts == ["one", "two", "again", "again"]
