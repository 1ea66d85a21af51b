"""The places keylane reaches into Faust and aiokafka internals, each with its reason.

* Faust tables choose the RocksDB partition and the changelog partition of a read or write
  from the *current event*, a context variable Faust sets only inside its own stream
  iteration. Lane tasks run outside it, so each job sets it to the record it processes
  (``event_context``); contextvars are per task, so concurrent lanes never see each
  other's event.
* Kafka's default partitioner (Java client, aiokafka, Faust) is murmur2 on the key bytes.
  ``expected_partition`` recomputes it to spot records a client with another partitioner
  (librdkafka's default, as used by kcat) put on a different partition than their key's.
* Faust's commit offsets can pass records keylane never processed around a rebalance (see
  service/keylane/core/offsets.py). ``guard_offsets`` puts keylane's OffsetLedger in charge of
  the input topics of an app: after each assignment their partitions are sought to the
  committed offset (or the log start), records are admitted strictly in offset order
  (``feed_lanes``), and the consumer commits the ledger's marks instead of Faust's acks.
  Faust's own fetch loop drops every record below its ``_read_offset``, which it advances
  for each record it fetches, ahead of processing: after the ledger seeks a partition back
  (a gap, a resumed pause), a record of an earlier fetch batch moved it past the re-read
  and the re-read was dropped, stalling the partition for good. For governed topics the
  loop sees no read offset (``_UnfilteredReadOffsets``); the ledger drops duplicates itself.
  Faust's Consumer gets five methods wrapped, once per process; apps that never call
  ``guard_offsets`` keep Faust's behaviour. Each wrap is checked to be what the aiokafka
  driver's consumer class really runs (a method a subclass overrides is never reached), and
  a Faust outside the range pyproject.toml pins fails at start with its version named.
* On revocation Faust drops the revoked partitions' acks before it waits for their records
  and never commits them; ``OffsetGuard.commit_revoked`` commits the ledger's marks there.
* Faust's ``Consumer.seek`` calls aiokafka's ``seek`` from the caller's thread, while
  aiokafka's fetcher runs in Faust's consumer thread and iterates the same dict of fetched
  records: a seek landing mid-iteration crashed the worker (KeyError in
  ``fetched_records``). Every seek keylane makes goes through ``seek_wait``, which Faust runs
  in the consumer thread.
* A record whose processing raises is retried POISON_ATTEMPTS times, then handed to the
  caller's ``on_poison`` (a dead letter) and finished, so one bad record never wedges its
  partition and is never retried forever.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import faust
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.partitioner import murmur2
from faust.streams import _current_event
from faust.transport.consumer import Consumer as FaustConsumer
from faust.transport.consumer import ThreadDelegateConsumer, ensure_TP
from faust.transport.drivers.aiokafka import Consumer as AIOKafkaDriverConsumer
from faust.types import TP

from keylane import metrics
from keylane.core.lanes import LaneRecord, LaneScheduler, WindowHooks
from keylane.core.offsets import Admission, OffsetLedger
from keylane.kafka.delivery import ProduceFailed

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


_GUARD_ATTR = "_keylane_offset_guard"
REBALANCE_GRACE_S = 10.0
RESEEK_AFTER_S = 5.0
PROBE_TIMEOUT_MS = 5000
REVOKE_COMMIT_TIMEOUT_S = 10.0


class OffsetGuard:
    """An app's OffsetLedger, the topics it governs, and how gaps are resolved."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.ledger = OffsetLedger()
        self.topics: set[str] = set()
        self.lanes: list[LaneScheduler] = []
        self.grace_s = REBALANCE_GRACE_S
        """How long running activations may go on after a revocation before they are cancelled."""
        self._sought: dict[tuple[str, int], tuple[int, float]] = {}
        self._probe: AIOKafkaConsumer | None = None
        self._seeks: set[asyncio.Task[None]] = set()
        self.window_hooks = WindowHooks(full=self.pause, room=self.resume)

    def governs(self, topic: str) -> bool:
        return topic in self.topics

    async def position(self, consumer: Any, committed: Mapping[Any, int | None]) -> None:
        """After Faust's seek to committed: seek every governed partition to its start.

        ``committed`` is what the group coordinator answered for this assignment. Not Faust's
        ``_read_offset``: Faust advances that for every record its fetcher delivers, so by the
        time this runs it can already stand past records nobody processed.
        """
        tps = [tp for tp in consumer.assignment() if tp.topic in self.topics]
        if not tps:
            return
        earliest = await consumer.earliest_offsets(*tps)
        starts = {}
        for tp in tps:
            offset = committed.get(tp)
            starts[tp] = max(offset if offset is not None and offset >= 0 else 0, earliest.get(tp) or 0)
        await consumer.seek_wait(starts)  # in the consumer thread: see the module docstring
        for tp, start in starts.items():
            self.ledger.assigned((tp.topic, tp.partition), start)
            self._sought.pop((tp.topic, tp.partition), None)
        log.info("positioned %s input partitions at their committed offsets", len(tps))

    async def revoke_lanes(self) -> None:
        """On revocation: stop dispatching, let running work finish within the grace period,
        abandon the rest (released to Faust, never committed: the next owner runs it)."""
        abandoned = sum(await asyncio.gather(*(lanes.revoke(self.grace_s) for lanes in self.lanes)))
        if abandoned:
            log.info("revocation abandoned %s records to the partitions' next owner", abandoned)

    async def commit_revoked(self, consumer: Any, revoked: Iterable[Any]) -> None:
        """Commit what the lanes finished on the revoked partitions, before they go.

        Faust drops its ack lists of revoked partitions before it waits for their records,
        so it never commits them: without this, every rebalance hands the next owner
        everything finished since the last periodic commit, to be read (and re-routed or
        sharded) again. The commit runs on the consumer's own event loop directly: its
        method queue may be held by a fetch that waits for the rebalance to end. A commit
        the group refuses (this member was already fenced) only costs that re-read.
        """
        offsets = {}
        for tp in revoked:
            if self.governs(tp.topic):
                mark = self.ledger.committable((tp.topic, tp.partition), None)
                if mark is not None:
                    offsets[TopicPartition(tp.topic, tp.partition)] = mark
        thread = getattr(consumer, "_thread", None)
        if not offsets or thread is None:
            return
        try:
            commit = thread._ensure_consumer().commit(offsets)
            done = asyncio.run_coroutine_threadsafe(commit, thread.thread_loop)
            await asyncio.wait_for(asyncio.wrap_future(done), REVOKE_COMMIT_TIMEOUT_S)
        except Exception:  # the next owner re-reads from the last commit; identities dedup it
            log.warning(
                "could not commit %s revoked partitions; their next owner re-reads them",
                len(offsets),
                exc_info=True,
            )
            return
        log.info("committed %s revoked input partitions before handing them over", len(offsets))

    def resume_lanes(self) -> None:
        for lanes in self.lanes:
            lanes.resume()

    def pause(self, topic: str, partition: int) -> None:
        """Stop fetching a topic-partition whose lane window is full."""
        log.debug("pausing %s/%s: its lane window is full", topic, partition)
        metrics.PARTITION_PAUSES.labels(str(partition)).inc()
        self.app.consumer.pause_partitions({TP(topic, partition)})

    def resume(self, topic: str, partition: int) -> None:
        """Fetch a paused topic-partition again, from the next offset the ledger expects.

        Faust drops fetched records of a partition paused meanwhile (the consumer's position
        has passed them), so reading restarts at the expected offset; re-read records that
        were already admitted are dropped as duplicates.
        """
        tp = TP(topic, partition)
        self.app.consumer.resume_partitions({tp})
        expected = self.ledger.expected((topic, partition))
        if expected is None:
            return
        self._sought[(topic, partition)] = (expected, time.monotonic())
        seek = asyncio.ensure_future(self._seek((topic, partition), expected))
        self._seeks.add(seek)
        seek.add_done_callback(self._seeks.discard)

    async def _seek(self, tp: tuple[str, int], offset: int) -> None:
        """Seek an assigned partition in the consumer's own thread (see the module docstring).
        A partition revoked meanwhile is left alone: its next owner positions it."""
        consumer = self.app.consumer
        partition = TP(*tp)
        if partition not in consumer.assignment():
            return
        try:
            await consumer.seek_wait({partition: offset})
        except Exception:  # revoked between the check and the seek: nothing to read there
            log.warning("%s/%s: could not seek to %s", *tp, offset, exc_info=True)
            return
        self._sought[tp] = (offset, time.monotonic())

    async def resolve_gap(self, tp: tuple[str, int], offset: int) -> bool:
        """A record arrived ahead of the expected offset. Returns True when the log really has
        nothing in between (the gap is skipped and the record may be processed); otherwise
        the consumer is sought back to the expected offset and the record must be dropped."""
        expected = self.ledger.expected(tp)
        if expected is None:
            return False
        sought = self._sought.get(tp)
        if sought is not None and sought[0] == expected and time.monotonic() - sought[1] < RESEEK_AFTER_S:
            return False  # already re-reading from there; this is a record fetched before the seek
        first = await self._first_offset_from(tp, expected)
        if first is not None and first >= offset:
            self.ledger.skip_to(tp, offset)
            return True
        log.warning(
            "%s/%s: offset %s arrived while %s was expected; re-reading from there", *tp, offset, expected
        )
        self._sought[tp] = (expected, time.monotonic())
        await self._seek(tp, expected)
        return False

    async def _first_offset_from(self, tp: tuple[str, int], offset: int) -> int | None:
        """The offset of the first record at or after ``offset`` in the log (a separate, group-less
        consumer reads it), or None when none arrives in time."""
        if self._probe is None:
            conf = self.app.conf
            self._probe = AIOKafkaConsumer(
                bootstrap_servers=[f"{url.host}:{url.port or 9092}" for url in conf.broker],
                enable_auto_commit=False,
                isolation_level=(
                    "read_committed"
                    if str(conf.processing_guarantee) == "exactly_once"
                    else "read_uncommitted"
                ),
            )
            await self._probe.start()
        partition = TopicPartition(*tp)
        self._probe.assign([partition])
        self._probe.seek(partition, offset)
        batches = await self._probe.getmany(partition, timeout_ms=PROBE_TIMEOUT_MS, max_records=1)
        records = batches.get(partition, [])
        return records[0].offset if records else None

    async def close(self) -> None:
        if self._probe is not None:
            await self._probe.stop()
            self._probe = None


