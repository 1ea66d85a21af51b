"""What a real model provider can fail with, by what the caller should do about it.

Every class is a :class:`~keylane.llm.types.ProviderError`, so code that caught provider
failures before keeps catching them. The ``retriable`` flag is the contract
:class:`~keylane.llm.resilience.ResilientProvider` acts on:

* retriable: :class:`RateLimitError` (429), :class:`ServerError` (5xx),
  :class:`ProviderTimeout` (408, connect/read/write/pool timeouts) and
  :class:`ProviderUnavailable` (the connection could not be made or broke);
* not retriable: :class:`ProviderRequestError` (the request or the response is wrong: a 4xx,
  a body that is not the provider's format) and :class:`CircuitOpen` (this call was refused
  without contacting the provider; the breaker says when it will try again).
"""

from __future__ import annotations

from keylane.llm.types import ProviderError


class RateLimitError(ProviderError):
    """The provider answered 429; ``retry_after_s`` is its Retry-After, when it sent one."""

    retriable = True

    def __init__(self, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ServerError(ProviderError):
    """The provider answered 5xx (``status``); a 503 may carry a Retry-After too."""

    retriable = True

    def __init__(self, message: str, *, status: int, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after_s = retry_after_s


class ProviderTimeout(ProviderError):
    """The provider did not answer in time: a connect, read, write or pool timeout, or a 408."""

    retriable = True


class ProviderUnavailable(ProviderError):
    """The provider could not be reached, or the connection broke before an answer arrived."""

    retriable = True


class ProviderRequestError(ProviderError):
    """The call cannot succeed as it is: a 4xx (other than 408/429) or an answer we cannot read.

    ``status`` is the HTTP status when there was one. Retrying the same request gives the
    same answer, so the message says what was wrong.
    """

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class CircuitOpen(ProviderError):
    """The circuit breaker is open: the call failed fast without contacting the provider.

    ``open_until`` is the ``time.monotonic()`` second at which the breaker lets one probe
    call through. Not retriable within the same call: retrying immediately would only be
    refused again.
    """

    def __init__(self, message: str, *, open_until: float) -> None:
        super().__init__(message)
        self.open_until = open_until


RETRIABLE_ERRORS: tuple[type[ProviderError], ...] = (
    RateLimitError,
    ServerError,
    ProviderTimeout,
    ProviderUnavailable,
)
"""The errors ResilientProvider retries (``keylane_llm_retries_total{error}``)."""
PROVIDER_ERRORS: tuple[type[ProviderError], ...] = (*RETRIABLE_ERRORS, ProviderRequestError, CircuitOpen)
"""Every error a real provider call fails with (``keylane_llm_errors_total{error}``)."""
