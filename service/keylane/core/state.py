"""Per-key state: the five cells (MEMORY, CONTINUATION, LLM_CACHE, PENDING, SEQ) in one record.

All of a key's cells are encoded into one KeyState blob and written with one table
assignment, which Faust turns into one changelog record. A crash therefore leaves a key
either before or after an activation, never between: there is no second record to lose.

Next to the five cells the record keeps what redelivery safety needs:

* ``applied``: the last input offset applied per identity stream (``"<topic>/<partition>"``
  of the original record, see ``InputRecord.identity``), so a redelivered input, or another
  copy of it at a new offset, is recognised and not run again under a new seq. Blobs written
  before streams keyed this by logical topic name; those entries are read for originals and
  replaced on the key's next commit;
* ``outbox``: the records a committed activation staged (outputs, intents, errors), until
  their delivery is confirmed; a redelivered input re-publishes its own entries;
* ``buffered``: events that arrived while the key was suspended, run after the suspension;
  each is stored once, as the record value that was sent (the agent's payload is decoded
  from it when the event runs), and the runtime caps them per key (AgentConfig's
  ``max_buffered_events`` / ``max_buffered_bytes``);
* ``timers``: the key's armed HITL and TTL timers (deadline and token), so a timer lives and
  moves with the key's partition;
* ``settled_ids`` and ``settled_intents``: the ids of the key's last SETTLED_INTENTS_KEPT
  intents that nobody waits for any more (resumed, or emitted by an activation that
  completed), so their late or repeated results are acknowledged instead of dead-lettered.
  Every id keylane mints is a UUID (keylane.ids), kept in ``settled_ids`` as its 16 bytes:
  a long-lived key carries up to SETTLED_INTENTS_KEPT of them on every commit, and as
  36-character strings they were most of a suspended key's record. ``settled_intents`` keeps
  any other id, and those of a blob written before ``settled_ids``, until the key's next
  commit moves them (``settle``);
* ``paused`` and ``held``: who paused the key (``keylane pause``) and the inputs of any kind
  that reached it since, stored as queued events are, run in order when it is resumed.

The MEMORY cell's format (MemoryBlob, MemoryEntry) lives below this module, in
keylane.cells, because the authoring API's Memory facade builds it too.

Encoding: msgpack with field names (msgspec), never pickle. ``state_schema_version`` is on
every blob and ``encode_state`` always writes the current one; a blob from a newer version
is refused (StateFromTheFuture) rather than guessed, and every blob the runtime commits is
decoded once before it is (``seal``), so a key never holds a blob it cannot read back. The
one exception is a state whose every value came from a decoded state or is the runtime's
own, of its field's type (an activation that wrote no memory, see ``seal``): it is its own
readback, and the tests decode it anyway (CHECK_ROUND_TRIPS).
tests/unit/core/test_state_golden.py pins the bytes of a reference blob for every version
this code reads:

* 1: the first layout;
* 2: identity streams in ``applied``, ``OutboxRecord.origin_stream``, ``BufferedEvent.copy_of``,
  ``settled_intents`` (fields with defaults: a v1 blob decodes as is);
* 3: ``BufferedEvent.payload`` is gone (it repeated what ``value`` holds). A v1 or v2 blob
  still decodes: its ``payload`` entries are ignored and the payload is decoded from
  ``value``, which every version wrote as the envelope that was delivered;
* 4: ``epoch``, the owner epoch of the writer (a field with a default: a v3 blob decodes
  with epoch 0, below every epoch a v4 worker writes);
* 5: ``paused`` and ``held`` (fields with defaults). Only a paused key's blob, or one with
  held inputs, says version 5: every other blob says 4, which a version 4 keylane reads (it
  ignores the two fields at their defaults), so rolling back strands only paused keys;
* 6: ``pages`` (PagedKeyState): the key's memory is in memory pages beside the record
  (service/keylane/core/pages.py) and its ``memory`` cell is empty. Only a key whose memory
  outgrew PAGED_FROM_BYTES is written so: a version 5 keylane refuses such a blob instead of
  reading it as a key without memory. The record a paged memory empties into
  (EmptiedKeyState) adds ``emptied_buckets`` and says the version its other cells need: a
  keylane before it reads it as a KeyState.

``settled_ids`` came without a version: a keylane before it reads such a blob as it reads
every other of the blob's version, without the ids it holds, and would only dead-letter a late
result of those intents as an orphaned_result instead of acknowledging it (on
agent.errors: visible, and nothing is lost). Saying a new version would have made it refuse,
and quarantine, almost every key that ever used a tool.

Apart from paged memory, the whole blob must fit in one changelog record: the runtime checks
every state it commits against the key's limit (see service/keylane/core/activation.py,
``KeyRuntime.state_limit``).
"""