def guard_offsets(app: Any, topics: Iterable[str]) -> OffsetGuard:
    """Put keylane's offset ledger in charge of ``topics`` on ``app`` (see the module docstring)."""
    guard: OffsetGuard | None = getattr(app, _GUARD_ATTR, None)
    if guard is None:
        _wrap_faust_consumer()
        guard = OffsetGuard(app)
        setattr(app, _GUARD_ATTR, guard)
    guard.topics.update(topics)
    return guard


def _guard_of(consumer: Any) -> OffsetGuard | None:
    return getattr(consumer.app, _GUARD_ATTR, None)


class _UnfilteredReadOffsets(defaultdict[Any, int | None]):
    """Faust's read offsets, reading as None for governed topics so its fetch loop drops
    nothing there (see the module docstring); writes and other topics are Faust's as before."""

    def __init__(self, guard: OffsetGuard, offsets: Mapping[Any, int | None]) -> None:
        super().__init__(lambda: None, offsets)
        self._guard = guard

    def __getitem__(self, tp: Any) -> int | None:
        if self._guard.governs(tp.topic):
            return None
        return super().__getitem__(tp)


_wrapped = False


def _wrap_faust_consumer() -> None:
    global _wrapped
    if _wrapped:
        return
    _wrapped = True
    perform_seek = FaustConsumer.perform_seek
    # The aiokafka driver's consumer takes seek_to_committed from ThreadDelegateConsumer,
    # which overrides the base class's: wrapping the base one never ran.
    seek_to_committed = ThreadDelegateConsumer.seek_to_committed
    on_partitions_revoked = FaustConsumer.on_partitions_revoked
    new_offset = FaustConsumer._new_offset
    drain_messages = FaustConsumer._drain_messages

    async def drain_unfiltered(self: Any, fetcher: Any) -> None:
        guard = _guard_of(self)
        if guard is not None and not isinstance(self._read_offset, _UnfilteredReadOffsets):
            self._read_offset = _UnfilteredReadOffsets(guard, self._read_offset)
        await drain_messages(self, fetcher)

    async def seek_to_committed_and_keep(self: Any) -> Any:
        committed = await seek_to_committed(self)
        self._keylane_committed = dict(committed)  # what the coordinator said, for position()
        return committed

    async def perform_seek_then_position(self: Any) -> None:
        self._keylane_committed = {}
        await perform_seek(self)
        guard = _guard_of(self)
        if guard is not None:
            await guard.position(self, {ensure_TP(tp): o for tp, o in self._keylane_committed.items()})

    async def revoke_from_ledger(self: Any, revoked: Any) -> None:
        guard = _guard_of(self)
        if guard is None or not any(guard.governs(tp.topic) for tp in revoked):
            await on_partitions_revoked(self, revoked)
            return
        # Faust waits for every record it handed out to be acked; the lanes settle them all
        # (finished, or released after the grace period) while it waits.
        revoking = asyncio.ensure_future(guard.revoke_lanes())
        try:
            await on_partitions_revoked(self, revoked)
            await revoking
            await guard.commit_revoked(self, revoked)
        finally:
            for tp in revoked:
                guard.ledger.revoked((tp.topic, tp.partition))
            guard.resume_lanes()

    def ledger_offset(self: Any, tp: Any) -> int | None:
        guard = _guard_of(self)
        if guard is None or not guard.governs(tp.topic):
            return new_offset(self, tp)
        # Faust's ack list for this partition is not the truth here; drop it so it cannot grow.
        self._acked[tp].clear()
        self._acked_index[tp].clear()
        return guard.ledger.committable((tp.topic, tp.partition), self._committed_offset.get(tp))

    ThreadDelegateConsumer.seek_to_committed = seek_to_committed_and_keep  # type: ignore[method-assign]
    FaustConsumer.perform_seek = perform_seek_then_position  # type: ignore[method-assign]
    FaustConsumer.on_partitions_revoked = revoke_from_ledger  # type: ignore[method-assign]
    FaustConsumer._new_offset = ledger_offset  # type: ignore[method-assign]
    FaustConsumer._drain_messages = drain_unfiltered  # type: ignore[method-assign]
    _check_wrapped(
        {
            "seek_to_committed": seek_to_committed_and_keep,
            "perform_seek": perform_seek_then_position,
            "on_partitions_revoked": revoke_from_ledger,
            "_new_offset": ledger_offset,
            "_drain_messages": drain_unfiltered,
        }
    )


