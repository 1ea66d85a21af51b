"""FakeLLM: an offline, scripted model provider for tests, examples and benchmarks.

Rules are tried in order; the first whose matcher accepts the request answers it. A request
no rule matches raises UnmatchedRequest: a test never gets an answer it did not script
(fail closed).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from keylane.llm.types import LlmRequest, LlmResponse, ProviderError, canonical_json

Matcher = Callable[[LlmRequest], bool]
Responder = Callable[[LlmRequest, int], Awaitable[LlmResponse]]


class UnmatchedRequest(ProviderError):
    """No FakeLLM rule matched the request."""


class ScriptedFailure(ProviderError):
    """The failure a ``raise_error`` or ``fail_then_succeed`` rule was scripted to raise."""


def match_any() -> Matcher:
    """Matches every request."""
    return lambda request: True


def match_model_id(model_id: str) -> Matcher:
    """Matches requests for exactly this model id."""
    return lambda request: request.model_id == model_id


def match_contains(text: str) -> Matcher:
    """Matches requests where one of the messages contains ``text``.

    A string message is searched as it is; any other message as its JSON text. The model
    id, tools schema and sampling parameters are not searched.
    """

    def matches(request: LlmRequest) -> bool:
        return any(
            text in (message if isinstance(message, str) else canonical_json(message).decode())
            for message in request.messages
        )

    return matches


def respond_with(
    payload: bytes, *, latency_ms: float = 0, prompt_tokens: int = 0, completion_tokens: int = 0
) -> Responder:
    """Answer ``payload`` after ``latency_ms`` (an asyncio sleep, like a real network wait)."""

    async def respond(request: LlmRequest, attempt: int) -> LlmResponse:
        if latency_ms:
            await asyncio.sleep(latency_ms / 1000)
        return LlmResponse(
            response=payload,
            model_id=request.model_id,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
        )

    return respond


def raise_error(error: Exception | str = "scripted provider failure") -> Responder:
    """Raise ``error`` (a message becomes a ScriptedFailure) on every matching call."""

    async def respond(request: LlmRequest, attempt: int) -> LlmResponse:
        raise error if isinstance(error, Exception) else ScriptedFailure(error)

    return respond


def fail_then_succeed(failures: int, payload: bytes, *, latency_ms: float = 0) -> Responder:
    """Raise ScriptedFailure on the first ``failures`` matching calls, then answer ``payload``."""
    succeed = respond_with(payload, latency_ms=latency_ms)

    async def respond(request: LlmRequest, attempt: int) -> LlmResponse:
        if attempt < failures:
            raise ScriptedFailure(f"scripted failure {attempt + 1} of {failures}")
        return await succeed(request, attempt)

    return respond


@dataclass
class _Rule:
    matcher: Matcher
    responder: Responder
    calls: int = 0


class FakeLLM:
    """A Provider answering from ``rules``: ``FakeLLM([(match_any(), respond_with(b"ok"))])``.

    ``call_count`` counts requests that reached the fake (replay-cache hits never do);
    ``requests`` keeps them in order, unless ``keep_requests`` is False: a service configured
    with ``KEYLANE_PROVIDER=fake://`` runs as long as a real one, and would hold every request
    it ever answered. ``model`` is the model a request without a ``model_id`` is counted
    under in the metrics.
    """

    name = "fake"

    def __init__(
        self, rules: Sequence[tuple[Matcher, Responder]], *, model: str = "", keep_requests: bool = True
    ) -> None:
        self._rules = [_Rule(matcher, responder) for matcher, responder in rules]
        self.requests: list[LlmRequest] = []
        self.model = model
        self._keep_requests = keep_requests
        self._calls = 0

    @property
    def call_count(self) -> int:
        # len(requests) while they are kept: a subclass's own complete() appends to them.
        return len(self.requests) if self._keep_requests else self._calls

    async def complete(self, request: LlmRequest) -> LlmResponse:
        if self._keep_requests:
            self.requests.append(request)
        else:
            self._calls += 1
        for rule in self._rules:
            if rule.matcher(request):
                attempt = rule.calls
                rule.calls += 1
                return await rule.responder(request, attempt)
        raise UnmatchedRequest(f"no FakeLLM rule matches a request for model {request.model_id!r}")