from __future__ import annotations

import os
import uuid
from typing import Any, Literal

import msgspec

from keylane.cells import MemoryBlob, encoded_size, entry_bytes
from keylane.core.pages import PAGED_FROM_BYTES, PageLayout, buckets_for, new_layout
from keylane.errors import Fatal, KeylaneError
from keylane.records import InputRecord
from keylane.wire import AgentEnvelope, TimerKind, decode

STATE_SCHEMA_VERSION = 6
UNPAUSED_SCHEMA_VERSION = 4
PAUSED_SCHEMA_VERSION = 5
"""The version a blob without a pause says (see the module docstring)."""
SETTLED_INTENTS_KEPT = 128
CHECK_ROUND_TRIPS = os.environ.get("KEYLANE_CHECK_ROUND_TRIPS") == "1"
"""Decode every blob ``seal`` is told round-trips, and fail unless it decodes to the state
itself (tests/conftest.py turns it on for every test, the workers they start included)."""

IntentKind = Literal["tool", "approval"]


STATE_TABLE = "keylane-state"
"""The worker's table of key states (service/keylane/stages/agent.py)."""


def state_changelog(app_id: str) -> str:
    """The state table's changelog topic of an app id, as Faust names it."""
    return f"{app_id}-{STATE_TABLE}-changelog"


class UnreadableState(Fatal):
    """A stored state blob this keylane cannot read. Fatal for its key only: the key is
    quarantined (service/keylane/core/quarantine.py) and its inputs are dead-lettered as
    ``poison_state`` while every other key goes on."""


class StateFromTheFuture(UnreadableState):
    """A state blob written by a newer keylane: roll the worker forward, do not guess."""


class CorruptState(UnreadableState):
    """A state blob that does not decode: the key's history is needed to go on."""


class UnencodableState(KeylaneError):
    """A next state whose blob would not decode again: a value of the wrong type reached it
    (in memory, a snapshot or an output). Permanent: the input that produced it fails and
    nothing is committed, so no key ever holds a blob it cannot read back."""


class PendingIntent(msgspec.Struct, kw_only=True):
    """An emitted intent awaiting its result or decision (the PENDING cell's entries)."""

    intent_id: str
    tool: str
    kind: IntentKind = "tool"
    expires_at_ms: int = 0


class Continuation(msgspec.Struct, kw_only=True):
    """The CONTINUATION cell: a suspended activation waiting for results or approvals."""

    seq: int
    step_index: int
    pending_intent_ids: list[str]
    snapshot: bytes = b""
    suspended_at_ms: int = 0
    deadline_ms: int = 0
    escalations: int = 0


class CacheEntry(msgspec.Struct, kw_only=True):
    """One replay-cache entry. ``digest_only`` entries keep only the sha256 of a response too
    large to store; a lookup treats them as a miss."""

    cache_key: str
    response: bytes
    digest: str
    created_ms: int
    digest_only: bool = False
    model_id: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    size: int = 0  # encoded bytes of this entry, computed once at insert (the cap sums these)


class OutboxRecord(msgspec.Struct, kw_only=True):
    """A record staged by a committed activation, kept until its delivery is confirmed."""

    record_id: str
    topic: str  # logical catalog name, e.g. "agent.output"
    key: bytes
    value: bytes
    origin_topic: str
    origin_offset: int
    label: str | None = None  # the error reason of an agent.errors record, for its metric
    origin_stream: str = ""  # the input's identity stream (InputRecord.identity); "" before v1.1


