"""Fixtures for the provider tests: scripted servers on 127.0.0.1, providers pointed at them."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from keylane.llm.anthropic import AnthropicProvider
from keylane.llm.openai import OpenAIProvider
from tests.llm_servers import FakeAnthropicServer, FakeOpenAIServer


@pytest.fixture
async def openai_server() -> AsyncIterator[FakeOpenAIServer]:
    async with FakeOpenAIServer(model="gpt-test-0001") as server:
        yield server


@pytest.fixture
async def anthropic_server() -> AsyncIterator[FakeAnthropicServer]:
    async with FakeAnthropicServer(model="claude-test-0001") as server:
        yield server


@pytest.fixture
async def openai(openai_server: FakeOpenAIServer) -> AsyncIterator[OpenAIProvider]:
    provider = OpenAIProvider(openai_server.base_url, "gpt-test", api_key="sk-test", timeout_s=5)
    yield provider
    await provider.aclose()


@pytest.fixture
async def anthropic(anthropic_server: FakeAnthropicServer) -> AsyncIterator[AnthropicProvider]:
    provider = AnthropicProvider(
        base_url=anthropic_server.base_url, model="claude-test", api_key="ak-test", timeout_s=5
    )
    yield provider
    await provider.aclose()
