"""Records in flight: an input as the broker delivered it, an output to publish, a dead letter."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from service.catalog import ERRORS
from service.runtime import ids
from service.wire import ErrorRecord, RecordOrigin, b64, encode

ID_HEADER = "keylane.id"
"""The header carrying a published record's deterministic id (an Emit's ``record_id``)."""

ORIGIN_HEADER = "keylane.origin"
"""The header a copy keylane re-produces carries: ``"<topic>/<partition>/<offset>"`` of the
record it copies (a re-route to the key's partition, ShardKeys' copy on agent.events.sharded,
a re-driven dead letter). A copy of a copy keeps the first origin, so every copy of one
record has one identity however often it is produced again."""


def origin_of(headers: Any) -> tuple[str, int, int] | None:
    """The ``keylane.origin`` header of a consumed record as (topic, partition, offset), or
    None when the record carries none (it is an original) or the header does not parse."""
    if not headers:
        return None
    items = headers.items() if hasattr(headers, "items") else headers
    for name, value in items:
        if name != ORIGIN_HEADER or value is None:
            continue
        text = value.decode(errors="replace") if isinstance(value, bytes | bytearray) else str(value)
        topic, _, rest = text.rpartition("/")
        topic, _, partition = topic.rpartition("/")
        if topic and partition.isdigit() and rest.isdigit():
            return topic, int(partition), int(rest)
        return None
    return None


def origin_header(message: Any) -> tuple[str, bytes]:
    """The ``keylane.origin`` header for a copy of ``message``: its own origin if it is a copy
    already, else its own position."""
    first = origin_of(message.headers)
    topic, partition, offset = first or (message.topic, message.partition, message.offset)
    return ORIGIN_HEADER, f"{topic}/{partition}/{offset}".encode()


@dataclass(frozen=True, kw_only=True)
class InputRecord:
    """One record from an input topic, as the broker delivered it."""

    topic: str  # logical catalog name
    broker_topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    origin: tuple[str, int, int] | None = None
    """(topic, partition, offset) of the record this one copies (``keylane.origin``), or None
    for an original."""
    log_end: int | None = None
    """The partition's log end offset as the consumer last saw it, when known."""

    @classmethod
    def of(cls, topic: str, message: Any, *, log_end: int | None = None) -> InputRecord:
        """The record a consumer message carries, under its logical catalog topic name."""
        return cls(
            topic=topic,
            broker_topic=message.topic,
            partition=message.partition,
            offset=message.offset,
            key=message.key,
            value=message.value,
            origin=origin_of(getattr(message, "headers", None)),
            log_end=log_end,
        )

    @property
    def identity(self) -> tuple[str, int]:
        """(stream, offset): what makes this record one input, whichever copy of it this is.

        The stream is ``"<topic>/<partition>"`` of the original record. Copies of one record
        share its identity; within a stream, a key sees its records in offset order (the
        original partition is read in order and copied in order).
        """
        topic, partition, offset = self.origin or (self.broker_topic, self.partition, self.offset)
        return f"{topic}/{partition}", offset


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

    Its id depends only on the origin and the reason, so a redelivered bad record (or
    another copy of it) produces a duplicate that consumers can recognise.
    """
    # A copy's dead letter shares its original's id and origin: copies are one record.
    topic, partition, offset = record.origin or (record.broker_topic, record.partition, record.offset)
    error = ErrorRecord(
        error_id=ids.error_id(topic, partition, offset, reason),
        reason=reason,
        detail=detail,
        entity_key=entity_key,
        intent_id=intent_id,
        origin=RecordOrigin(topic=topic, partition=partition, offset=offset),
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
