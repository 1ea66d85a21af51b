"""RunAgent on Faust: input topics -> lanes -> KeyRuntime -> one table write -> publish -> ack.

Per input record, in order (the job a lane runs):

1. if the record sits on another partition than Kafka's default partitioner gives its key
   (a producer with another partitioner), re-produce it to the right partition and stop:
   its key's state and continuation live there. The copy carries the original's position
   (``keylane.origin``), so however often a crash makes this step repeat, the key applies
   the record once;
2. a record claiming to be a copy (``keylane.origin``) is checked against the original it
   names (service/keylane/kafka/origin_check.py); a false claim is dead-lettered as
   ``forged_origin``, never taken as a redelivery or as another record's identity;
3. ``KeyRuntime.handle`` decides, reading the key's state from the table;
4. the new state, if any, is written as one table value (one changelog record);
5. every emitted record is handed to the producer, with its deterministic id in the
   ``keylane.id`` header; one too large for its topic is replaced by its dead letter
   (``Publisher``, service/keylane/kafka/publish.py). A record that asks for an answer on
   one of the key's inputs (a tool intent, an approval request) leaves only once Kafka
   confirmed the state that waits for that answer: else a crash could leave the request in
   Kafka and its continuation nowhere, and the answer, read by the restarted worker before
   it re-runs the input, would be an ``orphaned_result``;
6. the job waits until Kafka confirmed the changelog record and every emit
   (service/keylane/kafka/delivery.py), and only then is the record acked, so its offset is
   never committed before what it produced is in Kafka. A record Kafka refused crashes the
   worker instead, with the input's offset uncommitted.

Every second a scan sends the due timers of this worker's keys to agent.timers (see
service/keylane/core/timers.py); the index behind it is rebuilt from the table after each
rebalance, in one synchronous pass, so no lane commit can interleave with it. The same index
counts the keys suspended now (``keylane_waiting_keys{kind}``, read at each scrape): it
holds the committed states of this worker's partitions only, so it is right across
rebalances too.
"""

from __future__ import annotations

import logging
import time
from functools import partial
from typing import Any

from msgspec.structs import replace

from keylane import metrics
from keylane.authoring.api import AgentConfig
from keylane.catalog import (
    APPROVAL_REQUESTS,
    APPROVALS,
    CONTROL,
    EVENTS,
    EVENTS_SHARDED,
    INTENTS,
    RESULTS,
    TIMERS,
    Catalog,
)
from keylane.core.activation import KeyRuntime
from keylane.core.apply import apply_decision
from keylane.core.key_states import KeyStates, entity_items
from keylane.core.lanes import (
    WINDOW_PER_IN_FLIGHT,
    KeyLanes,
    LaneScheduler,
    PartitionLanes,
    Superseded,
    leave_slot,
)
from keylane.core.state import STATE_TABLE, IntentKind, epoch_of
from keylane.core.timers import TimerIndex, due_timers
from keylane.kafka.app import (
    App,
    log_end,
    on_rebalance_complete,
    on_shutdown,
    recovery_completed,
    stored_bytes,
    stored_bytes_writer,
)
from keylane.kafka.delivery import RecordTooLarge, confirm_handed_off, confirming, track_changelog
from keylane.kafka.epochs import EpochFence, group_generation, owns_partition, request_rejoin
from keylane.kafka.lane_feed import lane_agent
from keylane.kafka.offset_guard import guard_offsets
from keylane.kafka.origin_check import origin_check_for
from keylane.kafka.partitioner import expected_partition
from keylane.kafka.pauses import PauseWatch
from keylane.kafka.publish import RAW, Publisher, raw_topic
from keylane.kafka.restore_start import RestoreStart
from keylane.records import ORIGIN_HEADER, Emit, InputRecord, error_emit, origin_header
from keylane.wire import encode

log = logging.getLogger(__name__)

TIMER_SCAN_INTERVAL_S = 1.0
ANSWERED_ON_INPUTS = frozenset({INTENTS, APPROVAL_REQUESTS})
"""Topics of records whose answer comes back on one of the key's inputs (agent.results,
agent.approvals): each leaves only after the state that awaits its answer is confirmed."""


def scheduler_for(config: AgentConfig) -> LaneScheduler:
    """The lane scheduler the config asks for."""
    if config.lanes == "partition":
        return PartitionLanes(window=WINDOW_PER_IN_FLIGHT * config.max_in_flight)
    return KeyLanes(max_in_flight=config.max_in_flight, worker_max_in_flight=config.worker_max_in_flight)