class BufferedEvent(msgspec.Struct, kw_only=True):
    """An input waiting in the key's state, as the record was delivered: an event that arrived
    while the key was suspended (``buffered``), or any input that arrived while it was paused
    (``held``).

    Stored once: ``value`` is the raw record value (the envelope), which an error record
    carries as the input's raw bytes and from which ``payload`` (the agent's ``ctx.event``)
    is decoded when the event runs. Schema versions 1 and 2 also stored that payload;
    decoding their blobs drops it.
    """

    value: bytes
    origin_topic: str  # logical catalog name
    origin_broker_topic: str
    origin_partition: int
    origin_offset: int
    copy_of: tuple[str, int, int] | None = None  # the original's position when this was a copy

    @property
    def payload(self) -> bytes:
        """What the agent sees as ``ctx.event``, decoded from ``value`` (not stored: it
        decoded when the event arrived, so it decodes again)."""
        return decode(self.value, AgentEnvelope).payload_bytes()

    def input_record(self, key: bytes) -> InputRecord:
        """The input record this event came from (its identity included), for its activation
        or its error record."""
        return InputRecord(
            topic=self.origin_topic,
            broker_topic=self.origin_broker_topic,
            partition=self.origin_partition,
            offset=self.origin_offset,
            key=key,
            value=self.value,
            origin=self.copy_of,
        )


def waiting_input(record: InputRecord) -> BufferedEvent:
    """``record`` as it waits in its key's state (queued behind a suspension, or held)."""
    return BufferedEvent(
        value=record.value or b"",
        origin_topic=record.topic,
        origin_broker_topic=record.broker_topic,
        origin_partition=record.partition,
        origin_offset=record.offset,
        copy_of=record.origin,
    )


class ArmedTimer(msgspec.Struct, kw_only=True):
    """A durable per-key timer: fire at ``deadline_ms``; a fire carrying another token is stale."""

    deadline_ms: int
    token: str


class Paused(msgspec.Struct, kw_only=True):
    """Who paused the key, when and why (an operator's ``pause`` command on agent.control)."""

    operator: str
    reason: str
    at_ms: int
    command_id: str


class KeyState(msgspec.Struct, kw_only=True):
    """Everything keylane keeps for one physical key, committed as one record."""

    state_schema_version: int = STATE_SCHEMA_VERSION
    seq: int = 0
    memory: MemoryBlob = msgspec.field(default_factory=MemoryBlob)
    continuation: Continuation | None = None
    llm_cache: list[CacheEntry] = msgspec.field(default_factory=list)
    pending: dict[str, PendingIntent] = msgspec.field(default_factory=dict)
    applied: dict[str, int] = msgspec.field(default_factory=dict)
    outbox: list[OutboxRecord] = msgspec.field(default_factory=list)
    buffered: list[BufferedEvent] = msgspec.field(default_factory=list)
    timers: dict[TimerKind, ArmedTimer] = msgspec.field(default_factory=dict)
    settled_intents: list[str] = msgspec.field(default_factory=list)
    """Settled intent ids that are not canonical UUID strings, or from an older blob
    (see ``settled_ids``)."""
    epoch: int = 0
    """The owner epoch of the worker that wrote this state (the consumer group generation it
    held the partition in; service/keylane/kafka/epochs.py): a restore never lets a write of
    a smaller epoch, a former owner's late one, replace it."""
    paused: Paused | None = None
    held: list[BufferedEvent] = msgspec.field(default_factory=list)
    """The inputs (events, results, approvals, operator commands) that reached the key while it
    was paused, in arrival order; run when it is resumed."""
    settled_ids: bytes = b""
    """The settled intent ids that are canonical UUID strings, 16 bytes each, oldest first
    (``settle``, ``is_settled``)."""


class PagedKeyState(KeyState, kw_only=True):
    """A key's state whose memory is in pages (service/keylane/core/pages.py): its record holds
    every cell but memory, and ``pages`` says where memory is. Read back, ``memory`` holds the
    entries the pages hold (keylane.core.key_states), and an activation keeps
    ``pages.memory_bytes`` up to date; the slots are chosen when the state is written."""

    pages: PageLayout


