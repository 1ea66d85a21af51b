"""Trust a ``keylane.origin`` header only when the record it names says the same.

Any producer can set headers, so a record claiming to be a copy (``keylane.origin``: the
original's topic, partition and offset) is checked against the original before its identity
is believed: the original must exist at that position with the copy's key and value, or, for ShardKeys'
copies, with the logical key of the copy's shard key and the same event (ShardKeys rewrites
only its ``entity_key``). A claim that
fails is *forged*: the worker dead-letters the record as ``forged_origin`` instead of either
dropping it as a redelivery (a forged offset at or below the key's applied one) or letting it
take another record's identity (a forged offset above it, which would make the real record
look like a copy).

The check reads the original with a group-less consumer of its own, and keeps what it read
(key and value digest of each record of the batch, a bounded LRU), so copies that arrive in
their originals' order, as re-routes and ShardKeys' copies do, cost one fetch per batch.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, NamedTuple

import msgspec
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import OffsetOutOfRangeError

from keylane.errors import KeylaneError
from keylane.kafka.app import started_side_consumer
from keylane.keys import unshard_key
from keylane.wire import AgentEnvelope, MalformedRecord, decode, encode

log = logging.getLogger(__name__)

FETCH_TIMEOUT_MS = 2_000
FETCH_DEADLINE_S = 60.0
"""How long an original that the log holds may take to come back before the check gives up
(OriginUnchecked: the record's processing fails and is retried)."""
FETCH_RECORDS = 500
"""Records read (and remembered) per fetch: the originals of the next copies, usually."""
REMEMBERED = 50_000
"""Originals remembered (key and a 32-byte digest each), least recently used dropped first."""

Position = tuple[str, int, int]


class OriginUnchecked(KeylaneError):
    """The original could not be read now (the broker did not answer): retried like any
    failure of a record's processing, never taken as genuine or as forged."""

    retriable = True


def _digest(value: bytes | None) -> bytes:
    return hashlib.sha256(value or b"").digest()


def _event_digest(value: bytes | None) -> bytes | None:
    """The digest of an event envelope without its ``entity_key`` (the one field ShardKeys
    rewrites in its copies), or None when ``value`` is no envelope."""
    try:
        envelope = decode(value, AgentEnvelope)
    except MalformedRecord:
        return None
    return _digest(encode(msgspec.structs.replace(envelope, entity_key=None)))


class _Original(NamedTuple):
    key: bytes | None
    digest: bytes
    event_digest: bytes | None


class OriginCheck:
    """Checks copies' ``keylane.origin`` claims against the originals on the broker."""

    def __init__(self, start_consumer: Callable[[], Awaitable[AIOKafkaConsumer]]) -> None:
        self._start_consumer = start_consumer
        self._consumer: AIOKafkaConsumer | None = None
        self._lock = asyncio.Lock()
        self._seen: OrderedDict[Position, _Original] = OrderedDict()

    async def forged(self, origin: Position, *, key: bytes | None, value: bytes | None) -> str | None:
        """Why the claim that this record (``key``, ``value``) copies the one at ``origin`` is
        false, or None when the original says the same. OriginUnchecked when it cannot tell."""
        original = await self._original(origin)
        topic, partition, offset = origin
        if original is None:
            return f"no record at {topic}/{partition}/{offset}"
        if key == original.key:
            same = original.digest == _digest(value)
        elif original.key is not None and _logical(key) == original.key:  # a ShardKeys copy
            same = original.event_digest is not None and original.event_digest == _event_digest(value)
        else:
            return f"its key differs from the record at {topic}/{partition}/{offset}"
        return None if same else f"its value differs from the record at {topic}/{partition}/{offset}"

    async def close(self) -> None:
        """Stop the consumer (the worker's shutdown)."""
        if self._consumer is not None:
            consumer, self._consumer = self._consumer, None
            await consumer.stop()

    async def _original(self, origin: Position) -> _Original | None:
        known = self._seen.get(origin)
        if known is not None:
            self._seen.move_to_end(origin)
            return known
        async with self._lock:
            known = self._seen.get(origin)
            if known is None:
                await self._fetch_from(origin)
                known = self._seen.get(origin)
            return known

    async def _fetch_from(self, origin: Position) -> None:
        """Read the records from ``origin`` on into ``_seen`` (from where the consumer stands,
        when that is a little before it: ``_position``). A fetch that brings nothing is tried
        again until FETCH_DEADLINE_S unless the log ends at or before the offset: a busy
        broker's empty answer says nothing about whether the record exists."""
        topic, partition, offset = origin
        tp = TopicPartition(topic, partition)
        deadline = time.monotonic() + FETCH_DEADLINE_S
        try:
            consumer = await self._started()
            await self._position(consumer, tp, offset)
            while True:
                try:
                    batches = await consumer.getmany(
                        tp, timeout_ms=FETCH_TIMEOUT_MS, max_records=FETCH_RECORDS
                    )
                except OffsetOutOfRangeError:
                    batches = {}
                records = batches.get(tp)
                if records:
                    self._remember(topic, partition, records)
                    if records[-1].offset >= offset:
                        return
                elif not await self._in_log(consumer, tp, offset):
                    return  # before the log's start (retention took it) or past its end: no such record
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no record came back within {FETCH_DEADLINE_S:.0f}s")
                if not records:
                    consumer.seek(tp, offset)
        except Exception as exc:
            await self.close()  # start over with a fresh consumer next time
            raise OriginUnchecked(
                f"could not read {topic}/{partition}/{offset} to check a copy: {exc!r}"
            ) from exc

    @staticmethod
    async def _in_log(consumer: AIOKafkaConsumer, tp: TopicPartition, offset: int) -> bool:
        start = (await consumer.beginning_offsets([tp]))[tp]
        end = (await consumer.end_offsets([tp]))[tp]
        return bool(start <= offset < end)

    def _remember(self, topic: str, partition: int, records: list[Any]) -> None:
        for record in records:
            event_digest = _event_digest(record.value) if record.key is not None else None
            self._seen[(topic, partition, record.offset)] = _Original(
                record.key, _digest(record.value), event_digest
            )
        while len(self._seen) > REMEMBERED:
            self._seen.popitem(last=False)

    @staticmethod
    async def _position(consumer: AIOKafkaConsumer, tp: TopicPartition, offset: int) -> None:
        """Make the consumer read ``offset`` next, or read on to it. Copies come in their
        originals' order, give or take the lanes' pace, so the consumer usually stands there
        or a little before it, with the records after its last batch fetched ahead: an assign
        or a seek would drop those, and the fetch that replaces them waits for the one in
        flight, a long poll at the log's end that lasts up to fetch_max_wait_ms (half a second
        of a ShardKeys lane's, every FETCH_RECORDS copies). The records on the way are the
        originals of the copies in the other lanes, so it reads on from up to FETCH_RECORDS
        before the offset, and seeks only further away or back."""
        if consumer.assignment() != {tp}:
            consumer.assign([tp])
        elif 0 <= offset - await consumer.position(tp) < FETCH_RECORDS:
            return
        consumer.seek(tp, offset)

    async def _started(self) -> AIOKafkaConsumer:
        if self._consumer is None:
            self._consumer = await self._start_consumer()  # kept only once started
        return self._consumer


def _logical(key: bytes | None) -> bytes | None:
    """The logical key of a shard key (``key#i``), or None for a key that is not one."""
    if key is None:
        return None
    try:
        return unshard_key(key)
    except ValueError:
        return None


def origin_check_for(app: Any) -> OriginCheck:
    """An OriginCheck reading the brokers of a Faust app, with its consumers' isolation; an
    offset the log does not hold raises instead of being reset (``auto_offset_reset="none"``)."""
    return OriginCheck(partial(started_side_consumer, app, auto_offset_reset="none"))
