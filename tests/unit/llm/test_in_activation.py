"""Real providers inside an activation: failures become error records that keep the event,
retries stop at the activation's deadline, and token counts reach the metrics."""

from __future__ import annotations

import base64
import time

from prometheus_client import REGISTRY

from keylane import ActivationContext, AgentConfig, Complete, LlmRequest
from keylane.llm.openai import OpenAIProvider
from keylane.llm.resilience import ResilientProvider, RetryPolicy
from keylane.testing import AgentHarness
from keylane.wire import AgentEnvelope, encode
from tests.llm_servers import FakeOpenAIServer


async def ask(ctx: ActivationContext) -> Complete:
    response = await ctx.call_model(LlmRequest(model_id="", messages=[{"role": "user", "content": "hi"}]))
    return Complete(response.turn().text.encode())


def sample(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


async def test_a_malformed_body_fails_the_activation_and_keeps_the_event(
    openai_server: FakeOpenAIServer, openai: OpenAIProvider
) -> None:
    openai_server.reply(body=b"<html>bad gateway</html>")
    h = AgentHarness(ask, AgentConfig(), provider=openai)
    await h.send_event(b"k", "hello")
    [error] = h.errors()
    assert error.reason == "activation_error"
    assert "ProviderRequestError" in error.detail and "not valid JSON" in error.detail
    assert base64.b64decode(error.raw_value_b64 or "") == encode(AgentEnvelope(payload="hello"))
    assert h.state(b"k").seq == 0, "nothing committed: a redelivery tries again"


GEN_AI = {
    "gen_ai_operation_name": "chat",
    "gen_ai_provider_name": "openai",
    "gen_ai_request_model": "gpt-test",  # the request names none: the provider's configured model
}


def tokens(token_type: str, suffix: str = "sum") -> float:
    labels = {**GEN_AI, "gen_ai_token_type": token_type}
    return REGISTRY.get_sample_value(f"gen_ai_client_token_usage_{suffix}", labels) or 0.0


def calls(error_type: str = "") -> float:
    labels = {**GEN_AI, "error_type": error_type}
    return REGISTRY.get_sample_value("gen_ai_client_operation_duration_seconds_count", labels) or 0.0


async def test_token_counts_and_calls_reach_the_metrics(
    openai_server: FakeOpenAIServer, openai: OpenAIProvider
) -> None:
    before = {
        "input": tokens("input"),
        "output": tokens("output"),
        "observed": tokens("input", "count"),
        "calls": calls(),
        **{name: sample(name) for name in ("keylane_llm_calls_total", "keylane_llm_cache_hits_total")},
        "seconds": sample("keylane_llm_call_duration_seconds_count"),
    }
    openai_server.reply_text("hello back", prompt_tokens=12, completion_tokens=3)
    h = AgentHarness(ask, AgentConfig(), provider=openai)
    await h.send_event(b"k", "hello")
    assert h.outputs() == [(b"k", b"hello back")]
    assert tokens("input") - before["input"] == 12
    assert tokens("output") - before["output"] == 3
    assert tokens("input", "count") - before["observed"] == 1, "one observation per call and type"
    assert calls() - before["calls"] == 1, "one duration per provider call, error_type empty"
    assert sample("keylane_llm_calls_total") - before["keylane_llm_calls_total"] == 1
    assert sample("keylane_llm_call_duration_seconds_count") - before["seconds"] == 1
    assert sample("keylane_llm_cache_hits_total") == before["keylane_llm_cache_hits_total"]


async def test_a_failed_call_is_observed_with_its_error_type(
    openai_server: FakeOpenAIServer, openai: OpenAIProvider
) -> None:
    failed, succeeded, observed = calls("ProviderRequestError"), calls(), tokens("input", "count")
    openai_server.reply_error(400, "bad request")
    h = AgentHarness(ask, AgentConfig(), provider=openai)
    await h.send_event(b"k", "hello")
    assert [e.reason for e in h.errors()] == ["activation_error"]
    assert calls("ProviderRequestError") - failed == 1
    assert calls() == succeeded
    assert tokens("input", "count") == observed, "a failed call reports no tokens"


async def test_retries_never_wait_past_the_activation_deadline(
    openai_server: FakeOpenAIServer, openai: OpenAIProvider
) -> None:
    openai_server.reply_error(429, "slow down", headers={"retry-after": "20"}, always=True)
    provider = ResilientProvider(openai, retry=RetryPolicy(max_attempts=5))
    h = AgentHarness(ask, AgentConfig(activation_timeout_s=2.0), provider=provider)
    started = time.monotonic()
    await h.send_event(b"k", "hello")
    assert time.monotonic() - started < 1.5, "gave up at once instead of sleeping 20 s"
    [error] = h.errors()
    assert error.reason == "activation_error" and "RateLimitError" in error.detail
    assert openai_server.count == 1