class AgentProcessor:
    """Installs the RunAgent Faust agent for one keylane agent on an app."""

    def __init__(
        self,
        app: App,
        catalog: Catalog,
        runtime: KeyRuntime,
        *,
        sharded: bool,
        lanes: LaneScheduler | None = None,
    ) -> None:
        self.app = app
        self.catalog = catalog
        self.runtime = runtime
        self.lanes: LaneScheduler = lanes or scheduler_for(runtime.config)
        self.partitions = catalog[EVENTS].partitions
        events = EVENTS_SHARDED if sharded else EVENTS
        self.logical_by_name = {catalog.name(t): t for t in (events, RESULTS, APPROVALS, TIMERS, CONTROL)}
        self.inputs = app.topic(*self.logical_by_name, **RAW)
        self.offsets = guard_offsets(app, self.logical_by_name)
        self.offsets.grace_s = runtime.config.rebalance_grace_s
        self._reroute_topics = {name: raw_topic(app, name) for name in self.logical_by_name}
        # key_type/value_type bytes make Faust use the raw codec for both.
        self.table = app.Table(
            STATE_TABLE, default=None, partitions=self.partitions, key_type=bytes, value_type=bytes
        )
        track_changelog(self.table)  # a state write counts as produced only once Kafka has it
        # The store's own read and write, not the table's get and set: those look a key up
        # twice (a contains check for its default, then the read), or run the raw codec
        # over bytes, once per record; see stored_bytes.
        self.states = KeyStates(stored_bytes(self.table), stored_bytes_writer(self.table))
        self.fence = EpochFence(self.table, epoch_of, owns=owns_partition(app, catalog.name(events)))
        self.fence.install()  # a restore never takes a former owner's late write over its successor's
        # ... nor starts past records a former owner wrote while this worker was away
        RestoreStart(self.table, app).install()
        self.pauses = PauseWatch(
            float(app.conf.broker_session_timeout),
            generation=partial(group_generation, app),
            on_pause=partial(request_rejoin, app),
        ).start()
        self.publisher = Publisher(app, catalog, runtime)
        self.origins = origin_check_for(app)
        lane_agent(
            app,
            self.inputs,
            name="keylane.run-agent",
            lanes=self.lanes,
            handle=self.process,
            on_poison=self.dead_letter,
        )
        self.timers = TimerIndex()
        waiting_kinds: tuple[IntentKind, ...] = ("approval", "tool")
        for kind in waiting_kinds:  # read at each scrape: the index knows the suspended keys
            metrics.WAITING_KEYS.labels(kind).set_function(partial(self.timers.waiting, kind))
        metrics.QUARANTINED_KEYS.set_function(lambda: len(runtime.quarantine))
        metrics.PAUSED_KEYS.set_function(self.timers.paused)
        counters = (
            metrics.REDELIVERIES,
            metrics.RECORDS_REROUTED,
            metrics.STREAMS_RESTARTED,
            metrics.INPUTS_HELD,
            metrics.REDRIVEN_RECORDS,
        )
        for counter in counters:
            metrics.zero(counter, self.logical_by_name.values())
        self._timers_topic = raw_topic(app, catalog.name(TIMERS))
        self._rebuild_timers = True
        on_rebalance_complete(app, self._on_rebalance_complete)
        app.timer(TIMER_SCAN_INTERVAL_S, name="keylane.timer-scan")(self.scan_timers)
        on_shutdown(app, self._stop_lanes)  # after Faust waited for every unacked record (our queued jobs)

    async def dead_letter(self, event: Any, exc: Exception) -> None:
        """A record whose processing kept raising: its dead letter (raw bytes and the
        exception) replaces it, and the partition moves on once Kafka has the dead letter."""
        message = event.message
        record = InputRecord.of(self.logical_by_name[message.topic], message)
        detail = f"{type(exc).__name__}: {exc}"
        async with confirming(self.app):
            await self.publisher.publish(
                error_emit(record, "processing_failed", detail, now_ms=self.runtime.clock())
            )

    async def process(self, event: Any) -> None:
        """Steps 1-6 of the module docstring for one Faust event: returns once Kafka
        confirmed everything it produced."""
        async with confirming(self.app):
            await self._process(event)
            leave_slot()  # waiting for Kafka's confirmation holds this key's lane, not a slot

    async def _process(self, event: Any) -> None:
        started = time.monotonic()
        message = event.message
        key: bytes | None = message.key
        if key is not None and expected_partition(key, self.partitions) != message.partition:
            try:
                await self._reroute(message)
            except RecordTooLarge as refused:  # the copy's headers took it over the limit
                await self.publisher.refuse(refused)
            return
        record = InputRecord.of(
            self.logical_by_name[message.topic],
            message,
            log_end=self._log_end(message),
            epoch=group_generation(self.app),  # read as the job starts: see kafka/epochs.py
        )
        if record.redrive is not None:
            metrics.REDRIVEN_RECORDS.labels(metrics.topic_label(record.topic)).inc()
        if record.origin is not None:
            forged = await self.origins.forged(record.origin, key=key, value=message.value)
            if forged is not None:
                await self.publisher.publish(self._forged(record, forged))
                return
        # Checked before the model runs too: a worker thawed after its session timeout fetches
        # and starts new records before its pause watch or heartbeat has told it, and a job
        # released at its write would have called the model for nothing.
        self._check_still_owner(record, started, "unrun")
        decision = await self.runtime.handle(record, self.states.read)
        self._check_still_owner(record, started, "unwritten")
        state_confirmed = False
        for emit in apply_decision(self.states, self.timers, key, decision):
            if not state_confirmed and emit.topic in ANSWERED_ON_INPUTS:
                await confirm_handed_off()  # step 5: the waiting state first
                # A wait for Kafka is where a stopped process resumes: a worker that lost the
                # partition meanwhile leaves the request to the owner, which runs it again.
                self._check_still_owner(record, started, "unsent")
                state_confirmed = True
            await self.publisher.publish(emit)

    async def _stop_lanes(self) -> None:
        await self.lanes.stop()
        await self.offsets.close()
        await self.origins.close()
        self.pauses.stop()
        close_provider = getattr(self.runtime.provider, "aclose", None)
        if close_provider is not None:
            await close_provider()  # pooled HTTP connections of a real provider

    async def _on_rebalance_complete(self) -> None:
        self._rebuild_timers = True

    async def scan_timers(self) -> None:
        """Send a TimerFired for every due timer of this worker's keys into the key's partition."""
        if self._rebuild_timers:
            if not recovery_completed(self.app):
                return
            self._rebuild_timers = False
            healed = self.fence.heal()
            if healed:
                log.warning("rewrote %s keys whose last changelog record was a former owner's", healed)
            # A blob that does not read quarantines its key instead of failing the whole
            # rebuild (which would fail it again on every worker the partition moves to).
            self.timers.rebuild(self.runtime.quarantine.readable(entity_items(self.table.items())))
            log.info(
                "timer index rebuilt: %s keys with timers, %s quarantined",
                len(self.timers),
                len(self.runtime.quarantine),
            )
        # Confirmed like a lane job's records: a timer command Kafka refused crashes the worker
        # (service/keylane/kafka/delivery.py) rather than leave its key waiting for good.
        async with confirming(self.app):
            for due in due_timers(self.timers, self.runtime.clock()):
                try:
                    await self._timers_topic.send(
                        key=due.key,
                        value=encode(due.fired),
                        partition=expected_partition(due.key, self.partitions),
                    )
                except Exception:
                    log.warning("could not send timer %s for %r; retrying", due.kind, due.key, exc_info=True)
                    self.timers.resend(due.key, due.kind, due.timer)
                    continue
                metrics.TIMERS_SENT.labels(due.kind).inc()

    def _check_still_owner(self, record: InputRecord, started: float, released: str) -> None:
        """Raise Superseded, before anything is written, when the record's partition may have
        a new owner: the process stood still past its session timeout since the job started,
        or the job's generation is one it held when it stood still
        (service/keylane/kafka/pauses.py), or the consumer is in no generation now or not in
        the one the job started in (a rebalance, or an eviction it noticed)."""
        generation = group_generation(self.app)
        if generation < 0 or generation != record.epoch or self.pauses.interrupted(started, record.epoch):
            log.warning(
                "releasing %s/%s/%s %s: its partition may have moved since the job started "
                "(generation %s, now %s)",
                record.broker_topic,
                record.partition,
                record.offset,
                released,
                record.epoch,
                generation,
            )
            raise Superseded(f"{record.broker_topic}/{record.partition}/{record.offset}")

    def _forged(self, record: InputRecord, why: str) -> Emit:
        """The dead letter of a record whose ``keylane.origin`` is false: under its own
        position, since the identity it claims is not its own."""
        topic, partition, offset = record.origin or ("", 0, 0)
        detail = (
            f"keylane.origin {topic}/{partition}/{offset} is forged: {why}; the record was not run "
            "(produce it again without the keylane.origin header if it is a real input)"
        )
        key = record.key.decode(errors="replace") if record.key is not None else None
        return error_emit(
            replace(record, origin=None), "forged_origin", detail, now_ms=self.runtime.clock(), entity_key=key
        )

    def _log_end(self, message: Any) -> int | None:
        """The consumer's high watermark of the record's partition (None when unknown): only a
        hint, a recreated topic goes unnoticed without it."""
        return log_end(self.app, message.topic, message.partition)

    async def _reroute(self, message: Any) -> None:
        metrics.RECORDS_REROUTED.labels(self.logical_by_name[message.topic]).inc()
        log.info(
            "record %s/%s/%s is on the wrong partition for its key; re-producing it",
            message.topic,
            message.partition,
            message.offset,
        )
        kept = [(k, v) for k, v in (message.headers or []) if k != ORIGIN_HEADER]
        headers = [*kept, origin_header(message)]
        await self._reroute_topics[message.topic].send(
            key=message.key,
            value=message.value,
            partition=expected_partition(message.key, self.partitions),
            headers=headers,
        )
