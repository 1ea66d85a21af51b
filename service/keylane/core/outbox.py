"""A key's outbox: the records its inputs produced, kept in its state until Kafka confirmed
them, and published again when an input at or below the key's applied offset for its stream
is delivered again."""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

from msgspec.structs import replace as struct_replace

from keylane.core.state import KeyState, OutboxRecord
from keylane.records import Emit, InputRecord
from keylane.wire import ErrorReason

MAX_TRACKED = 100_000
"""How many delivered ids a Deliveries remembers before it starts over (which only delays
pruning: an entry stays in its outbox until a redelivery proves it)."""


class Deliveries:
    """What this process handed to the producer and what Kafka confirmed, by record id: which
    outbox entries are settled and may leave their key's outbox at its next commit."""

    def __init__(self) -> None:
        self._in_flight: set[str] = set()
        self._delivered: set[str] = set()

    def published(self, record_id: str) -> None:
        """A record was handed to the producer; its outbox entry stays until delivery."""
        self._in_flight.add(record_id)

    def delivered(self, record_id: str) -> None:
        """The producer confirmed a record; its outbox entry goes at the key's next commit."""
        self._in_flight.discard(record_id)
        if len(self._delivered) > MAX_TRACKED:
            self._delivered.clear()  # only delays pruning: entries stay until redelivery proves them
        self._delivered.add(record_id)

    def settled(self, entry: OutboxRecord, record: InputRecord) -> bool:
        """Whether ``entry`` may leave the outbox when ``record`` commits.

        It may when this process saw it delivered, or when it was not published by this
        process and its input came earlier in the same identity stream: this process read the
        stream past it without redelivering it, so that input's offset was committed, and
        Faust flushes the producer before every offset commit.
        """
        if entry.record_id in self._delivered:
            return True
        if entry.record_id in self._in_flight:
            return False
        stream, offset = record.identity
        if entry.origin_stream:
            return entry.origin_stream == stream and entry.origin_offset < offset
        return record.origin is None and entry.origin_topic == record.topic and entry.origin_offset < offset

    def forget(self, replaced: Iterable[OutboxRecord]) -> None:
        """The outbox holding ``replaced`` was committed over: their delivered ids are no longer needed."""
        delivered = self._delivered
        for entry in replaced:  # a loop: an outbox holds a record or two, and a generator costs more
            delivered.discard(entry.record_id)


def staged(
    state: KeyState, record: InputRecord, emits: list[Emit], deliveries: Deliveries
) -> list[OutboxRecord]:
    """``state``'s outbox with ``record``'s ``emits`` staged and the settled entries dropped.
    Pure: ``deliveries`` forgets nothing until the caller commits the result."""
    # Loops, not comprehensions: every commit stages, usually one or two records, and a
    # comprehension is a function call of its own on Python 3.11.
    outbox = []
    for entry in state.outbox:
        if not deliveries.settled(entry, record):
            outbox.append(entry)
    stream, offset = record.identity
    topic = record.topic
    for e in emits:
        outbox.append(
            OutboxRecord(
                record_id=e.record_id,
                topic=e.topic,
                key=e.key,
                value=e.value,
                origin_topic=topic,
                origin_offset=offset,
                origin_stream=stream,
                label=e.error_reason,
            )
        )
    return outbox


def republished(state: KeyState, record: InputRecord) -> list[Emit]:
    """The records a redelivered ``record`` (any copy of it) produced, to publish again."""
    return [_emit_of(e) for e in state.outbox if _from_input(e, record)]


def applied_offset(state: KeyState, record: InputRecord) -> int | None:
    """The last offset the key applied from ``record``'s identity stream, if any."""
    stream, _ = record.identity
    last = state.applied.get(stream)
    if last is None and record.origin is None:
        last = state.applied.get(record.topic)  # a blob from before identity streams
    return last


def applied_with(state: KeyState, record: InputRecord) -> dict[str, int]:
    """``state.applied`` with ``record`` applied (replacing a pre-stream entry of its topic)."""
    stream, offset = record.identity
    applied = dict(state.applied)
    if record.origin is None:
        applied.pop(record.topic, None)
    applied[stream] = offset
    return applied


def forget_stream(state: KeyState, record: InputRecord) -> KeyState:
    """``state`` with nothing applied from ``record``'s stream (its topic was recreated)."""
    stream, _ = record.identity
    applied = {k: v for k, v in state.applied.items() if k not in (stream, record.topic)}
    return struct_replace(state, applied=applied)


def _from_input(entry: OutboxRecord, record: InputRecord) -> bool:
    """Whether an outbox entry was staged by ``record`` (any copy of it)."""
    stream, offset = record.identity
    if entry.origin_stream:
        return entry.origin_stream == stream and entry.origin_offset == offset
    return record.origin is None and entry.origin_topic == record.topic and entry.origin_offset == offset


def _emit_of(record: OutboxRecord) -> Emit:
    return Emit(
        record_id=record.record_id,
        topic=record.topic,
        key=record.key,
        value=record.value,
        # Written from Emit.error_reason; a blob keeps it as text, read only as a metric label.
        error_reason=cast("ErrorReason | None", record.label),
    )
