"""Records in flight: an input as the broker delivered it, an output to publish, a dead letter.

A dead letter keeps the raw bytes of what it stands for, base64, unless they would make the
dead letter itself too large to produce: then it keeps their size, sha256 and first
RAW_PREFIX_BYTES bytes (``RawDigest``), and the whole record stays where ``origin`` points.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable
from typing import Any, Generic, Literal, TypeVar, overload

import msgspec
from msgspec.structs import replace as replace_struct

from keylane import ids
from keylane.catalog import ERRORS, INTENTS
from keylane.wire import ErrorReason, ErrorRecord, RawDigest, RecordOrigin, b64, decode, encode

OrphanDetail = Literal[
    "no_continuation", "unknown_intent", "kind_mismatch", "deadline_passed", "intent_expired"
]
"""Why an ``orphaned_result`` found no continuation to resume: the first word of its detail,
and its metric's label."""

_Owner = TypeVar("_Owner")
_Value = TypeVar("_Value")

ID_HEADER = "keylane.id"
"""The header carrying a published record's deterministic id (an Emit's ``record_id``)."""

ORIGIN_HEADER = "keylane.origin"
"""The header a copy keylane re-produces carries: ``"<topic>/<partition>/<offset>"`` of the
record it copies (a re-route to the key's partition, ShardKeys' copy on agent.events.sharded).
A copy of a copy keeps the first origin, so every copy of one record has one identity however
often it is produced again. A re-driven dead letter carries none: it is a new original."""

REDRIVE_OF_HEADER = "keylane.redrive-of"
"""The header of a re-driven dead letter (``keylane errors redrive``): the id of the dead
letter it re-drives. Re-routed and sharded copies keep it."""

REDRIVE_BY_HEADER = "keylane.redrive-by"
"""The header of a re-driven dead letter: who re-drove it and why (``"<operator>: <why>"``),
its audit record; the record's timestamp says when."""

REDRIVES_HEADER = "keylane.redrives"
"""The header of a re-driven dead letter: how often its record has been re-driven (decimal);
a dead letter of it carries the count as ``ErrorRecord.redrives``."""


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


def redrive_of(headers: Any) -> tuple[str, int] | None:
    """(dead letter id, re-drive count) from a consumed record's re-drive headers, or None for
    a record never re-driven (or whose headers do not parse)."""
    found = dict(redrive_headers(headers))
    of, count = found.get(REDRIVE_OF_HEADER), found.get(REDRIVES_HEADER)
    if of is None or count is None or not count.isdigit():
        return None
    return of.decode(errors="replace"), int(count)


def redrive_headers(headers: Any) -> list[tuple[str, bytes]]:
    """The re-drive headers of a consumed record, for a copy of it to carry along."""
    items = (headers.items() if hasattr(headers, "items") else headers) if headers else ()
    return [
        (name, bytes(value))
        for name, value in items
        if name in (REDRIVE_OF_HEADER, REDRIVES_HEADER) and isinstance(value, bytes | bytearray)
    ]


def position_of(message: Any) -> tuple[str, int, int]:
    """(topic, partition, offset) naming a consumed record: its first origin if it is a copy."""
    return origin_of(message.headers) or (message.topic, message.partition, message.offset)


def origin_header(message: Any) -> tuple[str, bytes]:
    """The ``keylane.origin`` header for a copy of ``message``: its own origin if it is a copy
    already, else its own position."""
    topic, partition, offset = position_of(message)
    return ORIGIN_HEADER, f"{topic}/{partition}/{offset}".encode()


