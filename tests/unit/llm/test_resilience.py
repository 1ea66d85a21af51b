"""ResilientProvider: retries with backoff and Retry-After, the circuit breaker, the deadline."""

from __future__ import annotations

import asyncio
import email.utils
import time
from collections.abc import AsyncIterator

import httpx
import pytest

from keylane.llm import (
    CALL_DEADLINE,
    CircuitBreaker,
    CircuitOpen,
    FakeLLM,
    LlmRequest,
    LlmResponse,
    OpenAIProvider,
    ProviderError,
    ProviderRequestError,
    ProviderTimeout,
    ProviderUnavailable,
    RateLimitError,
    ResilientProvider,
    RetryPolicy,
    ServerError,
    match_any,
    raise_error,
    respond_with,
)
from keylane.llm.http_provider import retry_after_s
from tests.llm_servers import FakeOpenAIServer

REQUEST = LlmRequest(model_id="m", messages=["hi"])


class Sleeps:
    """An injected sleep: records each wait and returns at once."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


class Clock:
    """An injected monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def no_jitter(low: float, high: float) -> float:
    return high


@pytest.fixture
async def inner(openai_server: FakeOpenAIServer) -> AsyncIterator[OpenAIProvider]:
    provider = OpenAIProvider(openai_server.base_url, "m", timeout_s=5)
    yield provider
    await provider.aclose()


async def test_429_retry_after_is_honoured_then_success(
    inner: OpenAIProvider, openai_server: FakeOpenAIServer
) -> None:
    openai_server.reply_error(429, "slow down", headers={"Retry-After": "1"})
    openai_server.reply_text("finally", completion_tokens=2)
    sleeps = Sleeps()
    retried: list[tuple[str, float]] = []
    provider = ResilientProvider(
        inner,
        retry=RetryPolicy(jitter=no_jitter),
        sleep=sleeps,
        on_retry=lambda error, delay: retried.append((type(error).__name__, delay)),
    )

    response = await provider.complete(REQUEST)

    assert response.turn().text == "finally"
    assert openai_server.count == 2
    assert sleeps.waits == [1.0]  # the 0.2 s backoff, raised to the server's Retry-After
    assert retried == [("RateLimitError", 1.0)]


async def test_429_retry_after_in_real_time(inner: OpenAIProvider, openai_server: FakeOpenAIServer) -> None:
    openai_server.reply_error(429, "slow down", headers={"Retry-After": "1"})
    openai_server.reply_text("ok")
    provider = ResilientProvider(inner)

    started = time.monotonic()
    response = await provider.complete(REQUEST)
    waited = time.monotonic() - started

    assert response.turn().text == "ok"
    assert 0.95 <= waited < 3
    assert openai_server.count == 2


async def test_backoff_is_exponential_capped_and_jittered() -> None:
    sleeps = Sleeps()
    calls: list[tuple[float, float]] = []

    def jitter(low: float, high: float) -> float:
        calls.append((low, high))
        return high / 2

    provider = ResilientProvider(
        FakeLLM([(match_any(), raise_error(ServerError("boom", status=502)))]),
        retry=RetryPolicy(max_attempts=5, base_delay_s=0.5, max_delay_s=1.5, jitter=jitter),
        breaker=CircuitBreaker(failure_threshold=100),
        sleep=sleeps,
    )
    with pytest.raises(ServerError, match="boom"):
        await provider.complete(REQUEST)
    assert calls == [(0.0, 0.5), (0.0, 1.0), (0.0, 1.5), (0.0, 1.5)]
    assert sleeps.waits == [0.25, 0.5, 0.75, 0.75]


async def test_a_request_error_is_raised_at_once(
    inner: OpenAIProvider, openai_server: FakeOpenAIServer
) -> None:
    openai_server.reply_error(400, "messages[0].content is required", always=True)
    sleeps = Sleeps()
    provider = ResilientProvider(inner, sleep=sleeps)
    with pytest.raises(ProviderRequestError, match=r"messages\[0\]\.content is required"):
        await provider.complete(REQUEST)
    assert openai_server.count == 1
    assert sleeps.waits == []
    assert provider.breaker.consecutive_failures == 0


