"""Feeds a Faust stream's records into keylane's lanes, each job under its record's event context.

* Faust tables choose the RocksDB partition and the changelog partition of a read or write
  from the *current event*, a context variable Faust sets only inside its own stream
  iteration. Lane tasks run outside it, so each job sets it to the record it processes
  (``event_context``); contextvars are per task, so concurrent lanes never see each
  other's event.
* With the app's offsets guarded (service/keylane/kafka/offset_guard.py), only records the
  ledger admits reach the lanes, strictly in offset order.
* A record whose processing raises is retried POISON_ATTEMPTS times, then handed to the
  caller's ``on_poison`` (a dead letter) and finished, so one bad record never wedges its
  partition and is never retried forever.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

from faust.streams import _current_event  # Faust's private variable: see service/keylane/kafka/patches.py

from keylane import metrics
from keylane.core.lanes import LaneRecord, LaneScheduler, Superseded
from keylane.core.offsets import Admission
from keylane.kafka.delivery import ProduceFailed
from keylane.kafka.offset_guard import guard_of

log = logging.getLogger(__name__)

POISON_ATTEMPTS = 3
POISON_BACKOFF_S = 0.2
Poison = Callable[[Any, Exception], Awaitable[None]]
Handle = Callable[[Any], Awaitable[None]]


@contextmanager
def event_context(event: Any) -> Iterator[None]:
    """Make ``event`` Faust's current event for table reads and writes in this task."""
    token = _current_event.set(weakref.ref(event))
    try:
        yield
    finally:
        _current_event.reset(token)


async def _handle_or_dead_letter(event: Any, handle: Handle, on_poison: Poison | None) -> None:
    """``handle(event)``, retried on an unexpected exception; after POISON_ATTEMPTS failures
    ``on_poison(event, exc)`` dead-letters it and the record counts as finished."""
    for attempt in range(1, POISON_ATTEMPTS + 1):
        try:
            await handle(event)
            return
        except (ProduceFailed, Superseded):
            raise  # the record is not this worker's to finish: no retry, no dead letter
        except Exception as exc:
            message = event.message
            if on_poison is None:
                raise
            if attempt < POISON_ATTEMPTS:
                log.warning(
                    "%s/%s/%s failed (attempt %s of %s); retrying",
                    message.topic,
                    message.partition,
                    message.offset,
                    attempt,
                    POISON_ATTEMPTS,
                    exc_info=True,
                )
                await asyncio.sleep(POISON_BACKOFF_S * attempt)
                continue
            log.exception(
                "%s/%s/%s failed %s times; dead-lettering it and moving on",
                message.topic,
                message.partition,
                message.offset,
                POISON_ATTEMPTS,
            )
            metrics.POISON_RECORDS.labels(metrics.topic_label(message.topic)).inc()
            await on_poison(event, exc)


async def feed_lanes(
    stream: Any,
    lanes: LaneScheduler,
    handle: Handle,
    *,
    on_poison: Poison | None = None,
) -> None:
    """Hand every event of a Faust stream to ``lanes``: ``handle(event)`` runs in the record's
    lane under its event context, and the record is acked when the scheduler says so. With
    ``on_poison``, a record whose handling keeps raising is dead-lettered through it (see
    the module docstring); without, a raise stops the lanes.

    When the app's offsets are guarded (``guard_offsets``), only records the ledger admits
    reach the lanes, and the ledger learns of each finished record in offset order.
    """
    guard = guard_of(stream.app)
    if guard is not None:
        lanes.set_window_hooks(guard.window_hooks)  # pause a full partition, not the dispatcher
        if lanes not in guard.lanes:
            guard.lanes.append(lanes)  # revocations settle its records
    async for event in stream.noack().events():
        message = event.message
        tp = (message.topic, message.partition)
        if guard is not None and guard.governs(message.topic):
            admission = guard.ledger.admit(tp, message.offset)
            if admission is Admission.GAP and await guard.resolve_gap(tp, message.offset):
                admission = guard.ledger.admit(tp, message.offset)
            if admission is not Admission.PROCESS:
                await stream.ack(event)  # Faust's unacked bookkeeping only; the ledger commits
                continue

        async def work(event: Any = event) -> None:
            with event_context(event):
                await _handle_or_dead_letter(event, handle, on_poison)

        async def ack(event: Any = event, tp: tuple[str, int] = tp) -> None:
            if guard is not None:
                guard.ledger.finished(tp, event.message.offset)
            await stream.ack(event)

        async def release(event: Any = event) -> None:
            await stream.ack(event)  # Faust's bookkeeping only: the ledger never commits it

        await lanes.submit(
            LaneRecord(message.topic, message.partition, message.offset, message.key), work, ack, release
        )


def lane_agent(
    app: Any,
    source: Any,
    *,
    name: str,
    lanes: LaneScheduler,
    handle: Handle,
    on_poison: Poison | None = None,
) -> None:
    """Add a Faust agent ``name`` to ``app`` that feeds every record of ``source`` (a topic)
    into ``lanes`` (``feed_lanes``)."""

    async def consume(stream: Any) -> None:
        await feed_lanes(stream, lanes, handle, on_poison=on_poison)

    app.agent(source, name=name)(consume)