def _check_wrapped(wrappers: Mapping[str, Callable[..., Any]]) -> None:
    """Fail loudly when the consumer class Faust actually runs does not reach a wrapper (a
    Faust release that overrides the method in a subclass, or renamed it)."""
    for name, wrapper in wrappers.items():
        if getattr(AIOKafkaDriverConsumer, name, None) is not wrapper:
            raise RuntimeError(
                f"keylane's offset guard cannot wrap Faust's Consumer.{name} on faust-streaming "
                f"{faust.__version__}; install the range pyproject.toml pins"
            )


POISON_ATTEMPTS = 3
POISON_BACKOFF_S = 0.2
Poison = Callable[[Any, Exception], Awaitable[None]]


async def _handle_or_dead_letter(
    event: Any, handle: Callable[[Any], Awaitable[None]], on_poison: Poison | None
) -> None:
    """``handle(event)``, retried on an unexpected exception; after POISON_ATTEMPTS failures
    ``on_poison(event, exc)`` dead-letters it and the record counts as finished."""
    for attempt in range(1, POISON_ATTEMPTS + 1):
        try:
            await handle(event)
            return
        except ProduceFailed:
            raise  # the worker is going down without committing this record: no retry, no dead letter
        except Exception as exc:
            message = event.message
            if on_poison is None:
                raise
            if attempt < POISON_ATTEMPTS:
                log.warning(
                    "%s/%s/%s failed (attempt %s of %s); retrying",
                    message.topic,
                    message.partition,
                    message.offset,
                    attempt,
                    POISON_ATTEMPTS,
                    exc_info=True,
                )
                await asyncio.sleep(POISON_BACKOFF_S * attempt)
                continue
            log.exception(
                "%s/%s/%s failed %s times; dead-lettering it and moving on",
                message.topic,
                message.partition,
                message.offset,
                POISON_ATTEMPTS,
            )
            metrics.POISON_RECORDS.labels(message.topic).inc()
            await on_poison(event, exc)


