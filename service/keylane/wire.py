"""Record formats on keylane's topics: versioned JSON, decoded strictly.

A record value's ``"v"`` is its schema version; absent, it is 1 (every record type omits its
defaults, ``v`` too, when it encodes). A value that is not JSON, does
not match its schema, or names a version this build does not know raises
:class:`MalformedRecord`, which the worker turns into a ``malformed_record`` on
agent.errors with the raw bytes; it never crashes the worker and is never retried.

Keys are the entity keys as UTF-8 bytes; the record key and the ``entity_key`` field of a
record always agree (ShardKeys rewrites both).
"""

from __future__ import annotations

import base64
import binascii
from typing import Any, Literal, TypeVar

import msgspec

from keylane.errors import KeylaneError

SCHEMA_VERSION = 1
"""The version this build reads and writes. A record without ``v`` is read as this version,
which docs/runtime.md promises is 1: a later version must make ``v`` required before it
moves this number."""

ToolStatus = Literal["OK", "ERROR", "EXPIRED", "REJECTED"]
TimerKind = Literal["hitl", "ttl"]
ErrorReason = Literal[
    "malformed_record",
    "orphaned_result",
    "unsigned_approval",
    "unsigned_result",
    "unsigned_intent",
    "activation_error",
    "activation_timeout",
    "budget_exceeded",
    "buffer_full",
    "state_too_large",
    "hitl_timeout",
    "ttl_wiped_suspension",
    "record_too_large",
    "processing_failed",
    "poison_state",
    "forged_origin",
    "unsigned_command",
]
"""Why a record is on agent.errors (``ErrorRecord.reason``; docs/runtime.md lists when each is written)."""


class MalformedRecord(KeylaneError):
    """A record that cannot be decoded; ``detail`` says why in a few words."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class _Versioned(msgspec.Struct):
    v: int


class AgentEnvelope(msgspec.Struct, kw_only=True, omit_defaults=True):
    """An event for an agent (agent.events / agent.events.sharded).

    ``payload`` is any JSON value: a string reaches the agent as its UTF-8 bytes, anything
    else as compact JSON. ``payload_b64`` carries binary payloads instead. ``entity_key``
    may be omitted on agent.events (the record key is used); ShardKeys sets it.
    """

    v: int = SCHEMA_VERSION
    payload: Any = None
    payload_b64: str | None = None
    entity_key: str | None = None
    event_id: str | None = None

    def payload_bytes(self) -> bytes:
        """The event as the agent sees it (``ctx.event``)."""
        if self.payload_b64 is not None:
            try:
                return base64.b64decode(self.payload_b64, validate=True)
            except binascii.Error:
                raise MalformedRecord("payload_b64 is not valid base64") from None
        if isinstance(self.payload, str):
            return self.payload.encode()
        return msgspec.json.encode(self.payload)


class ToolIntent(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A side effect the effector should execute once (agent.intents), keyed by physical key."""

    v: int = SCHEMA_VERSION
    intent_id: str
    entity_key: str
    seq: int
    step_index: int
    tool: str
    args_json: str
    created_at_ms: int
    expires_at_ms: int
    signature: str | None = None
    key_id: str | None = None


