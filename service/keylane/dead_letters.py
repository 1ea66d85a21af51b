"""`keylane errors`: list, show and re-drive the dead letters on agent.errors.

A re-drive produces a dead letter's raw key and value again to its origin topic (the origin's
logical topic under this deployment's prefix), with two headers and without
``keylane.origin``: the worker takes it as a new original at its new position
(service/keylane/records.py), and a dead letter of it carries the re-drive count on.

1. read agent.errors to its end and keep the first record of each id (a redelivered bad record
   is dead-lettered again under the same id);
2. select by reason, key and time, in origin order (a key's records go back in their order);
3. set aside what cannot go back: no raw bytes (only a digest: too large for agent.errors),
   raw bytes that are not an input's (``record_too_large``), and a dead letter that failed
   after ``max_redrives`` re-drives already (quarantined);
4. read the partitions the rest would be produced to and collect every ``keylane.redrive-of``
   there: a dead letter already re-driven is skipped, so a run that was interrupted resumes
   where it stopped and a second run sends nothing;
5. produce the rest one at a time, each confirmed by Kafka (acks=all) before the next, at
   most ``rate`` a second.

Run one re-drive at a time per deployment: step 4 does not see a concurrent run's sends.
"""

from __future__ import annotations

import asyncio
import base64
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import msgspec

from keylane.catalog import ERRORS, EVENTS, EVENTS_SHARDED, Catalog
from keylane.config import Settings
from keylane.errors import KeylaneError
from keylane.kafka.partitioner import expected_partition
from keylane.kafka.producer import producer
from keylane.kafka.topic_reader import TopicRecord, read_to_end
from keylane.keys import unshard_key
from keylane.records import RECORD_TOO_LARGE, REDRIVE_BY_HEADER, REDRIVE_OF_HEADER, REDRIVES_HEADER
from keylane.wire import AgentEnvelope, ErrorRecord, MalformedRecord, decode

MAX_REDRIVES = 3
"""A dead letter whose record failed after this many re-drives is quarantined: not re-driven."""

Status = Literal["redrivable", "quarantined", "no_bytes", "not_an_input"]

_DURATION = re.compile(r"^(\d+)([smhdw])$")
_UNIT_MS = {"s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}


class UnknownDeadLetter(KeylaneError):
    """``keylane errors show ID`` found no dead letter with that id."""


def parse_since(text: str, *, now_ms: int) -> int:
    """Milliseconds since the epoch for ``--since``: a duration back from now (``30m``, ``2h``,
    ``1d``) or an ISO time (UTC unless it names its offset). ValueError saying what is wrong."""
    match = _DURATION.match(text.strip())
    if match:
        return now_ms - int(match.group(1)) * _UNIT_MS[match.group(2)]
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"{text!r} is neither a duration (30m, 2h, 1d) nor an ISO time") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return int(when.timestamp() * 1000)


@dataclass(frozen=True)
class DeadLetter:
    """One dead letter as read from agent.errors, and where it sits there."""

    error: ErrorRecord
    timestamp_ms: int
    partition: int
    offset: int
    errors_key: bytes | None = None

    @property
    def id(self) -> str:
        return self.error.error_id

    @property
    def at_ms(self) -> int:
        """When the worker dead-lettered it (the record's timestamp for one without ``at_ms``)."""
        return self.error.at_ms or self.timestamp_ms

    @property
    def key(self) -> str | None:
        """The entity key it is about: its ``entity_key``, else its raw key as text."""
        if self.error.entity_key is not None:
            return self.error.entity_key
        raw = self.raw_key or self.errors_key
        return None if raw is None else raw.decode(errors="replace")

    @property
    def raw_key(self) -> bytes | None:
        return _unb64(self.error.raw_key_b64)

    @property
    def raw_value(self) -> bytes | None:
        return _unb64(self.error.raw_value_b64)

    def status(self, *, max_redrives: int = MAX_REDRIVES) -> Status:
        """Whether it can go back: ``no_bytes`` when it keeps a digest only, ``not_an_input``
        for ``record_too_large`` (its bytes are a record keylane made) or one without origin,
        ``quarantined`` once its record failed after ``max_redrives`` re-drives."""
        error = self.error
        if error.reason == RECORD_TOO_LARGE or error.origin is None:
            return "not_an_input"
        if error.raw_value_digest is not None or error.raw_key_digest is not None:
            return "no_bytes"
        if error.redrives >= max_redrives:
            return "quarantined"
        return "redrivable"

    def why_not(self, *, max_redrives: int = MAX_REDRIVES) -> str:
        """One line on why :meth:`status` keeps it from a re-drive ('' when it does not)."""
        origin = self.error.origin
        where = "its origin" if origin is None else f"{origin.topic}/{origin.partition}@{origin.offset}"
        return {
            "redrivable": "",
            "quarantined": f"quarantined: it failed again after {self.error.redrives} re-drives "
            f"(--max-redrives {max_redrives})",
            "no_bytes": f"no raw bytes: too large for agent.errors, it keeps a digest only; the "
            f"record is at {where}",
            "not_an_input": "not an input: its bytes are a record keylane could not produce, or it "
            "has no origin",
        }[self.status(max_redrives=max_redrives)]