class EmptiedKeyState(KeyState, kw_only=True):
    """The record a key's paged memory emptied into (keylane.core.key_states): one record
    again, after which the pages of ``emptied_buckets`` buckets (both slots) are written over
    with empty pages. A crash can come between; the key's next write empties them first.

    It says the version its other cells need: a keylane that predates the field reads it as
    a KeyState and leaves the pages as they are (only bytes a compaction keeps)."""

    emptied_buckets: int


class _VersionProbe(msgspec.Struct):
    state_schema_version: int = 0
    emptied_buckets: int = 0


class _EpochProbe(msgspec.Struct):
    epoch: int = 0


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(KeyState)
_paged_decoder = msgspec.msgpack.Decoder(PagedKeyState)
_emptied_decoder = msgspec.msgpack.Decoder(EmptiedKeyState)
NO_MEMORY = MemoryBlob()
"""An empty MEMORY cell, for measuring or writing a state without its memory."""
_probe = msgspec.msgpack.Decoder(_VersionProbe)
_epoch_probe = msgspec.msgpack.Decoder(_EpochProbe)


def epoch_of(blob: bytes) -> int | None:
    """The owner epoch a state blob carries (0 before schema version 4), read without decoding
    the rest; None when the blob does not decode."""
    try:
        return _epoch_probe.decode(blob).epoch
    except msgspec.DecodeError:
        return None


def schema_version_of(state: KeyState) -> int:
    """The version ``state``'s blob says: the current one for a key with paged memory,
    PAUSED_SCHEMA_VERSION for a paused key or one with held inputs, else
    UNPAUSED_SCHEMA_VERSION (what an older keylane still reads)."""
    if isinstance(state, PagedKeyState):
        return STATE_SCHEMA_VERSION
    return PAUSED_SCHEMA_VERSION if state.paused is not None or state.held else UNPAUSED_SCHEMA_VERSION


def encode_state(state: KeyState) -> bytes:
    """The blob committed to the table for one key, in the newest schema version its content
    needs (``schema_version_of``; a state decoded from an older blob is written back so). A
    paged state's blob leaves its memory to its pages."""
    return _encoder.encode(_as_written(state))


def _as_written(state: KeyState) -> KeyState:
    """``state`` as its blob holds it, which is what decoding the blob gives back for a state
    whose values all have their fields' types: the version its content needs, and for a paged
    state the record, without memory and without the staged ``dirty``."""
    version = schema_version_of(state)
    if isinstance(state, PagedKeyState):
        pages = state.pages
        layout = PageLayout(buckets=pages.buckets, slots=pages.slots, memory_bytes=pages.memory_bytes)
        return msgspec.structs.replace(state, state_schema_version=version, memory=NO_MEMORY, pages=layout)
    if state.state_schema_version != version:
        return msgspec.structs.replace(state, state_schema_version=version)
    return state


def memory_bytes(memory: MemoryBlob) -> int:
    """The size of a MEMORY cell as the Memory facade counts it: its keys and values."""
    return sum(entry_bytes(name, entry.value) for name, entry in memory.entries.items())


def _key_state_fields(state: KeyState) -> dict[str, Any]:
    """``state``'s KeyState fields, without those of its subclass."""
    return {name: getattr(state, name) for name in KeyState.__struct_fields__}


def paged(state: KeyState, layout: PageLayout) -> PagedKeyState:
    """``state`` with its memory kept in pages laid out as ``layout``."""
    return PagedKeyState(**_key_state_fields(state), pages=layout)


def unpaged(state: KeyState) -> KeyState:
    """``state`` (whose memory is empty, if it was paged) as a plain KeyState: one record."""
    return KeyState(**_key_state_fields(state))


def emptied(state: KeyState, buckets: int) -> EmptiedKeyState:
    """``state`` as the record a paged memory of ``buckets`` buckets emptied into."""
    return EmptiedKeyState(**_key_state_fields(state), emptied_buckets=buckets)