async def test_500s_open_the_breaker_then_a_half_open_probe_closes_it(
    inner: OpenAIProvider, openai_server: FakeOpenAIServer
) -> None:
    openai_server.reply_error(500, "internal error", always=True)
    clock = Clock()
    transitions: list[tuple[str, str]] = []
    provider = ResilientProvider(
        inner,
        retry=RetryPolicy(max_attempts=2, jitter=no_jitter),
        breaker=CircuitBreaker(failure_threshold=3, cooldown_s=30, clock=clock),
        sleep=Sleeps(),
        on_state_change=lambda old, new: transitions.append((old, new)),
    )

    with pytest.raises(ServerError):
        await provider.complete(REQUEST)  # two attempts, two failures
    assert (openai_server.count, provider.breaker.state) == (2, "closed")
    with pytest.raises(CircuitOpen) as opened:
        await provider.complete(REQUEST)  # third failure opens it; the retry is refused
    assert isinstance(opened.value.__cause__, ServerError)
    assert (openai_server.count, provider.breaker.state) == (3, "open")

    clock.now += 29
    with pytest.raises(CircuitOpen, match=r"next probe in 1\.0s") as refused:
        await provider.complete(REQUEST)
    assert openai_server.count == 3  # failed fast: the server was not contacted
    assert not refused.value.retriable
    assert refused.value.open_until == 1030.0

    clock.now += 1
    openai_server.reply_text("recovered", always=True)
    response = await provider.complete(REQUEST)
    assert response.turn().text == "recovered"
    assert openai_server.count == 4
    assert provider.breaker.state == "closed"
    assert transitions == [("closed", "open"), ("open", "half_open"), ("half_open", "closed")]


async def test_a_failed_probe_reopens_for_another_cooldown() -> None:
    clock = Clock()
    breaker = CircuitBreaker(failure_threshold=1, cooldown_s=10, clock=clock)
    failing = FakeLLM([(match_any(), raise_error(ServerError("down", status=503)))])
    provider = ResilientProvider(failing, retry=RetryPolicy(max_attempts=1), breaker=breaker)

    with pytest.raises(ServerError):
        await provider.complete(REQUEST)
    assert breaker.state == "open"
    clock.now += 10
    with pytest.raises(ServerError):
        await provider.complete(REQUEST)  # the probe, and it fails
    assert breaker.state == "open"
    assert failing.call_count == 2
    clock.now += 9.9
    with pytest.raises(CircuitOpen):
        await provider.complete(REQUEST)
    assert failing.call_count == 2


async def test_half_open_lets_exactly_one_probe_through() -> None:
    clock = Clock()
    breaker = CircuitBreaker(failure_threshold=1, cooldown_s=5, clock=clock)
    release = asyncio.Event()
    calls = 0

    class Slow:
        async def complete(self, request: LlmRequest) -> LlmResponse:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise ServerError("down", status=500)
            await release.wait()
            return LlmResponse(response=b"up")

    transitions: list[tuple[str, str]] = []
    provider = ResilientProvider(
        Slow(),
        retry=RetryPolicy(max_attempts=1),
        breaker=breaker,
        on_state_change=lambda old, new: transitions.append((old, new)),
    )
    with pytest.raises(ServerError):
        await provider.complete(REQUEST)
    clock.now += 5
    probe = asyncio.create_task(provider.complete(REQUEST))
    await asyncio.sleep(0)  # let the probe be admitted
    assert transitions[-1] == ("open", "half_open")
    with pytest.raises(CircuitOpen, match="a probe call is in flight"):
        await provider.complete(REQUEST)
    release.set()
    assert (await probe).response == b"up"
    assert transitions == [("closed", "open"), ("open", "half_open"), ("half_open", "closed")]
    assert calls == 2


async def test_a_cancelled_probe_frees_the_probe_slot() -> None:
    clock = Clock()
    breaker = CircuitBreaker(failure_threshold=1, cooldown_s=5, clock=clock)
    breaker.before_call()
    breaker.record_failure()
    clock.now += 5
    breaker.before_call()  # the probe
    breaker.record_abandoned()  # e.g. the activation timed out mid-call
    breaker.before_call()  # a new probe is admitted
    assert breaker.state == "half_open"


async def test_deadline_stops_waiting_for_a_long_retry_after(
    inner: OpenAIProvider, openai_server: FakeOpenAIServer
) -> None:
    openai_server.reply_error(429, "slow down", headers={"Retry-After": "5"}, always=True)
    provider = ResilientProvider(inner)  # real sleep: a wrong wait would show in the elapsed time
    token = CALL_DEADLINE.set(time.monotonic() + 0.3)
    try:
        started = time.monotonic()
        with pytest.raises(RateLimitError) as caught:
            await provider.complete(REQUEST)
        elapsed = time.monotonic() - started
    finally:
        CALL_DEADLINE.reset(token)
    assert elapsed < 0.3
    assert caught.value.retry_after_s == 5.0
    assert openai_server.count == 1