class _computed_once(Generic[_Owner, _Value]):
    """``functools.cached_property`` without its lock (Python 3.11 takes one on every first
    read, a microsecond of each input's commit), and for a frozen Struct with a ``__dict__``:
    the value goes in the instance's ``__dict__``, which later reads find first. For objects
    of one thread, the event loop's."""

    def __init__(self, compute: Callable[[_Owner], _Value]) -> None:
        self._compute = compute
        self._name = compute.__name__
        self.__doc__ = compute.__doc__

    @overload
    def __get__(self, instance: None, owner: type[_Owner]) -> _computed_once[_Owner, _Value]: ...

    @overload
    def __get__(self, instance: _Owner, owner: type[_Owner]) -> _Value: ...

    def __get__(
        self, instance: _Owner | None, owner: type[_Owner]
    ) -> _Value | _computed_once[_Owner, _Value]:
        if instance is None:
            return self
        value = instance.__dict__[self._name] = self._compute(instance)
        return value


class InputRecord(msgspec.Struct, frozen=True, kw_only=True, dict=True):
    """One record from an input topic, as the broker delivered it.

    A frozen Struct, as ``Emit`` (one per input), with a ``__dict__`` for ``identity`` alone;
    ``msgspec.structs.replace`` makes a changed copy."""

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
    epoch: int = 0
    """The owner epoch the worker processes it under (service/keylane/kafka/epochs.py): the
    state it commits carries it, so a former owner's late write never wins a restore."""
    redrive: tuple[str, int] | None = None
    """(dead letter id, re-drive count) when the record is a re-driven dead letter
    (``keylane.redrive-of`` / ``keylane.redrives``): its own dead letter carries them on."""

    @classmethod
    def of(cls, topic: str, message: Any, *, log_end: int | None = None, epoch: int = 0) -> InputRecord:
        """The record a consumer message carries, under its logical catalog topic name."""
        headers = getattr(message, "headers", None)
        return cls(
            topic=topic,
            broker_topic=message.topic,
            partition=message.partition,
            offset=message.offset,
            key=message.key,
            value=message.value,
            origin=origin_of(headers),
            log_end=log_end,
            epoch=epoch,
            redrive=redrive_of(headers),
        )

    @_computed_once
    def identity(self) -> tuple[str, int]:
        """(stream, offset): what makes this record one input, whichever copy of it this is.

        The stream is ``"<topic>/<partition>"`` of the original record. Copies of one record
        share its identity; within a stream, a key sees its records in offset order (the
        original partition is read in order and copied in order). Worked out once: every
        input's commit asks for it several times.
        """
        topic, partition, offset = self.origin or (self.broker_topic, self.partition, self.offset)
        return f"{topic}/{partition}", offset


class Emit(msgspec.Struct, frozen=True, kw_only=True):
    """A record to publish, with a deterministic id (sent as the ``keylane.id`` header).

    A frozen Struct rather than a frozen dataclass: every activation makes one or more, and a
    frozen dataclass sets each field through ``object.__setattr__`` (ten times the cost)."""

    record_id: str
    topic: str  # logical catalog name
    key: bytes
    value: bytes
    error_reason: ErrorReason | None = None
    orphan_detail: OrphanDetail | None = None


def error_emit(
    record: InputRecord,
    reason: ErrorReason,
    detail: str,
    *,
    now_ms: int,
    entity_key: str | None = None,
    intent_id: str | None = None,
) -> Emit:
    """The agent.errors record for ``record``: reason, detail, origin and the raw bytes.

    Its id depends only on the origin and the reason, so a redelivered bad record (or
    another copy of it) produces a duplicate that consumers can recognise. A re-driven record
    is an original at its new position, so it fails under a new id; its dead letter names the
    one it was re-driven from and the re-drive count.
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
        redrives=record.redrive[1] if record.redrive else 0,
        redriven_from=record.redrive[0] if record.redrive else None,
    )
    return Emit(
        record_id=error.error_id,
        topic=ERRORS,
        key=record.key or b"",
        value=encode(error),
        error_reason=reason,
    )


RECORD_TOO_LARGE: ErrorReason = "record_too_large"
"""The error reason of a record keylane could not produce because it is too large."""
RAW_PREFIX_BYTES = 4096
"""How many leading bytes of a too-large key or value a dead letter keeps, beside its sha256."""
DETAIL_MAX_CHARS = 4096
"""A shrunk dead letter's detail is cut to this many characters."""