def decode_state(blob: bytes | None) -> KeyState:
    """A key's state; a fresh KeyState for a key never seen (or wiped)."""
    if not blob:
        return KeyState()
    try:
        probe = _probe.decode(blob)
    except msgspec.DecodeError as exc:
        raise CorruptState(f"state blob does not decode: {exc}") from exc
    version = probe.state_schema_version
    if version > STATE_SCHEMA_VERSION:
        raise StateFromTheFuture(
            f"state blob has schema version {version}, this keylane reads up to {STATE_SCHEMA_VERSION}; "
            "deploy the newer keylane"
        )
    try:
        if probe.emptied_buckets:
            return _emptied_decoder.decode(blob)
        if version == STATE_SCHEMA_VERSION:
            return _paged_decoder.decode(blob)
        return _decoder.decode(blob)
    except msgspec.DecodeError as exc:
        raise CorruptState(f"state blob does not decode: {exc}") from exc


class Sealed(msgspec.Struct, frozen=True):
    """A state the runtime commits: ``state``, its ``blob``, and ``readback``, what
    ``decode_state(blob)`` gives (the blob decoded to check it or, for a state ``seal`` was
    told round-trips, the state as decoding gives it back). A key whose memory is paged has
    its record encoded again by the writer, with its pages' slots: its readback is that
    record's but for ``pages``, which the writer sets (keylane.core.key_states).

    A Struct: every commit builds one, and a NamedTuple takes four times as long to build."""

    state: KeyState
    blob: bytes
    readback: KeyState | None


def seal(state: KeyState, limit: int, *, round_trips: bool = False) -> Sealed | None:
    """``state`` and its blob if they fit in ``limit`` bytes, dropping replay-cache entries,
    least recently used first, as far as needed; None if it does not fit even without them.

    The cache is the one cell that is safe to lose (a dropped entry costs at most one repeated
    model call); memory, outbox, queued events and bookkeeping are never trimmed here.

    With ``round_trips``, the caller vouches that every value in ``state`` came from a
    decoded state or is one of the runtime's own, of the type its field declares: the
    readback is then ``state`` itself, as decoding gives it back (``_as_written``), and the
    blob is not decoded. An activation that took no value from its agent's memory writes or
    from a model is such a state; the agent's outputs, snapshots and intents are checked as
    they are taken (keylane.authoring).

    Memory of PAGED_FROM_BYTES or more is paged (a PagedKeyState: ``blob`` is its record
    without memory, and keylane.core.key_states writes its pages); memory emptied goes back
    into the record. Paged memory is bounded by the room the Memory facade gives it, which is
    what the record leaves.
    """
    if isinstance(state, PagedKeyState) and not state.memory.entries:
        state = unpaged(state)
    written = _as_written(state)
    blob = _encoder.encode(written)
    if len(blob) > PAGED_FROM_BYTES and not isinstance(state, PagedKeyState):
        size = memory_bytes(state.memory)
        if size >= PAGED_FROM_BYTES:
            _readable(blob)  # the memory as it was staged, values included, reads back
            state = paged(state, new_layout(buckets_for(size, len(state.memory.entries)), size))
            written = _as_written(state)
            blob = _encoder.encode(written)
    if len(blob) <= limit:
        return _sealed(state, blob, round_trips, written)
    cache = list(state.llm_cache)  # most recently used last
    excess = len(blob) - limit
    while cache:
        while cache and excess > 0:  # entry sizes are estimates: drop what they say, then measure
            excess -= cache.pop(0).size or 1
        trimmed = msgspec.structs.replace(state, llm_cache=cache)
        written = _as_written(trimmed)
        blob = _encoder.encode(written)
        excess = len(blob) - limit
        if excess <= 0:
            return _sealed(trimmed, blob, round_trips, written)
    return None


def _sealed(state: KeyState, blob: bytes, round_trips: bool, readback: KeyState) -> Sealed:
    """``state`` sealed as ``blob``, encoded from ``readback`` (``_as_written(state)``)."""
    paged = isinstance(state, PagedKeyState)
    if not round_trips:
        return Sealed(state, blob, _readable(blob, paged=paged))
    if CHECK_ROUND_TRIPS and (decoded := _readable(blob, paged=paged)) != readback:
        raise AssertionError(f"a state sealed as round-tripping decodes otherwise:\n{readback}\n{decoded}")
    return Sealed(state, blob, readback)


