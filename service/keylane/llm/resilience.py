"""Retries with backoff, a circuit breaker and a call deadline around any Provider.

:class:`ResilientProvider` runs one ``complete`` call as, in order:

1. ask the breaker; an open breaker fails the call at once with CircuitOpen;
2. call the inner provider; a success closes the breaker and is returned;
3. an error whose class is not ``retriable`` (ProviderRequestError, any non-provider
   exception) is raised at once (an HTTP 4xx counts as a breaker success: the provider is
   up); a retriable one counts as a breaker failure;
4. after the last attempt, or when the wait before the next one would end past
   ``CALL_DEADLINE``, or when the provider asks for a longer wait than
   ``RetryPolicy.max_retry_after_s``, the last error is raised;
5. otherwise wait (full-jitter exponential backoff, at least the provider's Retry-After)
   and go back to 1.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Literal

from keylane.llm.errors import CircuitOpen, ProviderRequestError, RateLimitError, ServerError
from keylane.llm.types import LlmRequest, LlmResponse, Provider, ProviderError, provider_name

log = logging.getLogger(__name__)

CALL_DEADLINE: ContextVar[float | None] = ContextVar("keylane_call_deadline", default=None)
"""The absolute ``time.monotonic()`` second by which the current model call must be over.

The runtime sets it to the activation's deadline; ResilientProvider never waits past it.
None (the default) means no deadline.
"""

BreakerState = Literal["closed", "open", "half_open"]
RetryHook = Callable[[ProviderError, float], None]
StateHook = Callable[[BreakerState, BreakerState], None]


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """How many attempts a call gets and how long to wait between them.

    The wait before retry ``n`` (0 for the first retry) is
    ``jitter(0, min(max_delay_s, base_delay_s * 2**n))`` ("full jitter"), raised to the
    provider's Retry-After when it sent one. A Retry-After above ``max_retry_after_s`` is
    not waited for: the error is raised, since the activation could not finish in time.
    """

    max_attempts: int = 4
    base_delay_s: float = 0.2
    max_delay_s: float = 10.0
    max_retry_after_s: float = 60.0
    jitter: Callable[[float, float], float] = random.uniform

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"RetryPolicy.max_attempts must be >= 1, got {self.max_attempts}")
        if self.base_delay_s < 0 or self.max_delay_s < 0:
            raise ValueError("RetryPolicy delays must not be negative")

    def backoff_s(self, retry: int) -> float:
        """The jittered wait before retry number ``retry`` (0-based), ignoring Retry-After."""
        return self.jitter(0.0, min(self.max_delay_s, self.base_delay_s * 2**retry))


class CircuitBreaker:
    """Fails calls fast while the provider is failing, and probes it once it may be back.

    * closed: calls pass; ``failure_threshold`` consecutive retriable failures open it;
    * open: calls raise CircuitOpen for ``cooldown_s`` (read from ``clock``);
    * half_open: after the cooldown the next call is the one probe; calls made while it is
      in flight raise CircuitOpen. Its success closes the breaker, its retriable failure
      opens it for another cooldown; any other outcome leaves it half open for a new probe.

    ``state`` changes only when a call arrives or finishes (the cooldown ending does not by
    itself move it to half_open). One breaker serves one provider instance, shared by all
    keys of a worker; asyncio runs its methods without interleaving.
    """

    def __init__(
        self,
        *,
        failure_threshold: int = 5,
        cooldown_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        on_state_change: StateHook | None = None,
    ) -> None:
        if failure_threshold < 1:
            raise ValueError(f"CircuitBreaker.failure_threshold must be >= 1, got {failure_threshold}")
        if cooldown_s < 0:
            raise ValueError(f"CircuitBreaker.cooldown_s must not be negative, got {cooldown_s}")
        self.failure_threshold = failure_threshold
        self.cooldown_s = cooldown_s
        self._clock = clock
        self._hooks: list[StateHook] = [on_state_change] if on_state_change else []
        self._state: BreakerState = "closed"
        self._failures = 0
        self._open_until = 0.0
        self._probing = False

    @property
    def state(self) -> BreakerState:
        """``"closed"``, ``"open"`` or ``"half_open"``."""
        return self._state

    @property
    def consecutive_failures(self) -> int:
        """Retriable failures since the last success."""
        return self._failures

    def add_listener(self, hook: StateHook) -> None:
        """Call ``hook(old, new)`` on every state change (for a metric or a log line)."""
        self._hooks.append(hook)

    def before_call(self) -> None:
        """Admit a call, or raise CircuitOpen. An admitted half-open call is the probe."""
        if self._state == "open":
            now = self._clock()
            if now < self._open_until:
                raise CircuitOpen(
                    f"circuit breaker open after {self._failures} consecutive provider failures; "
                    f"next probe in {self._open_until - now:.1f}s",
                    open_until=self._open_until,
                )
            self._set("half_open")
        if self._state == "half_open":
            if self._probing:
                raise CircuitOpen(
                    "circuit breaker half open: a probe call is in flight", open_until=self._open_until
                )
            self._probing = True

    def record_success(self) -> None:
        """The admitted call got an answer (a non-retriable error counts: the provider is up)."""
        self._probing = False
        self._failures = 0
        if self._state != "closed":
            self._set("closed")

    def record_failure(self) -> None:
        """The admitted call failed with a retriable error."""
        self._probing = False
        self._failures += 1
        if self._state == "half_open" or self._failures >= self.failure_threshold:
            self._open_until = self._clock() + self.cooldown_s
            if self._state != "open":
                self._set("open")

    def record_abandoned(self) -> None:
        """The admitted call ended with no verdict (cancelled, or a bug in the provider)."""
        self._probing = False

    def _set(self, new: BreakerState) -> None:
        old, self._state = self._state, new
        level = logging.WARNING if new == "open" else logging.INFO
        log.log(level, "model provider circuit breaker: %s -> %s", old, new)
        for hook in self._hooks:
            hook(old, new)


class ResilientProvider:
    """A Provider that retries, backs off, fails fast and respects ``CALL_DEADLINE``.

    ``on_retry(error, delay_s)`` runs before each wait and ``on_state_change(old, new)`` on
    each breaker transition (plain callables, for metrics). ``sleep`` and ``clock`` are
    injectable for tests; ``clock`` must tick like ``time.monotonic`` since CALL_DEADLINE
    is read against it.
    """

    def __init__(
        self,
        inner: Provider,
        *,
        retry: RetryPolicy | None = None,
        breaker: CircuitBreaker | None = None,
        on_retry: RetryHook | None = None,
        on_state_change: StateHook | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.inner = inner
        self.retry = retry or RetryPolicy()
        self.breaker = breaker or CircuitBreaker()
        if on_state_change is not None:
            self.breaker.add_listener(on_state_change)
        self._on_retry = on_retry
        self._sleep = sleep
        self._clock = clock

    def __repr__(self) -> str:
        return f"ResilientProvider({self.inner!r}, breaker={self.breaker.state})"

    @property
    def name(self) -> str:
        """The inner provider's name (``provider_name``), for metrics."""
        return provider_name(self.inner)

    @property
    def model(self) -> str:
        """The model the inner provider is configured with ("" when it has none), for metrics."""
        model = getattr(self.inner, "model", None)
        return model if isinstance(model, str) else ""

    async def complete(self, request: LlmRequest) -> LlmResponse:
        """Answer ``request`` through the inner provider, retrying retriable failures."""
        last_error: ProviderError | None = None
        attempts = 0
        while True:
            try:
                self.breaker.before_call()
            except CircuitOpen as exc:
                raise exc from last_error
            attempts += 1
            try:
                return await self._attempt(request)
            except ProviderError as exc:
                if not exc.retriable:
                    raise
                last_error = exc
            delay = self._delay(last_error, attempts)
            if delay is None:
                raise last_error
            if self._on_retry is not None:
                self._on_retry(last_error, delay)
            log.info(
                "model call attempt %s of %s failed (%s); retrying in %.2fs",
                attempts,
                self.retry.max_attempts,
                type(last_error).__name__,
                delay,
            )
            await self._sleep(delay)

    async def _attempt(self, request: LlmRequest) -> LlmResponse:
        """One admitted call to the inner provider, its outcome reported to the breaker."""
        try:
            response = await self.inner.complete(request)
        except ProviderError as exc:
            if exc.retriable:
                self.breaker.record_failure()
            elif isinstance(exc, ProviderRequestError) and exc.status is not None:
                self.breaker.record_success()  # the provider answered; the request was wrong
            else:
                self.breaker.record_abandoned()  # e.g. refused before sending: no news of the provider
            raise
        except BaseException:
            self.breaker.record_abandoned()
            raise
        self.breaker.record_success()
        return response

    def _delay(self, error: ProviderError, attempts_made: int) -> float | None:
        """The wait before the next attempt, or None when there must be no next attempt."""
        if attempts_made >= self.retry.max_attempts:
            return None
        delay = self.retry.backoff_s(attempts_made - 1)
        hinted = error.retry_after_s if isinstance(error, RateLimitError | ServerError) else None
        if hinted is not None:
            if hinted > self.retry.max_retry_after_s:
                return None
            delay = max(delay, hinted)
        deadline = CALL_DEADLINE.get()
        if deadline is not None and self._clock() + delay > deadline:
            return None
        return delay

    async def aclose(self) -> None:
        """Close the inner provider when it has an ``aclose`` (the HTTP providers do)."""
        close = getattr(self.inner, "aclose", None)
        if close is not None:
            await close()
