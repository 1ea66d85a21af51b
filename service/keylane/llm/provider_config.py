"""Which model provider a worker uses, from one URL (``KEYLANE_PROVIDER``).

Forms (the query string carries the options)::

    openai+http://localhost:8000/v1?model=Qwen/Qwen2.5-7B-Instruct
    openai+https://api.openai.com/v1?model=gpt-4o-mini&api_key_env=OPENAI_API_KEY
    anthropic+https://api.anthropic.com?model=claude-sonnet-4-5&api_key_env=ANTHROPIC_API_KEY
    fake://?reply=hello&latency_ms=20

An API key is never written in the URL (it would end up in logs and process listings): it
is read from the environment variable named by ``api_key_env`` or from the file named by
``api_key_file``, once, when the URL is parsed. Every mistake raises ProviderConfigError
with one line that says what to change.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Literal, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit

from keylane.errors import ConfigError
from keylane.llm.anthropic import AnthropicProvider
from keylane.llm.fake import FakeLLM, match_any, respond_with
from keylane.llm.http_provider import DEFAULT_CONNECT_TIMEOUT_S, DEFAULT_TIMEOUT_S
from keylane.llm.openai import OpenAIProvider
from keylane.llm.resilience import (
    CircuitBreaker,
    ResilientProvider,
    RetryHook,
    RetryPolicy,
    StateHook,
)
from keylane.llm.types import Provider

ProviderKind = Literal["openai", "anthropic", "fake"]
_SCHEMES: dict[str, tuple[ProviderKind, str]] = {
    "openai+http": ("openai", "http"),
    "openai+https": ("openai", "https"),
    "anthropic+http": ("anthropic", "http"),
    "anthropic+https": ("anthropic", "https"),
    "fake": ("fake", ""),
}
_COMMON = frozenset(
    {"timeout_s", "connect_timeout_s", "max_attempts", "breaker_failures", "breaker_cooldown_s"}
)
_OPTIONS: dict[ProviderKind, frozenset[str]] = {
    "openai": _COMMON | {"model", "api_key_env", "api_key_file"},
    "anthropic": _COMMON | {"model", "api_key_env", "api_key_file", "max_tokens"},
    "fake": _COMMON | {"model", "reply", "latency_ms"},
}
_LITERAL_KEYS = frozenset({"api_key", "apikey", "key", "token", "password", "secret"})
_NO_LITERAL_KEY = (
    "an API key must not be written in the URL (it would end up in logs and process listings); "
    "put it in an environment variable and add api_key_env=NAME, or in a file and add api_key_file=PATH"
)

_T = TypeVar("_T", int, float)


class ProviderConfigError(ConfigError):
    """The provider URL is wrong; the one-line message says what to change."""


@dataclass(frozen=True, kw_only=True)
class ProviderSettings:
    """A parsed provider URL: everything needed to build the Provider, key included.

    The key is kept out of ``repr``; log :meth:`redacted` instead of the URL.
    """

    kind: ProviderKind
    base_url: str
    """``http(s)://host[:port][/path]`` without the trailing slash; empty for fake."""
    model: str
    api_key: str | None = field(default=None, repr=False)
    api_key_source: str = ""
    """Where the key came from: ``api_key_env=NAME``, ``api_key_file=PATH`` or empty."""
    timeout_s: float = DEFAULT_TIMEOUT_S
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    max_attempts: int = 4
    breaker_failures: int = 5
    breaker_cooldown_s: float = 30.0
    max_tokens: int = 1024
    """Anthropic's ``max_tokens`` when a request does not set one."""
    reply: str = "ok"
    """fake: the payload every request is answered with."""
    latency_ms: float = 0.0
    """fake: how long each answer takes."""

    def build(
        self, *, on_retry: RetryHook | None = None, on_state_change: StateHook | None = None
    ) -> ResilientProvider:
        """The configured provider wrapped in a ResilientProvider (retries and breaker); the
        hooks are ResilientProvider's."""
        inner: Provider
        if self.kind == "openai":
            inner = OpenAIProvider(
                self.base_url,
                self.model,
                api_key=self.api_key,
                timeout_s=self.timeout_s,
                connect_timeout_s=self.connect_timeout_s,
            )
        elif self.kind == "anthropic":
            inner = AnthropicProvider(
                base_url=self.base_url,
                model=self.model,
                api_key=self.api_key,
                default_max_tokens=self.max_tokens,
                timeout_s=self.timeout_s,
                connect_timeout_s=self.connect_timeout_s,
            )
        else:
            inner = FakeLLM(
                [(match_any(), respond_with(self.reply.encode(), latency_ms=self.latency_ms))],
                model=self.model,
                keep_requests=False,
            )
        return ResilientProvider(
            inner,
            retry=RetryPolicy(max_attempts=self.max_attempts),
            breaker=CircuitBreaker(
                failure_threshold=self.breaker_failures, cooldown_s=self.breaker_cooldown_s
            ),
            on_retry=on_retry,
            on_state_change=on_state_change,
        )

    def redacted(self) -> str:
        """The settings as a URL safe to log: the key's source is named, never its value."""
        options: dict[str, str] = {}
        if self.model:
            options["model"] = self.model
        if self.api_key_source:
            name, _, value = self.api_key_source.partition("=")
            options[name] = value
        if self.kind == "fake":
            options.update(reply=self.reply, latency_ms=f"{self.latency_ms:g}")
            return f"fake://?{urlencode(options)}"
        scheme, _, rest = self.base_url.partition("://")
        query = urlencode(options, safe="/")
        return f"{self.kind}+{scheme}://{rest}" + (f"?{query}" if query else "")