async def test_deadline_bounds_backoff_too() -> None:
    sleeps = Sleeps()
    llm = FakeLLM([(match_any(), raise_error(ServerError("flaky", status=502)))])
    provider = ResilientProvider(
        llm,
        retry=RetryPolicy(max_attempts=10, jitter=no_jitter),
        breaker=CircuitBreaker(failure_threshold=100),
        sleep=sleeps,
    )
    token = CALL_DEADLINE.set(time.monotonic() + 0.7)
    try:
        with pytest.raises(ServerError):
            await provider.complete(REQUEST)
    finally:
        CALL_DEADLINE.reset(token)
    # each wait is checked alone against the deadline, and recorded sleeps take no time:
    # 0.2 and 0.4 end before it, 0.8 would not
    assert sleeps.waits == [0.2, 0.4]
    assert llm.call_count == 3


async def test_a_retry_after_beyond_the_cap_is_not_waited_for() -> None:
    sleeps = Sleeps()
    llm = FakeLLM([(match_any(), raise_error(RateLimitError("quota", retry_after_s=3600)))])
    provider = ResilientProvider(llm, retry=RetryPolicy(max_retry_after_s=60), sleep=sleeps)
    with pytest.raises(RateLimitError, match="quota"):
        await provider.complete(REQUEST)
    assert (llm.call_count, sleeps.waits) == (1, [])


async def test_non_provider_errors_pass_through_without_a_retry() -> None:
    llm = FakeLLM([(match_any(), raise_error(ValueError("a bug in a custom provider")))])
    provider = ResilientProvider(llm, sleep=Sleeps())
    with pytest.raises(ValueError, match="a bug"):
        await provider.complete(REQUEST)
    assert llm.call_count == 1
    assert provider.breaker.state == "closed"


async def test_success_passes_through_and_resets_the_failure_count() -> None:
    llm = FakeLLM([(match_any(), respond_with(b"hello", prompt_tokens=3))])
    provider = ResilientProvider(llm)
    provider.breaker.record_failure()
    response = await provider.complete(REQUEST)
    assert (response.response, response.prompt_tokens) == (b"hello", 3)
    assert provider.breaker.consecutive_failures == 0
    await provider.aclose()  # FakeLLM has no aclose: nothing to do, no error


def test_retry_after_header_forms() -> None:
    now = 1_700_000_000.0
    in_three_s = email.utils.formatdate(now + 3, usegmt=True)
    assert retry_after_s(httpx.Headers({"Retry-After": "2.5"})) == 2.5
    assert retry_after_s(httpx.Headers({"Retry-After": in_three_s}), now=now) == 3.0
    assert (
        retry_after_s(httpx.Headers({"Retry-After": email.utils.formatdate(now - 10, usegmt=True)}), now=now)
        == 0
    )
    assert retry_after_s(httpx.Headers({"retry-after-ms": "1500", "Retry-After": "9"})) == 1.5
    assert retry_after_s(httpx.Headers({"Retry-After": "soon"})) is None
    assert retry_after_s(httpx.Headers({})) is None


def test_every_error_says_whether_to_retry() -> None:
    expected: dict[type[ProviderError], bool] = {
        RateLimitError: True,
        ServerError: True,
        ProviderTimeout: True,
        ProviderUnavailable: True,
        ProviderRequestError: False,
        CircuitOpen: False,
        ProviderError: False,
    }
    assert {cls: cls.retriable for cls in expected} == expected


async def test_a_4xx_probe_closes_the_breaker_but_a_request_never_sent_does_not() -> None:
    clock = Clock()
    breaker = CircuitBreaker(failure_threshold=1, cooldown_s=5, clock=clock)
    errors: list[Exception] = [
        ServerError("down", status=500),
        ProviderRequestError("openai: messages[0]: role 'robot' is not one of ..."),  # never sent
        ProviderRequestError("openai: HTTP 400 ...", status=400),  # the server answered
    ]

    class Scripted:
        async def complete(self, request: LlmRequest) -> LlmResponse:
            raise errors.pop(0)

    transitions: list[str] = []
    provider = ResilientProvider(
        Scripted(),
        retry=RetryPolicy(max_attempts=1),
        breaker=breaker,
        on_state_change=lambda old, new: transitions.append(new),
    )
    with pytest.raises(ServerError):
        await provider.complete(REQUEST)
    clock.now += 5
    with pytest.raises(ProviderRequestError, match="robot"):
        await provider.complete(REQUEST)
    assert transitions == ["open", "half_open"]  # no verdict: the next call probes again
    with pytest.raises(ProviderRequestError, match="HTTP 400"):
        await provider.complete(REQUEST)
    assert transitions == ["open", "half_open", "closed"]
