"""Publishing keylane's records to their catalog topics: raw-bytes topics and the Publisher.

Every send goes through a ``ConfirmedTopic``: size-checked, and confirmed by the running unit
of work (service/keylane/kafka/delivery.py).
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import faust

from keylane import metrics
from keylane.catalog import ERRORS, INTENTS, OUTPUT, RESULTS, Catalog
from keylane.clock import wall_clock_ms
from keylane.kafka.delivery import ConfirmedTopic, RecordTooLarge, delivery_guard, record_size
from keylane.records import ID_HEADER, Emit, position_of, shrunk_error, too_large_emit

log = logging.getLogger(__name__)

RAW: dict[str, Any] = {
    "key_type": bytes,
    "value_type": bytes,
    "key_serializer": "raw",
    "value_serializer": "raw",
}
"""Topic arguments that make Faust pass key and value bytes through untouched."""


def raw_topic(app: faust.App, name: str) -> ConfirmedTopic:
    """A Faust topic that passes key and value bytes through untouched; its sends are
    size-checked and confirmed (service/keylane/kafka/delivery.py)."""
    return ConfirmedTopic(app, topics=[name], **RAW)


class DeliveryListener(Protocol):
    """What learns of a record's hand-off and delivery (a KeyRuntime: its key's outbox)."""

    def on_published(self, record_id: str) -> None: ...

    def on_delivered(self, record_id: str) -> None: ...


class Publisher:
    """Publishes Emits to their catalog topics and keeps the metric identities.

    A record too large for its topic (over min(the producer's max request size, the topic's
    max.message.bytes)) is never handed to the producer, where it would fail on every
    redelivery: an error record goes out with digests instead of its raw bytes
    (``shrunk_error``), anything else is replaced by its ``record_too_large`` dead letter
    (``too_large_emit``). The input record stays in its topic, whole. Once Kafka took the
    dead letter the original counts as delivered too, so it leaves the key's outbox.
    """

    def __init__(self, app: faust.App, catalog: Catalog, runtime: DeliveryListener | None = None) -> None:
        self._names = {
            logical: catalog.name(logical)
            for logical in (OUTPUT, INTENTS, ERRORS, RESULTS, "agent.approval-requests")
        }
        self._topics = {logical: raw_topic(app, name) for logical, name in self._names.items()}
        self._logical = {spec.name: spec.logical_name for spec in catalog}
        self._guard = delivery_guard(app)
        self._guard.set_limits((spec.name, spec.max_message_bytes) for spec in catalog)
        self._runtime = runtime
        metrics.zero(metrics.RECORDS_TOO_LARGE, (spec.logical_name for spec in catalog))

    def producible(self, emit: Emit) -> Emit:
        """``emit``, or the dead letter that replaces it when it is too large to produce."""
        return self._measured(emit)[0]

    def _measured(self, emit: Emit) -> tuple[Emit, int]:
        """``producible(emit)`` and its record size."""
        size = record_size(emit.key, emit.value, _headers(emit))
        limit = self._guard.limit(self._names[emit.topic])
        if size <= limit:
            return emit, size
        if emit.topic == ERRORS:
            letter = shrunk_error(emit, size=size, limit=limit)
        else:
            letter = too_large_emit(
                topic=emit.topic,
                record_id=emit.record_id,
                key=emit.key,
                value=emit.value,
                size=size,
                limit=limit,
                origin=_input_position(),
                now_ms=wall_clock_ms(),
            )
        metrics.RECORDS_TOO_LARGE.labels(emit.topic).inc()
        log.warning(
            "%s record %s is %s bytes, over its %s-byte limit: producing dead letter %s instead",
            emit.topic,
            emit.record_id,
            size,
            limit,
            letter.record_id,
        )
        return letter, record_size(letter.key, letter.value, _headers(letter))

    async def publish(self, emit: Emit) -> None:
        """Hand one record (or its dead letter, see the class docstring) to the producer.
        Inside ``confirming`` the block waits for Kafka to confirm it; the key's outbox
        learns of the delivery through the callback."""
        sent, size = self._measured(emit)
        runtime = self._runtime
        record_ids = {emit.record_id, sent.record_id}
        if runtime is not None:
            for record_id in record_ids:
                runtime.on_published(record_id)

        def delivered(_: Any) -> None:
            if runtime is not None:
                for record_id in record_ids:
                    runtime.on_delivered(record_id)

        await self._topics[sent.topic].send_sized(
            size, key=sent.key, value=sent.value, headers=_headers(sent), callback=delivered
        )
        _count(sent)

    async def refuse(self, refused: RecordTooLarge) -> None:
        """Publish the ``record_too_large`` dead letter of a copy (a re-routed record, a
        sharded event) that was too large to produce."""
        logical = self._logical.get(refused.topic, refused.topic)
        log.warning(
            "a %s copy is %s bytes, over its %s-byte limit: producing its dead letter instead",
            logical,
            refused.size,
            refused.limit,
        )
        metrics.RECORDS_TOO_LARGE.labels(logical).inc()
        letter = too_large_emit(
            topic=logical,
            record_id=None,
            key=refused.key,
            value=refused.value,
            size=refused.size,
            limit=refused.limit,
            origin=_input_position(),
            now_ms=wall_clock_ms(),
        )
        await self.publish(letter)


def _headers(emit: Emit) -> list[tuple[str, bytes]]:
    return [(ID_HEADER, emit.record_id.encode())]


def _input_position() -> tuple[str, int, int] | None:
    """(topic, partition, offset) of the input record the running lane job processes."""
    event = faust.current_event()
    return None if event is None else position_of(event.message)


def _count(emit: Emit) -> None:
    if emit.topic == INTENTS:
        metrics.INTENTS_EMITTED.inc()
    elif emit.topic == OUTPUT:
        metrics.OUTPUTS.inc()
    elif emit.topic == ERRORS:
        if emit.orphan_detail is not None:
            metrics.ORPHANED_RESULTS.labels(emit.orphan_detail).inc()
        else:
            metrics.AGENT_ERRORS.labels(emit.error_reason or "unknown").inc()