async def feed_lanes(
    stream: Any,
    lanes: LaneScheduler,
    handle: Callable[[Any], Awaitable[None]],
    *,
    on_poison: Poison | None = None,
) -> None:
    """Hand every event of a Faust stream to ``lanes``: ``handle(event)`` runs in the record's
    lane under its event context, and the record is acked when the scheduler says so. With
    ``on_poison``, a record whose handling keeps raising is dead-lettered through it (see
    the module docstring); without, a raise stops the lanes.

    When the app's offsets are guarded (``guard_offsets``), only records the ledger admits
    reach the lanes, and the ledger learns of each finished record in offset order.
    """
    guard: OffsetGuard | None = getattr(stream.app, _GUARD_ATTR, None)
    if guard is not None:
        lanes.set_window_hooks(guard.window_hooks)  # pause a full partition, not the dispatcher
        if lanes not in guard.lanes:
            guard.lanes.append(lanes)  # revocations settle its records
    async for event in stream.noack().events():
        message = event.message
        tp = (message.topic, message.partition)
        if guard is not None and guard.governs(message.topic):
            admission = guard.ledger.admit(tp, message.offset)
            if admission is Admission.GAP and await guard.resolve_gap(tp, message.offset):
                admission = guard.ledger.admit(tp, message.offset)
            if admission is not Admission.PROCESS:
                await stream.ack(event)  # Faust's unacked bookkeeping only; the ledger commits
                continue

        async def work(event: Any = event) -> None:
            with event_context(event):
                await _handle_or_dead_letter(event, handle, on_poison)

        async def ack(event: Any = event, tp: tuple[str, int] = tp) -> None:
            if guard is not None:
                guard.ledger.finished(tp, event.message.offset)
            await stream.ack(event)

        async def release(event: Any = event) -> None:
            await stream.ack(event)  # Faust's bookkeeping only: the ledger never commits it

        await lanes.submit(
            LaneRecord(message.topic, message.partition, message.offset, message.key), work, ack, release
        )
