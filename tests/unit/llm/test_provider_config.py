"""Provider URLs: every scheme, every key source, and one clear line for every mistake."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from keylane.errors import ConfigError
from keylane.llm import (
    AnthropicProvider,
    FakeLLM,
    LlmRequest,
    OpenAIProvider,
    ProviderConfigError,
    ResilientProvider,
    parse_provider_url,
)

ENV = {"OPENAI_API_KEY": "sk-secret-123", "ANTHROPIC_API_KEY": "ak-secret-456"}


async def test_openai_http_without_a_key() -> None:
    settings = parse_provider_url("openai+http://localhost:8000/v1/?model=Qwen/Qwen2.5-7B-Instruct", {})
    assert (settings.kind, settings.base_url, settings.model) == (
        "openai",
        "http://localhost:8000/v1",
        "Qwen/Qwen2.5-7B-Instruct",
    )
    assert settings.api_key is None
    provider = settings.build()
    assert isinstance(provider, ResilientProvider)
    assert isinstance(provider.inner, OpenAIProvider)
    assert provider.inner.base_url == "http://localhost:8000/v1"
    await provider.aclose()


async def test_openai_https_with_options() -> None:
    settings = parse_provider_url(
        "openai+https://api.openai.com/v1?model=gpt-4o-mini&api_key_env=OPENAI_API_KEY"
        "&timeout_s=20&connect_timeout_s=2.5&max_attempts=3&breaker_failures=7&breaker_cooldown_s=12",
        ENV,
    )
    assert settings.base_url == "https://api.openai.com/v1"
    assert settings.api_key == "sk-secret-123"
    assert (settings.timeout_s, settings.connect_timeout_s) == (20.0, 2.5)
    provider = settings.build()
    assert isinstance(provider, ResilientProvider)
    assert provider.retry.max_attempts == 3
    assert (provider.breaker.failure_threshold, provider.breaker.cooldown_s) == (7, 12.0)
    await provider.aclose()


@pytest.mark.parametrize("scheme", ["anthropic+https", "anthropic+http"])
async def test_anthropic(scheme: str) -> None:
    settings = parse_provider_url(
        f"{scheme}://api.anthropic.com?model=claude-sonnet-4-5&api_key_env=ANTHROPIC_API_KEY&max_tokens=4096",
        ENV,
    )
    assert settings.base_url == f"{scheme.split('+')[1]}://api.anthropic.com"
    assert (settings.model, settings.max_tokens, settings.api_key) == (
        "claude-sonnet-4-5",
        4096,
        "ak-secret-456",
    )
    provider = settings.build()
    assert isinstance(provider, ResilientProvider)
    assert isinstance(provider.inner, AnthropicProvider)
    assert provider.inner.default_max_tokens == 4096
    await provider.aclose()


async def test_fake_answers_every_request_with_its_reply() -> None:
    settings = parse_provider_url("fake://?reply=hello%20world&latency_ms=1", {})
    assert (settings.kind, settings.reply, settings.latency_ms) == ("fake", "hello world", 1.0)
    provider = settings.build()
    assert isinstance(provider, ResilientProvider)
    assert isinstance(provider.inner, FakeLLM)
    response = await provider.complete(LlmRequest(model_id="any", messages=["hi"]))
    assert response.turn().text == "hello world"
    assert parse_provider_url("fake://", {}).reply == "ok"


async def test_a_configured_fake_counts_its_requests_and_keeps_none() -> None:
    """It serves a running service: keeping every request would grow without bound."""
    provider = parse_provider_url("fake://?reply=ok", {}).build()
    assert isinstance(provider, ResilientProvider) and isinstance(provider.inner, FakeLLM)
    for n in range(3):
        await provider.complete(LlmRequest(model_id="any", messages=[f"call {n}"]))
    assert provider.inner.call_count == 3
    assert provider.inner.requests == []


def test_api_key_file_is_read_and_stripped(tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("  sk-from-file\n")
    settings = parse_provider_url(f"openai+https://api.openai.com/v1?model=m&api_key_file={key_file}", {})
    assert settings.api_key == "sk-from-file"
    assert settings.api_key_source == f"api_key_file={key_file}"


def test_redaction_names_the_source_never_the_key(tmp_path: Path) -> None:
    settings = parse_provider_url(
        "openai+https://api.openai.com/v1?model=gpt-4o-mini&api_key_env=OPENAI_API_KEY", ENV
    )
    assert (
        settings.redacted() == "openai+https://api.openai.com/v1?model=gpt-4o-mini&api_key_env=OPENAI_API_KEY"
    )
    assert "sk-secret" not in repr(settings)
    assert "sk-secret" not in settings.redacted()
    assert parse_provider_url("fake://?reply=hi", {}).redacted() == "fake://?reply=hi&latency_ms=0"
    assert (
        parse_provider_url("anthropic+http://127.0.0.1:9000?model=c", {}).redacted()
        == "anthropic+http://127.0.0.1:9000?model=c"
    )


@pytest.mark.parametrize(
    ("url", "environ", "message"),
    [
        (
            "opnai+http://localhost/v1?model=m",
            {},
            "KEYLANE_PROVIDER: unknown scheme 'opnai+http'; use openai+http(s)://, anthropic+http(s):// or fake://",
        ),
        (
            "openai://localhost/v1?model=m",
            {},
            "KEYLANE_PROVIDER: unknown scheme 'openai'; use openai+http(s)://, anthropic+http(s):// or fake://",
        ),
        ("", {}, "KEYLANE_PROVIDER: is empty; use openai+http(s)://, anthropic+http(s):// or fake://"),
        (
            "localhost:8000",
            {},
            "KEYLANE_PROVIDER: unknown scheme 'localhost'; use openai+http(s)://, anthropic+http(s):// or fake://",
        ),
        (
            "openai+http://localhost:8000/v1",
            {},
            "KEYLANE_PROVIDER: openai needs a model; add ?model=NAME to the URL",
        ),
        (
            "anthropic+https://api.anthropic.com?api_key_env=ANTHROPIC_API_KEY",
            ENV,
            "KEYLANE_PROVIDER: anthropic needs a model; add ?model=NAME to the URL",
        ),
        (
            "openai+https://api.openai.com/v1?model=m&api_key_env=OPENAI_API_KEY",
            {},
            "KEYLANE_PROVIDER: api_key_env=OPENAI_API_KEY is not set in the environment (or is empty); "
            "export it",
        ),
        (
            "anthropic+https://api.anthropic.com?model=c",
            {},
            "KEYLANE_PROVIDER: anthropic+https needs an API key; "
            "add api_key_env=ANTHROPIC_API_KEY or api_key_file=PATH",
        ),
        (
            "openai+http://localhost/v1?model=m&modle=x",
            {},
            "KEYLANE_PROVIDER: unknown option 'modle' for openai; known: api_key_env, api_key_file, "
            "breaker_cooldown_s, breaker_failures, connect_timeout_s, max_attempts, model, timeout_s",
        ),
        (
            "openai+http://localhost/v1?model=m&timeout_s=ten",
            {},
            "KEYLANE_PROVIDER: timeout_s='ten' is not a number; e.g. timeout_s=60.0",
        ),
        (
            "openai+http://localhost/v1?model=m&max_attempts=0",
            {},
            "KEYLANE_PROVIDER: max_attempts=0 must be at least 1",
        ),
        ("openai+http://localhost/v1?model=a&model=b", {}, "KEYLANE_PROVIDER: option 'model' is given twice"),
        (
            "openai+http:///v1?model=m",
            {},
            "KEYLANE_PROVIDER: 'openai+http:///v1?model=m' has no host; "
            "e.g. openai+http://localhost:8000/v1?model=NAME",
        ),
        (
            "openai+http://localhost/v1?model=m&api_key_env=A&api_key_file=/k",
            {"A": "x"},
            "KEYLANE_PROVIDER: give api_key_env or api_key_file, not both",
        ),
    ],
)
def test_mistakes_say_what_to_fix(url: str, environ: dict[str, str], message: str) -> None:
    with pytest.raises(ProviderConfigError) as caught:
        parse_provider_url(url, environ)
    assert str(caught.value) == message
    assert isinstance(caught.value, ConfigError)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "url",
    [
        "openai+https://api.openai.com/v1?model=m&api_key=sk-live-abc",
        "anthropic+https://api.anthropic.com?model=c&key=ak-live",
        "openai+https://sk-live-abc@api.openai.com/v1?model=m",
        "openai+https://user:sk-live-abc@api.openai.com/v1?model=m",
    ],
)
def test_a_literal_key_is_refused(url: str) -> None:
    with pytest.raises(ProviderConfigError) as caught:
        parse_provider_url(url, {})
    assert "an API key must not be written in the URL" in str(caught.value)
    assert "api_key_env=NAME" in str(caught.value)
    assert "live" not in str(caught.value)


def test_key_file_problems(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(
        ProviderConfigError, match=re.escape(f"api_key_file={missing}") + " cannot be read .*check the path"
    ):
        parse_provider_url(f"openai+http://h/v1?model=m&api_key_file={missing}", {})
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(
        ProviderConfigError, match=re.escape(f"api_key_file={empty} is empty; write the API key into it")
    ):
        parse_provider_url(f"openai+http://h/v1?model=m&api_key_file={empty}", {})


def test_the_setting_name_is_configurable() -> None:
    with pytest.raises(ProviderConfigError, match=r"^AGENT_X_PROVIDER: unknown scheme"):
        parse_provider_url("nope://x", {}, setting="AGENT_X_PROVIDER")