def raw_digest(data: bytes) -> RawDigest:
    """Size, sha256 and the first RAW_PREFIX_BYTES bytes of ``data``."""
    return RawDigest(
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        prefix_b64=base64.b64encode(data[:RAW_PREFIX_BYTES]).decode(),
    )


def too_large_emit(
    *,
    topic: str,
    record_id: str | None,
    key: bytes | None,
    value: bytes | None,
    size: int,
    limit: int,
    origin: tuple[str, int, int] | None,
    now_ms: int,
) -> Emit:
    """The ``record_too_large`` dead letter of a record for ``topic`` (logical name) that is
    ``size`` bytes against a ``limit``: an output, an intent, a result, a re-routed or sharded
    copy. ``origin`` is the input it was produced for (the whole record can be made again
    from there). Its id depends only on the origin and the record, so a redelivery makes a
    duplicate consumers recognise."""
    where = origin or ("-", -1, -1)
    error = ErrorRecord(
        error_id=ids.error_id(*where, f"{RECORD_TOO_LARGE}:{record_id or topic}"),
        reason=RECORD_TOO_LARGE,
        detail=(
            f"a {topic} record of {size} bytes is over the {limit}-byte limit (its topic's "
            "max.message.bytes or the producer's max request size) and was not produced; its "
            "input stays at the origin. Raise max_message_bytes in topics/catalog.toml (and on "
            "the broker, 'keylane topics apply') to let such records through"
        ),
        entity_key=_key_text(key),
        intent_id=record_id if topic == INTENTS else None,
        origin=None if origin is None else RecordOrigin(topic=where[0], partition=where[1], offset=where[2]),
        raw_key_b64=b64(key) if key is None or len(key) <= RAW_PREFIX_BYTES else None,
        raw_key_digest=raw_digest(key) if key is not None and len(key) > RAW_PREFIX_BYTES else None,
        raw_value_digest=None if value is None else raw_digest(value),
        record_bytes=size,
        limit_bytes=limit,
        at_ms=now_ms,
    )
    return Emit(
        record_id=error.error_id,
        topic=ERRORS,
        key=_bounded_key(key),
        value=encode(error),
        error_reason=RECORD_TOO_LARGE,
    )


def shrunk_error(emit: Emit, *, size: int, limit: int) -> Emit:
    """An agent.errors ``emit`` too large to produce, carrying digests of its raw bytes
    instead of the bytes (``RawDigest``), and a detail cut to DETAIL_MAX_CHARS. Its id, reason
    and metric labels stay: it is the same dead letter, smaller."""
    error = decode(emit.value, ErrorRecord)
    raw_key = _unb64(error.raw_key_b64)
    raw_value = _unb64(error.raw_value_b64)
    key_too_large = raw_key is not None and len(raw_key) > RAW_PREFIX_BYTES
    small = replace_struct(
        error,
        detail=error.detail[:DETAIL_MAX_CHARS],
        raw_key_b64=None if key_too_large else error.raw_key_b64,
        raw_key_digest=raw_digest(raw_key) if raw_key is not None and key_too_large else error.raw_key_digest,
        raw_value_b64=None,
        raw_value_digest=error.raw_value_digest if raw_value is None else raw_digest(raw_value),
        record_bytes=size,
        limit_bytes=limit,
    )
    return replace_struct(emit, key=_bounded_key(emit.key), value=encode(small))


def _unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


def _bounded_key(key: bytes | None) -> bytes:
    """A dead letter's record key: the key itself, or its sha256 (hex) when it is too large."""
    if key is None:
        return b""
    return key if len(key) <= RAW_PREFIX_BYTES else hashlib.sha256(key).hexdigest().encode()


def _key_text(key: bytes | None) -> str | None:
    if key is None or len(key) > RAW_PREFIX_BYTES:
        return None
    try:
        return key.decode()
    except UnicodeDecodeError:
        return None
