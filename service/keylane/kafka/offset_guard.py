"""The offset guard: keylane's OffsetLedger, not Faust's acks, decides what an app's input topics commit.

Faust's commit offsets can pass records keylane never processed around a rebalance (see
service/keylane/core/offsets.py). ``guard_offsets`` puts keylane's OffsetLedger in charge of
the input topics of an app: after each assignment their partitions are sought to the
committed offset (or the log start), records are admitted strictly in offset order
(``feed_lanes`` in service/keylane/kafka/lane_feed.py), and the consumer commits the ledger's
marks instead of Faust's acks. The Faust Consumer methods this takes are wrapped in
service/keylane/kafka/patches.py.

* On revocation Faust drops the revoked partitions' acks before it waits for their records
  and never commits them; ``OffsetGuard.commit_revoked`` commits the ledger's marks there.
* Faust's ``Consumer.seek`` calls aiokafka's ``seek`` from the caller's thread, while
  aiokafka's fetcher runs in Faust's consumer thread and iterates the same dict of fetched
  records: a seek landing mid-iteration crashed the worker (KeyError in
  ``fetched_records``). Every seek keylane makes goes through ``seek_wait``, which Faust runs
  in the consumer thread.

Faust empties its stream queues each time it resumes flow, the consumer's position having
passed what they held; a recovery resumes flow right after the seek to committed, so records
fetched from the new position were lost there. ``queues_cleared`` hears of each clear (see
``watch_cleared_queues`` in service/keylane/kafka/patches.py) and reads the partitions that
had records queued again from the ledger's expected offset.

A partition can still go quiet with records waiting: Faust drops fetched records on other
paths of its own (a batch cut short by a rebalance), and a gap is only noticed when a later
record arrives. ``reread_stalled`` (a timer) reads a partition again from the ledger's expected
offset when the log has records from there on and none arrived for STALL_REREAD_AFTER_S
while the partition was neither paused nor rebalancing; it logs and counts each re-read
(``keylane_stall_rereads_total``), since each one means a record went missing on the way.

Both checks read the log with a probe: a group-less consumer of the guard's own, started on
first use and kept only once its start succeeded. It reads from the expected offset with
``auto_offset_reset="earliest"``, so when retention deleted records the ledger still expects,
it finds the first record the log has left. Nothing can be read before the record it finds
(transaction markers, compaction, retention), so the ledger skips to it and reading goes on
from there. A probe that cannot read (the broker unreachable) is stopped and forgotten, and
never raises out of a check: a gap counts as unresolved (its record is dropped and read again
from the expected offset, and the gap is checked again when it comes back), and a stalled
partition is checked again STALL_REREAD_AFTER_S later.

The guard also exports the consumer lag of the partitions it governs
(service/keylane/kafka/consumer_lag.py): it knows each assignment's committed offsets, sees
each commit, and forgets a partition when it is revoked.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from faust.types import TP

from keylane import metrics
from keylane.core.lanes import LaneScheduler, WindowHooks
from keylane.core.offsets import OffsetLedger
from keylane.core.stillness import Stillness
from keylane.kafka.app import log_end, readiness, recovery_completed, started_side_consumer
from keylane.kafka.consumer_lag import LAG_REFRESH_S, CommitSensor, ConsumerLag
from keylane.kafka.epochs import group_generation
from keylane.kafka.patches import watch_cleared_queues, wrap_faust_consumer

log = logging.getLogger(__name__)

_GUARD_ATTR = "_keylane_offset_guard"
REBALANCE_GRACE_S = 10.0
RESEEK_AFTER_S = 5.0
PROBE_TIMEOUT_MS = 5000
STALL_CHECK_S = 5.0
STALL_REREAD_AFTER_S = 15.0
"""How long a partition with records waiting from its expected offset on may see none of them
arrive before it is read again from there (longer than a probe, a lane hand-off or a fetch)."""
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
        self._probe_lock = asyncio.Lock()  # the gap check and the stall check share the probe
        self._paused: set[tuple[str, int]] = set()
        self._quiet: Stillness[tuple[str, int]] = Stillness()
        """Per partition with records waiting: its expected offset, and since when it has not moved."""
        self._seeks: set[asyncio.Task[None]] = set()
        self.window_hooks = WindowHooks(full=self.pause, room=self.resume)
        self.lag = ConsumerLag()

    def governs(self, topic: str) -> bool:
        return topic in self.topics

    async def position(self, consumer: Any, committed: Mapping[Any, int | None]) -> None:
        """After Faust's seek to committed: seek every governed partition to its start.

        ``committed`` is what the group coordinator answered for this assignment. Not Faust's
        ``_read_offset``: Faust advances that for every record its fetcher delivers, so by the
        time this runs it can already stand past records nobody processed.

        The ledger learns each start before the seek: while a restore runs, Faust's flow is on,
        so the consumer thread fetches from the new position at once and Faust may deliver the
        first record before this coroutine resumes. A partition the ledger did not know yet
        dropped it as unassigned, and with no later record to expose the gap it stalled for
        good. Anything delivered before the seek is read again after it.

        Faust also seeks to committed within one assignment: its fetcher, finding flow
        suspended after a fetch, drops the batch and seeks again (``Consumer.getmany``), while
        the lanes may already run records admitted since the first seek. A partition the
        ledger already holds (no revocation in between) reads on from its expected offset: a
        second start at the committed offset would admit those records again, and their keys
        would see them as redeliveries (a rerouted record would be copied twice).
        """
        tps = [tp for tp in consumer.assignment() if tp.topic in self.topics]
        if not tps:
            return
        expected = {tp: self.ledger.expected((tp.topic, tp.partition)) for tp in tps}
        held = {tp: offset for tp, offset in expected.items() if offset is not None}
        if held:
            await consumer.seek_wait(held)
            log.info("positioned %s input partitions again, at the offsets they expect next", len(held))
        tps = [tp for tp in tps if tp not in held]
        if not tps:
            return
        starts = {}
        for tp in tps:
            offset = committed.get(tp)
            starts[tp] = offset if offset is not None and offset >= 0 else 0
            self.ledger.assigned((tp.topic, tp.partition), starts[tp])
            self._sought.pop((tp.topic, tp.partition), None)
        # Asked only now: records delivered while the answer is on its way (seconds on a busy
        # machine) are admitted from the committed offset, not dropped as unassigned.
        earliest = await self._log_starts(consumer, tps)
        for tp in tps:
            first = earliest.get(tp) or 0
            if first > starts[tp]:  # retention passed the committed offset: nothing is below
                starts[tp] = first
                self.ledger.skip_to((tp.topic, tp.partition), first)
        await consumer.seek_wait(starts)  # in the consumer thread: see the module docstring
        for tp, start in starts.items():
            offset = committed.get(tp)
            self.lag.assigned((tp.topic, tp.partition), start if offset is None or offset < 0 else offset)
            for per_partition in (metrics.PARTITION_PAUSES, metrics.IN_FLIGHT, metrics.LANE_QUEUE_DEPTH):
                per_partition.labels(str(tp.partition))  # exported (as 0) before the first record
        self.refresh_lag()
        log.info("positioned %s input partitions at their committed offsets", len(tps))

    def revoked(self, tp: tuple[str, int]) -> None:
        """``tp`` is no longer ours: nothing of it is admitted or committed, and its lag goes."""
        self.ledger.revoked(tp)
        self.lag.revoked(tp)
        self._paused.discard(tp)
        self._quiet.forget(tp)

    def on_commit(self, consumer: Any) -> None:
        """After a commit: the committed offsets the consumer holds now move the lag gauges.
        (Faust's ``_committed_offset``: what its commit just wrote, from the ledger's marks.)"""
        held = consumer._committed_offset
        for topic, partition in self.lag.partitions():
            self.lag.committed((topic, partition), held.get(TP(topic, partition)))
        self.refresh_lag()

    async def refresh_lag_timer(self) -> None:
        self.refresh_lag()

    def refresh_lag(self) -> None:
        """Recompute the lag gauges from the consumer's high watermarks."""
        self.lag.refresh(lambda topic, partition: log_end(self.app, topic, partition))

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
        if not self.member():
            log.warning(
                "not committing %s revoked partitions: this worker is no longer a member of its group "
                "(evicted while it stood still); their next owner re-reads them",
                len(offsets),
            )
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
        # Faust's hook for an accepted commit: the tables' restore starts are sealed there
        # (service/keylane/kafka/restore_start.py).
        self.app.tables.on_commit({TP(tp.topic, tp.partition): o for tp, o in offsets.items()})

    def member(self) -> bool:
        """Whether the consumer is in a group generation now. One that found it was evicted
        (a heartbeat answered that its member is unknown) is in generation -1 until it joins
        again, and Kafka takes a commit under generation -1 into a group left empty as an
        admin's: a thawed zombie's commit would move the group's offsets back to where it
        stood. So no commit goes out then (Faust's nor keylane's)."""
        return group_generation(self.app) >= 0

    def resume_lanes(self) -> None:
        for lanes in self.lanes:
            lanes.resume()

    def pause(self, topic: str, partition: int) -> None:
        """Stop fetching a topic-partition whose lane window is full."""
        log.debug("pausing %s/%s: its lane window is full", topic, partition)
        metrics.PARTITION_PAUSES.labels(str(partition)).inc()
        self._paused.add((topic, partition))
        self.app.consumer.pause_partitions({TP(topic, partition)})

    def resume(self, topic: str, partition: int) -> None:
        """Fetch a paused topic-partition again, from the next offset the ledger expects.

        Faust drops fetched records of a partition paused meanwhile (the consumer's position
        has passed them), so reading restarts at the expected offset; re-read records that
        were already admitted are dropped as duplicates.
        """
        self._paused.discard((topic, partition))
        self.app.consumer.resume_partitions({TP(topic, partition)})
        self._reread((topic, partition))

    def queues_cleared(self, partitions: set[tuple[str, int]], unknown: bool) -> None:
        """Faust emptied its stream queues (see ``watch_cleared_queues`` in patches.py): each
        governed partition that had records there (every assigned one, when puts whose records
        nobody saw were cancelled) is read again from the ledger's expected offset. A clear while
        flow is suspended is a rebalance's: the next assignment positions every partition."""
        if not self.app.flow_control.is_active():
            return
        lost = set(self.ledger.partitions()) if unknown else {tp for tp in partitions if self.governs(tp[0])}
        for tp in lost:
            log.info("%s/%s: Faust cleared its stream queues; re-reading from the expected offset", *tp)
            self._reread(tp)

    def _reread(self, tp: tuple[str, int]) -> None:
        """Seek ``tp`` back to the ledger's expected offset, in the background."""
        expected = self.ledger.expected(tp)
        if expected is None:
            return
        self._sought[tp] = (expected, time.monotonic())
        seek = asyncio.ensure_future(self._seek(tp, expected))
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
        nothing in between (the gap is skipped and the record may be processed); otherwise the
        record must be dropped, and the consumer is sought back to the first record the log has
        from the expected offset on (the expected offset itself, unless nothing is readable
        there: see the module docstring). A log the probe cannot read now counts as a gap not
        resolved: the consumer is sought back to the expected offset, and the gap is checked
        again when its records come back."""
        expected = self.ledger.expected(tp)
        if expected is None:
            return False
        sought = self._sought.get(tp)
        if sought is not None and sought[0] == expected and time.monotonic() - sought[1] < RESEEK_AFTER_S:
            return False  # already re-reading from there; this is a record fetched before the seek
        try:
            first = await self._first_offset_from(tp, expected)
        except Exception:  # the broker unreachable: never skip what could not be checked
            log.warning(
                "%s/%s: offset %s arrived while %s was expected, and the log could not be read to "
                "check the gap; re-reading from %s",
                *tp,
                offset,
                expected,
                expected,
                exc_info=True,
            )
        else:
            if first is not None and first >= offset:
                self.ledger.skip_to(tp, offset)
                return True
            if first is not None and first > expected:
                self.ledger.skip_to(tp, first)  # nothing readable before it (retention deleted it)
                expected = first
            log.warning(
                "%s/%s: offset %s arrived while %s was expected; re-reading from there", *tp, offset, expected
            )
        self._sought[tp] = (expected, time.monotonic())
        await self._seek(tp, expected)
        return False

    async def reread_stalled(self) -> None:
        """Read again, from the ledger's expected offset, each partition whose log has records
        from there on while none of them arrived for STALL_REREAD_AFTER_S (see the module
        docstring): from the first record the log still has, when retention deleted the ones
        expected. Partitions paused by their lane window, and everything during a rebalance
        or a restore, are left alone: nothing is fetched there then by design. A partition
        whose log cannot be read now is checked again STALL_REREAD_AFTER_S later."""
        app = self.app
        if app.rebalancing or not recovery_completed(app) or not app.consumer.flow_active:
            self._quiet.clear()
            return
        now = time.monotonic()
        for tp in self.ledger.partitions():
            expected = self.ledger.expected(tp)
            end = log_end(app, *tp)
            if expected is None or end is None or expected >= end or tp in self._paused:
                self._quiet.forget(tp)
                continue
            quiet_s = self._quiet.still_for(tp, expected, now)
            if quiet_s < STALL_REREAD_AFTER_S:
                continue
            self._quiet.restart(tp, expected, now)
            try:
                first = await self._first_offset_from(tp, expected)
            except Exception:  # the broker unreachable: the quiet clock restarted, so try again later
                log.warning(
                    "%s/%s: no record from offset %s arrived for %.0fs, and the log could not be read "
                    "to check it; checking again in %.0fs",
                    *tp,
                    expected,
                    quiet_s,
                    STALL_REREAD_AFTER_S,
                    exc_info=True,
                )
                continue
            if first is None:
                continue  # nothing readable there (transaction markers): nothing was missed
            if first > expected:
                self.ledger.skip_to(tp, first)  # nothing readable before it (retention deleted it)
            log.warning(
                "%s/%s: no record from offset %s arrived for %.0fs while the log ends at %s; "
                "re-reading from there",
                *tp,
                expected,
                quiet_s,
                end,
            )
            metrics.STALL_REREADS.labels(metrics.topic_label(tp[0])).inc()
            await self._seek(tp, first)

    async def _log_starts(self, consumer: Any, tps: list[Any]) -> Mapping[Any, int]:
        """The first offset each of ``tps`` holds, asked by a group-less consumer started for
        the question. On the group consumer's connections it waited behind the fetch each
        broker holds open there (a broker answers one request per connection at a time, and
        Faust's fetches wait up to 1.5 s for records): about 1.5 s at every start. Asked
        through the group consumer when that consumer cannot start or ask."""
        try:
            asking = await started_side_consumer(self.app, auto_offset_reset="earliest")
        except Exception:  # the group consumer's own way still works, only slower
            log.debug("could not start a consumer to read the log starts", exc_info=True)
        else:
            try:
                found = await asking.beginning_offsets([TopicPartition(tp.topic, tp.partition) for tp in tps])
                return {tp: found[TopicPartition(tp.topic, tp.partition)] for tp in tps}
            except Exception:
                log.debug("could not read the log starts through a side consumer", exc_info=True)
            finally:
                await asking.stop()
        answer: Mapping[Any, int] = await consumer.earliest_offsets(*tps)
        return answer

    async def _first_offset_from(self, tp: tuple[str, int], offset: int) -> int | None:
        """The offset of the first record at or after ``offset`` in the log, or of the first record
        the log has when retention deleted ``offset`` (a separate, group-less consumer reads it);
        None when none arrives in time. Raises when the probe cannot read (the broker
        unreachable): that probe is stopped and forgotten, and the next call starts another."""
        async with self._probe_lock:
            probe = self._probe if self._probe is not None else await self._start_probe()
            try:
                return await self._probe_first(probe, tp, offset)
            except Exception:
                self._probe = None
                await probe.stop()
                raise

    async def _start_probe(self) -> AIOKafkaConsumer:
        """A started probe consumer, kept as ``self._probe`` only once its start succeeded: a
        consumer whose start failed is stopped (it may hold connections) and never reused."""
        # past retention: the first record that still exists
        probe = await started_side_consumer(self.app, auto_offset_reset="earliest")
        self._probe = probe
        return probe

    @staticmethod
    async def _probe_first(probe: AIOKafkaConsumer, tp: tuple[str, int], offset: int) -> int | None:
        partition = TopicPartition(*tp)
        probe.assign([partition])
        probe.seek(partition, offset)
        batches = await probe.getmany(partition, timeout_ms=PROBE_TIMEOUT_MS, max_records=1)
        records = batches.get(partition, [])
        if not records or records[0].offset < offset:
            return None  # past the log end, reset to its start: the log was truncated below offset
        return int(records[0].offset)

    async def close(self) -> None:
        if self._probe is not None:
            await self._probe.stop()
            self._probe = None


def guard_offsets(app: Any, topics: Iterable[str]) -> OffsetGuard:
    """Put keylane's offset ledger in charge of ``topics`` on ``app`` (see the module docstring)."""
    guard = guard_of(app)
    if guard is None:
        wrap_faust_consumer(guard_of)
        guard = OffsetGuard(app)
        setattr(app, _GUARD_ATTR, guard)
        app.sensors.add(CommitSensor(guard.on_commit))
        watch_cleared_queues(app, guard.queues_cleared)
        app.timer(LAG_REFRESH_S, name="keylane.consumer-lag")(guard.refresh_lag_timer)
        app.timer(STALL_CHECK_S, name="keylane.stall-check")(guard.reread_stalled)
        readiness(app).checks.append(guard.lag.stalled)
    topics = list(topics)
    guard.topics.update(topics)
    metrics.zero(metrics.POISON_RECORDS, map(metrics.topic_label, topics))
    metrics.zero(metrics.STALL_REREADS, map(metrics.topic_label, topics))
    return guard


def guard_of(app: Any) -> OffsetGuard | None:
    """The app's OffsetGuard, or None when ``guard_offsets`` never ran on it."""
    guard: OffsetGuard | None = getattr(app, _GUARD_ATTR, None)
    return guard