@dataclass(frozen=True, kw_only=True)
class Selection:
    """Which dead letters a command acts on: all that match every criterion given."""

    reason: str | None = None
    key: str | None = None
    since_ms: int | None = None

    def __call__(self, dead: DeadLetter) -> bool:
        return (
            (self.reason is None or dead.error.reason == self.reason)
            and (self.key is None or dead.key == self.key)
            and (self.since_ms is None or dead.at_ms >= self.since_ms)
        )


def dead_letters_of(records: Iterable[TopicRecord]) -> list[DeadLetter]:
    """The dead letters among agent.errors records, the first of each id only, in origin order
    (topic, partition, offset; those without origin last). Records that do not decode as
    ErrorRecord are not dead letters of this build and are left out."""
    seen: dict[str, DeadLetter] = {}
    for record in sorted(records, key=lambda r: (r.timestamp_ms, r.partition, r.offset)):
        try:
            error = decode(record.value, ErrorRecord)
        except MalformedRecord:
            continue
        seen.setdefault(
            error.error_id,
            DeadLetter(error, record.timestamp_ms, record.partition, record.offset, record.key),
        )
    return sorted(seen.values(), key=_origin_order)


def _origin_order(dead: DeadLetter) -> tuple[int, str, int, int, str]:
    origin = dead.error.origin
    if origin is None:
        return 1, "", 0, dead.at_ms, dead.id
    return 0, origin.topic, origin.partition, origin.offset, dead.id


def target_topic(dead: DeadLetter, catalog: Catalog) -> str | None:
    """The logical topic a dead letter goes back to (None: its origin is no catalog topic):
    its origin's, except that the raw bytes of a ShardKeys copy (shard key ``k#i``, the
    envelope's ``entity_key`` the same) go to agent.events.sharded, where the worker read them,
    rather than through ShardKeys again."""
    origin = dead.error.origin
    if origin is None:
        return None
    logical = max((n for n in catalog.topics if origin.topic.endswith(n)), key=len, default=None)
    if logical == EVENTS and _is_shard_copy(dead.raw_key, dead.raw_value):
        return EVENTS_SHARDED
    return logical


def _is_shard_copy(key: bytes | None, value: bytes | None) -> bool:
    if key is None:
        return False
    try:
        unshard_key(key)
        envelope = decode(value, AgentEnvelope)
    except (ValueError, MalformedRecord):
        return False
    return envelope.entity_key is not None and envelope.entity_key.encode() == key


@dataclass(frozen=True)
class Redriven:
    """A re-driven dead letter as it sits on its origin topic."""

    dead_letter_id: str
    count: int
    topic: str
    partition: int
    offset: int
    timestamp_ms: int


async def find_redriven(settings: Settings, topics: dict[str, set[int] | None]) -> dict[str, list[Redriven]]:
    """Every re-drive on ``topics`` (broker name to the partitions to read, None for all) by
    the dead letter id it carries in ``keylane.redrive-of``. Re-routed copies count too."""
    found: dict[str, list[Redriven]] = {}
    for topic, partitions in topics.items():
        chosen = None if partitions is None else sorted(partitions)
        for record in await read_to_end(settings, topic, partitions=chosen):
            of = record.headers.get(REDRIVE_OF_HEADER)
            if of is None:
                continue
            count = record.headers.get(REDRIVES_HEADER, b"0")
            found.setdefault(of.decode(errors="replace"), []).append(
                Redriven(
                    of.decode(errors="replace"),
                    int(count) if count.isdigit() else 0,
                    topic,
                    record.partition,
                    record.offset,
                    record.timestamp_ms,
                )
            )
    return found


def search_space(dead_letters: Iterable[DeadLetter], catalog: Catalog) -> dict[str, set[int] | None]:
    """The partitions (by broker topic; None: all) that :func:`find_redriven` must read to see
    every re-drive of ``dead_letters``: a key's partition by murmur2, where the producer puts
    it and the worker re-routes it; every partition for a record without key."""
    space: dict[str, set[int] | None] = {}
    for dead in dead_letters:
        logical = target_topic(dead, catalog)
        if logical is None:
            continue
        spec, key = catalog[logical], dead.raw_key
        known = space.setdefault(spec.name, set())
        if key is None or known is None:
            space[spec.name] = None
        else:
            known.add(expected_partition(key, spec.partitions))
    return space


Action = Literal["send", "already", "quarantined", "no_bytes", "not_an_input"]


@dataclass(frozen=True)
class Step:
    """What a re-drive does with one selected dead letter, and why."""

    dead: DeadLetter
    action: Action
    topic: str  # logical
    count: int  # the re-drive count it is (or was) sent with
    why: str = ""