def _readable(blob: bytes, *, paged: bool = False) -> KeyState:
    """``blob`` decoded as a KeyState again (UnencodableState if it does not decode).

    The encoder writes whatever Python value a field holds; only the decoder checks types. A
    blob committed unchecked could fail every later input of its key, on every worker. (Paged
    memory's values are checked as the Memory facade takes them.) This is what
    ``decode_state`` reads from it: a blob of a key whose memory is not paged says a version
    below the paged one and empties no pages; a ``paged`` one says the paged version."""
    try:
        return (_paged_decoder if paged else _decoder).decode(blob)
    except msgspec.ValidationError as exc:
        raise UnencodableState(
            f"the key's next state would not decode ({exc}): a value of the wrong type reached it; "
            "nothing was committed"
        ) from None


_UUID_BYTES = 16
_SETTLED_IDS_BYTES = SETTLED_INTENTS_KEPT * _UUID_BYTES


def _uuid_bytes(intent_id: str) -> bytes | None:
    """The 16 bytes of ``intent_id`` if it is a UUID in canonical form (lower-case hex, dashed
    8-4-4-4-12, as keylane.ids writes them), which is what gives it back exactly; else None."""
    if (
        len(intent_id) != 36
        or intent_id[8:24:5] != "----"  # the dashes of 8-4-4-4-12
        or intent_id.lower() != intent_id
    ):
        return None
    try:
        raw = bytes.fromhex(intent_id.replace("-", ""))
    except ValueError:
        return None
    return raw if len(raw) == _UUID_BYTES else None  # fromhex skips whitespace


def is_settled(state: KeyState, intent_id: str) -> bool:
    """Whether ``intent_id`` is one of ``state``'s settled intents."""
    if intent_id in state.settled_intents:
        return True
    raw = _uuid_bytes(intent_id)
    if raw is None:
        return False
    kept = state.settled_ids
    at = kept.find(raw)
    while at > 0 and at % _UUID_BYTES:  # a match must start on an id's boundary
        at = kept.find(raw, at + 1)
    return at >= 0


def settled_intent_ids(state: KeyState) -> list[str]:
    """``state``'s settled intent ids as strings: those kept as strings, then the others,
    each group oldest first."""
    kept = state.settled_ids
    compact = [str(uuid.UUID(bytes=kept[at : at + _UUID_BYTES])) for at in range(0, len(kept), _UUID_BYTES)]
    return [*state.settled_intents, *compact]


def settle(state: KeyState, intent_ids: list[str]) -> tuple[bytes, list[str]]:
    """The ``settled_ids`` and ``settled_intents`` of ``state`` once ``intent_ids`` settled too:
    the newest SETTLED_INTENTS_KEPT of each form, with every UUID among the strings (a blob
    from before ``settled_ids``) moved to the compact form, ahead of the new ones."""
    if not intent_ids and not state.settled_intents:
        return state.settled_ids, state.settled_intents
    compact = [state.settled_ids]
    others: list[str] = []
    for intent_id in [*state.settled_intents, *intent_ids]:
        raw = _uuid_bytes(intent_id)
        if raw is None:
            others.append(intent_id)
        else:
            compact.append(raw)
    return b"".join(compact)[-_SETTLED_IDS_BYTES:], others[-SETTLED_INTENTS_KEPT:]


def over_limit(state: KeyState, limit: int) -> str:
    """Why ``state`` does not fit in ``limit`` bytes, cell by cell, and what to do about it."""
    cells = {
        "memory": state.memory,
        "replay cache": state.llm_cache,
        "outbox": state.outbox,
        "queued events": state.buffered,
        "continuation": state.continuation,
        "held inputs": state.held,
    }
    sizes = ", ".join(f"{name} {encoded_size(cell)}" for name, cell in cells.items())
    return (
        f"the key's next state would take {len(encode_state(state))} bytes ({sizes}), over its "
        f"limit of {limit} even without its replay cache; keep less per key (memory, snapshots, "
        "outputs), or raise the limit: the changelog topic's max.message.bytes with the worker's "
        "producer limit (docs/runtime.md)"
    )