def parse_provider_url(
    url: str, environ: Mapping[str, str] = os.environ, *, setting: str = "KEYLANE_PROVIDER"
) -> ProviderSettings:
    """Parse a provider URL (forms in the module docstring); ``setting`` names it in errors."""

    def fail(problem: str) -> ProviderConfigError:
        return ProviderConfigError(f"{setting}: {problem}")

    url = url.strip()
    forms = "use openai+http(s)://, anthropic+http(s):// or fake://"
    if not url:
        raise fail(f"is empty; {forms}")
    parts = urlsplit(url)
    if parts.scheme not in _SCHEMES:
        raise fail(f"unknown scheme {parts.scheme!r}; {forms}" if parts.scheme else f"no scheme; {forms}")
    kind, http_scheme = _SCHEMES[parts.scheme]
    if parts.username or parts.password:
        raise fail(_NO_LITERAL_KEY)
    options: dict[str, str] = {}
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name.lower() in _LITERAL_KEYS:
            raise fail(_NO_LITERAL_KEY)
        if name not in _OPTIONS[kind]:
            raise fail(f"unknown option {name!r} for {kind}; known: {', '.join(sorted(_OPTIONS[kind]))}")
        if name in options:
            raise fail(f"option {name!r} is given twice")
        options[name] = value

    def number(name: str, convert: Callable[[str], _T], default: _T, *, minimum: _T) -> _T:
        if name not in options:
            return default
        try:
            value = convert(options[name])
        except ValueError:
            raise fail(f"{name}={options[name]!r} is not a number; e.g. {name}={default}") from None
        if value < minimum:
            raise fail(f"{name}={options[name]} must be at least {minimum}")
        return value

    common = ProviderSettings(
        kind=kind,
        base_url="",
        model=options.get("model", ""),
        timeout_s=number("timeout_s", float, DEFAULT_TIMEOUT_S, minimum=0.001),
        connect_timeout_s=number("connect_timeout_s", float, DEFAULT_CONNECT_TIMEOUT_S, minimum=0.001),
        max_attempts=number("max_attempts", int, 4, minimum=1),
        breaker_failures=number("breaker_failures", int, 5, minimum=1),
        breaker_cooldown_s=number("breaker_cooldown_s", float, 30.0, minimum=0.0),
    )
    if kind == "fake":
        return replace(
            common,
            reply=options.get("reply", "ok"),
            latency_ms=number("latency_ms", float, 0.0, minimum=0.0),
        )

    if not parts.hostname:
        raise fail(f"{url!r} has no host; e.g. {parts.scheme}://localhost:8000/v1?model=NAME")
    try:
        parts.port  # noqa: B018 - urllib validates the port lazily
    except ValueError:
        raise fail(f"{url!r} has a port that is not a number from 0 to 65535") from None
    if not common.model:
        raise fail(f"{kind} needs a model; add ?model=NAME to the URL")
    api_key, source = _api_key(options, environ, fail)
    if kind == "anthropic" and http_scheme == "https" and not api_key:
        raise fail("anthropic+https needs an API key; add api_key_env=ANTHROPIC_API_KEY or api_key_file=PATH")
    return replace(
        common,
        base_url=f"{http_scheme}://{parts.netloc}{parts.path}".rstrip("/"),
        api_key=api_key,
        api_key_source=source,
        max_tokens=number("max_tokens", int, 1024, minimum=1),
    )


def _api_key(
    options: Mapping[str, str], environ: Mapping[str, str], fail: Callable[[str], ProviderConfigError]
) -> tuple[str | None, str]:
    env_name, path = options.get("api_key_env"), options.get("api_key_file")
    if env_name is not None and path is not None:
        raise fail("give api_key_env or api_key_file, not both")
    if env_name is not None:
        if not env_name:
            raise fail("api_key_env is empty; name an environment variable, e.g. api_key_env=OPENAI_API_KEY")
        key = environ.get(env_name, "").strip()
        if not key:
            raise fail(f"api_key_env={env_name} is not set in the environment (or is empty); export it")
        return key, f"api_key_env={env_name}"
    if path is not None:
        try:
            with open(path, encoding="utf-8") as file:
                key = file.read().strip()
        except OSError as exc:
            reason = exc.strerror or str(exc)
            raise fail(f"api_key_file={path} cannot be read ({reason}); check the path") from None
        if not key:
            raise fail(f"api_key_file={path} is empty; write the API key into it")
        return key, f"api_key_file={path}"
    return None, ""