class ToolResult(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The outcome of one intent (agent.results), keyed by the intent's physical key."""

    v: int = SCHEMA_VERSION
    intent_id: str
    entity_key: str
    status: ToolStatus
    result_json: str | None = None
    error: str | None = None
    completed_at_ms: int = 0
    signature: str | None = None
    key_id: str | None = None


class Approval(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A human decision on an approval intent (agent.approvals), keyed by physical key."""

    v: int = SCHEMA_VERSION
    intent_id: str
    entity_key: str
    approved: bool
    approver: str
    reason: str | None = None
    decided_at_ms: int = 0
    signature: str | None = None
    key_id: str | None = None


KeyAction = Literal["cancel", "pause", "resume"]


class KeyCommand(msgspec.Struct, kw_only=True, omit_defaults=True):
    """An operator's command on one key (agent.control), keyed by the physical key: who
    (``operator``), what (``action``), when (``issued_at_ms``) and why (``reason``)."""

    v: int = SCHEMA_VERSION
    command_id: str
    entity_key: str
    action: KeyAction
    operator: str
    reason: str
    issued_at_ms: int = 0
    signature: str | None = None
    key_id: str | None = None


class ApprovalRequest(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A request for a human decision (agent.approval-requests), keyed by physical key.

    Approvers answer with an Approval carrying the same ``intent_id`` and ``entity_key``.
    """

    v: int = SCHEMA_VERSION
    intent_id: str
    entity_key: str
    channel: str
    args_json: str
    created_at_ms: int
    expires_at_ms: int
    deadline_ms: int


class TimerFired(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A timer-fired command (agent.timers), sent into the key's own partition by the scan.

    The key's lane applies it in order with its other inputs; a ``token`` that no longer
    matches the key's armed timer is stale and ignored.
    """

    v: int = SCHEMA_VERSION
    entity_key: str
    kind: TimerKind
    token: str
    deadline_ms: int


class RecordOrigin(msgspec.Struct, kw_only=True):
    """Where a record came from: enough to find it again with any Kafka client."""

    topic: str
    partition: int
    offset: int


class RawDigest(msgspec.Struct, kw_only=True):
    """Bytes too large for a dead letter to carry whole: their length, their sha256 (hex)
    and their first bytes (base64). The whole bytes stay in the record at ``origin``."""

    size: int
    sha256: str
    prefix_b64: str


class ErrorRecord(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A dead letter on agent.errors. Nothing is dropped silently: raw bytes are kept.

    When the raw bytes would make the dead letter itself too large to produce, it carries
    ``raw_key_digest`` / ``raw_value_digest`` instead of ``raw_key_b64`` / ``raw_value_b64``,
    and ``record_bytes`` / ``limit_bytes`` say by how much the record was over. For
    ``record_too_large`` the raw bytes are those of the record keylane could not produce (an
    output, an intent, a copy), and ``origin`` is the input it was produced for.
    """

    v: int = SCHEMA_VERSION
    error_id: str
    reason: ErrorReason
    detail: str
    entity_key: str | None = None
    intent_id: str | None = None
    origin: RecordOrigin | None = None
    raw_key_b64: str | None = None
    raw_value_b64: str | None = None
    at_ms: int = 0
    raw_key_digest: RawDigest | None = None
    raw_value_digest: RawDigest | None = None
    record_bytes: int | None = None
    """The size of the record that could not be produced whole (key, value, headers, overhead)."""
    limit_bytes: int | None = None
    """The most its topic and keylane's producer take: min(max.message.bytes, max request size)."""
    redrives: int = 0
    """How often the record it stands for had been re-driven (``keylane errors redrive``):
    the input's ``keylane.redrives`` header, 0 (omitted) for an input never re-driven."""
    redriven_from: str | None = None
    """The id of the dead letter the input was re-driven from (``keylane.redrive-of``)."""


T = TypeVar("T", bound=msgspec.Struct)

_encoder = msgspec.json.Encoder()
_decoders: dict[type[Any], msgspec.json.Decoder[Any]] = {}


def encode(record: msgspec.Struct) -> bytes:
    """Compact JSON bytes of a record."""
    return _encoder.encode(record)


def decode(value: bytes | None, record_type: type[T]) -> T:
    """Decode one record strictly; raise MalformedRecord saying what is wrong."""
    if value is None:
        raise MalformedRecord("record has no value")
    decoder: msgspec.json.Decoder[T] | None = _decoders.get(record_type)
    if decoder is None:
        decoder = _decoders[record_type] = msgspec.json.Decoder(record_type)
    try:
        record: T = decoder.decode(value)
    except msgspec.DecodeError as exc:
        version = _version_of(value)
        if version is not None and version != SCHEMA_VERSION:
            raise MalformedRecord(f"unknown schema version {version}") from None
        raise MalformedRecord(f"not a valid {record_type.__name__}: {exc}") from None
    version = getattr(record, "v", SCHEMA_VERSION)
    if version != SCHEMA_VERSION:
        raise MalformedRecord(f"unknown schema version {version}")
    return record


def _version_of(value: bytes) -> int | None:
    try:
        return msgspec.json.decode(value, type=_Versioned).v
    except msgspec.DecodeError:
        return None


def decode_key(key: bytes | None) -> str:
    """A record key as the entity key string; keys must be non-empty UTF-8."""
    if not key:
        raise MalformedRecord("record has no key (the entity key)")
    try:
        return key.decode()
    except UnicodeDecodeError:
        raise MalformedRecord("record key is not UTF-8") from None


def b64(data: bytes | None) -> str | None:
    """Base64 of raw bytes for an error record, None for None."""
    return None if data is None else base64.b64encode(data).decode()
