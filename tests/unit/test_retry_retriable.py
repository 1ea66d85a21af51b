"""retry_retriable: a retriable Kafka error is asked again until it heals or its time runs out
(then BrokerUnavailable, one line); any other error is raised as it came."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
from aiokafka.errors import NodeNotReadyError, TopicAuthorizationFailedError

from keylane.errors import BrokerUnavailable
from keylane.kafka.topic_admin import retry_retriable


def failing(
    errors: list[Exception], answer: str = "answer"
) -> tuple[Callable[[], Awaitable[str]], list[int]]:
    calls: list[int] = []

    async def call() -> str:
        calls.append(1)
        if errors:
            raise errors.pop(0)
        return answer

    return call, calls


def test_a_retriable_error_that_heals_returns_the_answer() -> None:
    call, calls = failing([NodeNotReadyError(3), NodeNotReadyError(3)])
    assert asyncio.run(retry_retriable(call, timeout_s=5)) == "answer"
    assert len(calls) == 3


def test_a_retriable_error_that_outlasts_the_time_is_one_line() -> None:
    call, calls = failing([NodeNotReadyError(3)] * 100)
    with pytest.raises(BrokerUnavailable) as raised:
        asyncio.run(retry_retriable(call, timeout_s=0.5))
    assert len(calls) >= 2
    assert str(raised.value).startswith("Kafka kept answering NodeNotReadyError: 3 for 0.5 s: ")
    assert "\n" not in str(raised.value)
    assert isinstance(raised.value.__cause__, NodeNotReadyError)


def test_an_error_that_is_not_retriable_is_raised_at_once() -> None:
    call, calls = failing([TopicAuthorizationFailedError()])
    with pytest.raises(TopicAuthorizationFailedError):
        asyncio.run(retry_retriable(call, timeout_s=5))
    assert len(calls) == 1