def plan(
    dead_letters: Sequence[DeadLetter],
    *,
    catalog: Catalog,
    redriven: dict[str, list[Redriven]],
    max_redrives: int = MAX_REDRIVES,
) -> list[Step]:
    """One step per dead letter, in order: ``send`` with count = its own count + 1, or the
    reason it is left: ``already`` re-driven (a record carries its id), or its :meth:`status`."""
    steps = []
    for dead in dead_letters:
        status = dead.status(max_redrives=max_redrives)
        topic = target_topic(dead, catalog) or ""
        count = dead.error.redrives + 1
        if status == "redrivable" and not topic:
            origin = dead.error.origin
            why = f"not an input: its origin topic {origin and origin.topic} is not in the catalog"
            steps.append(Step(dead, "not_an_input", topic, dead.error.redrives, why))
        elif status != "redrivable":
            steps.append(
                Step(dead, status, topic, dead.error.redrives, dead.why_not(max_redrives=max_redrives))
            )
        elif dead.id in redriven:
            first = redriven[dead.id][0]
            why = f"already re-driven: {first.topic}/{first.partition}@{first.offset}"
            steps.append(Step(dead, "already", topic, first.count, why))
        else:
            steps.append(Step(dead, "send", topic, count))
    return steps


async def load(settings: Settings, catalog: Catalog) -> list[DeadLetter]:
    """Every dead letter now on agent.errors (:func:`dead_letters_of`)."""
    return dead_letters_of(await read_to_end(settings, catalog.name(ERRORS)))


async def send(
    settings: Settings,
    catalog: Catalog,
    steps: Iterable[Step],
    *,
    rate: float,
    operator: str,
    why: str,
    on_sent: Callable[[Step, int, int], None] | None = None,
) -> int:
    """Produce every ``send`` step, one at a time and confirmed, at most ``rate`` a second,
    each with its audit header (``operator`` and ``why``); ``on_sent(step, partition,
    offset)`` after each. Returns how many were sent. A send that
    fails stops the run (KafkaError): the next run's :func:`find_redriven` says what landed."""
    sent = 0
    started = time.monotonic()
    async with producer(settings) as kafka:
        for step in steps:
            if step.action != "send":
                continue
            delay = started + sent / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            headers = [
                (REDRIVE_OF_HEADER, step.dead.id.encode()),
                (REDRIVES_HEADER, str(step.count).encode()),
                (REDRIVE_BY_HEADER, f"{operator}: {why}".encode()),
            ]
            metadata = await kafka.send_and_wait(
                catalog.name(step.topic),
                key=step.dead.raw_key,
                value=step.dead.raw_value,
                headers=headers,
            )
            sent += 1
            if on_sent is not None:
                on_sent(step, metadata.partition, metadata.offset)
    return sent


def history(
    dead: DeadLetter, dead_letters: Sequence[DeadLetter], redriven: dict[str, list[Redriven]]
) -> dict[str, Any]:
    """A dead letter's re-drive history: the dead letters it descends from (oldest first), its
    own re-drives on the origin topic, and the dead letters those re-drives became."""
    by_id = {d.id: d for d in dead_letters}
    ancestors: list[str] = []
    parent = dead.error.redriven_from
    while parent is not None and parent not in ancestors:
        ancestors.insert(0, parent)
        parent = by_id[parent].error.redriven_from if parent in by_id else None
    return {
        "redriven_from": ancestors,
        "redriven_as": [
            {
                "topic": r.topic,
                "partition": r.partition,
                "offset": r.offset,
                "count": r.count,
                "at_ms": r.timestamp_ms,
            }
            for r in redriven.get(dead.id, [])
        ],
        "failed_again_as": [d.id for d in dead_letters if d.error.redriven_from == dead.id],
    }


def to_json(dead: DeadLetter, *, max_redrives: int = MAX_REDRIVES) -> dict[str, Any]:
    """One dead letter as a JSON object: every field of its record, plus its key, time, status
    and its raw key and value rendered (:func:`rendered`)."""
    shown: dict[str, Any] = msgspec.to_builtins(dead.error)
    shown.update(
        id=dead.id,
        key=dead.key,
        at=utc(dead.at_ms),
        redrives=dead.error.redrives,
        status=dead.status(max_redrives=max_redrives),
        raw_key=rendered(dead.raw_key, dead.error.raw_key_digest),
        raw_value=rendered(dead.raw_value, dead.error.raw_value_digest),
    )
    return shown


def rendered(raw: bytes | None, digest: Any) -> dict[str, Any] | None:
    """Raw bytes for a person: ``{"text": ...}`` when they are UTF-8, else ``{"base64": ...}``;
    for bytes kept as a digest, its size, sha256 and prefix (base64)."""
    if raw is not None:
        try:
            return {"text": raw.decode()}
        except UnicodeDecodeError:
            return {"base64": base64.b64encode(raw).decode()}
    if digest is not None:
        return {"size": digest.size, "sha256": digest.sha256, "prefix_base64": digest.prefix_b64}
    return None


def utc(ms: int) -> str:
    """``2024-05-01 12:00:00`` (UTC) for milliseconds since the epoch."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000))


def _unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)
