"""Records in flight: an input as the broker delivered it, an output to publish, a dead letter."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from service.catalog import ERRORS
from service.runtime import ids
from service.wire import ErrorRecord, RecordOrigin, b64, encode

ID_HEADER = "keylane.id"
"""The header carrying a published record's deterministic id (an Emit's ``record_id``)."""


@dataclass(frozen=True, kw_only=True)
class InputRecord:
    """One record from an input topic, as the broker delivered it."""

    topic: str  # logical catalog name
    broker_topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None

    @classmethod
    def of(cls, topic: str, message: Any) -> InputRecord:
        """The record a consumer message carries, under its logical catalog topic name."""
        return cls(
            topic=topic,
            broker_topic=message.topic,
            partition=message.partition,
            offset=message.offset,
            key=message.key,
            value=message.value,
        )


@dataclass(frozen=True, kw_only=True)
class Emit:
    """A record to publish, with a deterministic id (sent as the ``keylane.id`` header)."""

    record_id: str
    topic: str  # logical catalog name
    key: bytes
    value: bytes
    error_reason: str | None = None
    orphan_detail: str | None = None


def error_emit(
    record: InputRecord,
    reason: str,
    detail: str,
    *,
    now_ms: int,
    entity_key: str | None = None,
    intent_id: str | None = None,
) -> Emit:
    """The agent.errors record for ``record``: reason, detail, origin and the raw bytes.

    Its id depends only on the origin and the reason, so a redelivered bad record produces
    a duplicate that consumers can recognise.
    """
    error = ErrorRecord(
        error_id=ids.error_id(record.broker_topic, record.partition, record.offset, reason),
        reason=reason,
        detail=detail,
        entity_key=entity_key,
        intent_id=intent_id,
        origin=RecordOrigin(topic=record.broker_topic, partition=record.partition, offset=record.offset),
        raw_key_b64=b64(record.key),
        raw_value_b64=b64(record.value),
        at_ms=now_ms,
    )
    return Emit(
        record_id=error.error_id,
        topic=ERRORS,
        key=record.key or b"",
        value=encode(error),
        error_reason=reason,
    )
