"""A record whose processing keeps raising is retried a bounded number of times, then
dead-lettered, and counts as finished: it never wedges its partition."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from keylane.kafka import lane_feed
from keylane.kafka.lane_feed import POISON_ATTEMPTS, _handle_or_dead_letter


def an_event() -> Any:
    return SimpleNamespace(message=SimpleNamespace(topic="t.agent.events", partition=3, offset=17))


@pytest.fixture(autouse=True)
def no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lane_feed, "POISON_BACKOFF_S", 0.0)


async def test_a_record_that_always_fails_is_dead_lettered_once_after_bounded_attempts() -> None:
    attempts: list[int] = []
    dead: list[tuple[Any, Exception]] = []

    async def handle(event: Any) -> None:
        attempts.append(event.message.offset)
        raise TypeError("compare_digest() on non-ASCII str")

    async def on_poison(event: Any, exc: Exception) -> None:
        dead.append((event, exc))

    event = an_event()
    await _handle_or_dead_letter(event, handle, on_poison)  # returns: the record is finished

    assert attempts == [17] * POISON_ATTEMPTS
    [(dead_event, exc)] = dead
    assert dead_event is event and isinstance(exc, TypeError)


async def test_a_record_that_fails_then_succeeds_is_not_dead_lettered() -> None:
    calls = 0

    async def handle(event: Any) -> None:
        nonlocal calls
        calls += 1
        if calls < POISON_ATTEMPTS:
            raise ConnectionError("transient")

    async def on_poison(event: Any, exc: Exception) -> None:
        raise AssertionError("not poison")

    await _handle_or_dead_letter(an_event(), handle, on_poison)
    assert calls == POISON_ATTEMPTS


async def test_without_a_dead_letter_hook_the_failure_propagates() -> None:
    async def handle(event: Any) -> None:
        raise ValueError("bug")

    with pytest.raises(ValueError, match="bug"):
        await _handle_or_dead_letter(an_event(), handle, None)
