"""The two places keylane reaches into Faust and aiokafka internals, each with its reason.

* Faust tables choose the RocksDB partition and the changelog partition of a read or write
  from the *current event*, a context variable Faust sets only inside its own stream
  iteration. Lane tasks run outside it, so each job sets it to the record it processes
  (``event_context``); contextvars are per task, so concurrent lanes never see each
  other's event.
* Kafka's default partitioner (Java client, aiokafka, Faust) is murmur2 on the key bytes.
  ``expected_partition`` recomputes it to spot records a client with another partitioner
  (librdkafka's default, as used by kcat) put on a different partition than their key's.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

from aiokafka.partitioner import murmur2
from faust.streams import _current_event

from service.runtime.lanes import LaneRecord, LaneScheduler

log = logging.getLogger(__name__)


@contextmanager
def event_context(event: Any) -> Iterator[None]:
    """Make ``event`` Faust's current event for table reads and writes in this task."""
    token = _current_event.set(weakref.ref(event))
    try:
        yield
    finally:
        _current_event.reset(token)


def expected_partition(key: bytes, partitions: int) -> int:
    """The partition Kafka's default (murmur2) partitioner assigns to ``key``."""
    hashed: int = murmur2(key)
    return (hashed & 0x7FFFFFFF) % partitions


async def feed_lanes(stream: Any, lanes: LaneScheduler, handle: Callable[[Any], Awaitable[None]]) -> None:
    """Hand every event of a Faust stream to ``lanes``: ``handle(event)`` runs in the record's
    lane under its event context, and the record is acked when the scheduler says so."""
    async for event in stream.noack().events():
        message = event.message

        async def work(event: Any = event) -> None:
            with event_context(event):
                await handle(event)

        async def ack(event: Any = event) -> None:
            await stream.ack(event)

        await lanes.submit(
            LaneRecord(message.topic, message.partition, message.offset, message.key), work, ack
        )
