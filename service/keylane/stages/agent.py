"""RunAgent on Faust: input topics -> lanes -> KeyRuntime -> one table write -> publish -> ack.

Per input record, in order (the job a lane runs):

1. if the record sits on another partition than Kafka's default partitioner gives its key
   (a producer with another partitioner), re-produce it to the right partition and stop:
   its key's state and continuation live there. The copy carries the original's position
   (``keylane.origin``), so however often a crash makes this step repeat, the key applies
   the record once;
2. ``KeyRuntime.handle`` decides, reading the key's state from the table;
3. the new state, if any, is written as one table value (one changelog record);
4. every emitted record is handed to the producer, with its deterministic id in the
   ``keylane.id`` header; one too large for its topic is replaced by its dead letter
   (``Publisher``);
5. the job waits until Kafka confirmed the changelog record and every emit
   (service/keylane/kafka/delivery.py), and only then is the record acked, so its offset is
   never committed before what it produced is in Kafka. A record Kafka refused crashes the
   worker instead, with the input's offset uncommitted.

Every second a scan sends the due timers of this worker's keys to agent.timers (see
service/keylane/core/timers.py); the index behind it is rebuilt from the table after each
rebalance, in one synchronous pass, so no lane commit can interleave with it.
"""

from __future__ import annotations

import logging
from typing import Any

import faust
from faust.types import TP

from keylane import metrics
from keylane.authoring.api import AgentConfig
from keylane.catalog import (
    APPROVALS,
    ERRORS,
    EVENTS,
    EVENTS_SHARDED,
    INTENTS,
    OUTPUT,
    RESULTS,
    TIMERS,
    Catalog,
)
from keylane.clock import wall_clock_ms
from keylane.core.activation import KeyRuntime
from keylane.core.lanes import WINDOW_PER_IN_FLIGHT, KeyLanes, LaneScheduler, PartitionLanes
from keylane.core.state import KeyState, decode_state, encode_state
from keylane.core.timers import TimerIndex
from keylane.kafka.delivery import (
    ConfirmedTopic,
    RecordTooLarge,
    confirming,
    delivery_guard,
    record_size,
    track_changelog,
)
from keylane.kafka.faust_glue import expected_partition, feed_lanes, guard_offsets
from keylane.records import (
    ID_HEADER,
    ORIGIN_HEADER,
    Emit,
    InputRecord,
    error_emit,
    origin_header,
    position_of,
    shrunk_error,
    too_large_emit,
)
from keylane.wire import TimerFired, encode

log = logging.getLogger(__name__)

STATE_TABLE = "keylane-state"
TIMER_SCAN_INTERVAL_S = 1.0
_RAW: dict[str, Any] = {
    "key_type": bytes,
    "value_type": bytes,
    "key_serializer": "raw",
    "value_serializer": "raw",
}


def scheduler_for(config: AgentConfig) -> LaneScheduler:
    """The lane scheduler the config asks for."""
    if config.lanes == "partition":
        return PartitionLanes(window=WINDOW_PER_IN_FLIGHT * config.max_in_flight)
    return KeyLanes(max_in_flight=config.max_in_flight, worker_max_in_flight=config.worker_max_in_flight)


def raw_topic(app: faust.App, name: str) -> ConfirmedTopic:
    """A Faust topic that passes key and value bytes through untouched; its sends are
    size-checked and confirmed (service/keylane/kafka/delivery.py)."""
    return ConfirmedTopic(app, topics=[name], **_RAW)


class Publisher:
    """Publishes Emits to their catalog topics and keeps the metric identities.

    A record too large for its topic (over min(the producer's max request size, the topic's
    max.message.bytes)) is never handed to the producer, where it would fail on every
    redelivery: an error record goes out with digests instead of its raw bytes
    (``shrunk_error``), anything else is replaced by its ``record_too_large`` dead letter
    (``too_large_emit``). The input record stays in its topic, whole. Once Kafka took the
    dead letter the original counts as delivered too, so it leaves the key's outbox.
    """

    def __init__(self, app: faust.App, catalog: Catalog, runtime: KeyRuntime | None = None) -> None:
        self._names = {
            logical: catalog.name(logical)
            for logical in (OUTPUT, INTENTS, ERRORS, RESULTS, "agent.approval-requests")
        }
        self._topics = {logical: raw_topic(app, name) for logical, name in self._names.items()}
        self._logical = {spec.name: spec.logical_name for spec in catalog}
        self._guard = delivery_guard(app)
        self._guard.set_limits((spec.name, spec.max_message_bytes) for spec in catalog)
        self._runtime = runtime

    def producible(self, emit: Emit) -> Emit:
        """``emit``, or the dead letter that replaces it when it is too large to produce."""
        size = record_size(emit.key, emit.value, _headers(emit))
        limit = self._guard.limit(self._names[emit.topic])
        if size <= limit:
            return emit
        if emit.topic == ERRORS:
            letter = shrunk_error(emit, size=size, limit=limit)
        else:
            letter = too_large_emit(
                topic=emit.topic,
                record_id=emit.record_id,
                key=emit.key,
                value=emit.value,
                size=size,
                limit=limit,
                origin=_input_position(),
                now_ms=wall_clock_ms(),
            )
        metrics.RECORDS_TOO_LARGE.labels(emit.topic).inc()
        log.warning(
            "%s record %s is %s bytes, over its %s-byte limit: producing dead letter %s instead",
            emit.topic,
            emit.record_id,
            size,
            limit,
            letter.record_id,
        )
        return letter

    async def publish(self, emit: Emit) -> None:
        """Hand one record (or its dead letter, see the class docstring) to the producer.
        Inside ``confirming`` the block waits for Kafka to confirm it; the key's outbox
        learns of the delivery through the callback."""
        sent = self.producible(emit)
        runtime = self._runtime
        record_ids = {emit.record_id, sent.record_id}
        if runtime is not None:
            for record_id in record_ids:
                runtime.on_published(record_id)

        def delivered(_: Any) -> None:
            if runtime is not None:
                for record_id in record_ids:
                    runtime.on_delivered(record_id)

        await self._topics[sent.topic].send(
            key=sent.key, value=sent.value, headers=_headers(sent), callback=delivered
        )
        _count(sent)

    async def refuse(self, refused: RecordTooLarge) -> None:
        """Publish the ``record_too_large`` dead letter of a copy (a re-routed record, a
        sharded event) that was too large to produce."""
        logical = self._logical.get(refused.topic, refused.topic)
        log.warning(
            "a %s copy is %s bytes, over its %s-byte limit: producing its dead letter instead",
            logical,
            refused.size,
            refused.limit,
        )
        metrics.RECORDS_TOO_LARGE.labels(logical).inc()
        letter = too_large_emit(
            topic=logical,
            record_id=None,
            key=refused.key,
            value=refused.value,
            size=refused.size,
            limit=refused.limit,
            origin=_input_position(),
            now_ms=wall_clock_ms(),
        )
        await self.publish(letter)


def _headers(emit: Emit) -> list[tuple[str, bytes]]:
    return [(ID_HEADER, emit.record_id.encode())]


def _input_position() -> tuple[str, int, int] | None:
    """(topic, partition, offset) of the input record the running lane job processes."""
    event = faust.current_event()
    return None if event is None else position_of(event.message)


def _count(emit: Emit) -> None:
    if emit.topic == INTENTS:
        metrics.INTENTS_EMITTED.inc()
    elif emit.topic == OUTPUT:
        metrics.OUTPUTS.inc()
    elif emit.topic == ERRORS:
        if emit.orphan_detail is not None:
            metrics.ORPHANED_RESULTS.labels(emit.orphan_detail).inc()
        else:
            metrics.AGENT_ERRORS.labels(emit.error_reason or "unknown").inc()


class AgentProcessor:
    """Installs the RunAgent Faust agent for one keylane agent on an app."""

    def __init__(
        self,
        app: faust.App,
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
        self.logical_by_name = {catalog.name(t): t for t in (events, RESULTS, APPROVALS, TIMERS)}
        self.inputs = app.topic(*self.logical_by_name, **_RAW)
        self.offsets = guard_offsets(app, self.logical_by_name)
        self.offsets.grace_s = runtime.config.rebalance_grace_s
        self._reroute_topics = {name: raw_topic(app, name) for name in self.logical_by_name}
        # key_type/value_type bytes make Faust use the raw codec for both.
        self.table = app.Table(
            STATE_TABLE, default=None, partitions=self.partitions, key_type=bytes, value_type=bytes
        )
        track_changelog(self.table)  # a state write counts as produced only once Kafka has it
        self.publisher = Publisher(app, catalog, runtime)
        app.agent(self.inputs, name="keylane.run-agent")(self._consume)
        self.timers = TimerIndex()
        self._timers_topic = raw_topic(app, catalog.name(TIMERS))
        self._rebuild_timers = True
        app.on_rebalance_complete.connect(self._on_rebalance_complete)  # type: ignore[arg-type]  # see below
        app.timer(TIMER_SCAN_INTERVAL_S, name="keylane.timer-scan")(self.scan_timers)
        # Faust waits for every unacked record (our queued jobs) before this signal fires.
        app.on_before_shutdown.connect(self._stop_lanes)  # type: ignore[arg-type]  # mode types receivers as positional-only

    async def _consume(self, stream: Any) -> None:
        await feed_lanes(stream, self.lanes, self.process, on_poison=self.dead_letter)

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
        """Steps 1-5 of the module docstring for one Faust event: returns once Kafka
        confirmed everything it produced."""
        async with confirming(self.app):
            await self._process(event)

    async def _process(self, event: Any) -> None:
        message = event.message
        key: bytes | None = message.key
        if key is not None and expected_partition(key, self.partitions) != message.partition:
            try:
                await self._reroute(message)
            except RecordTooLarge as refused:  # the copy's headers took it over the limit
                await self.publisher.refuse(refused)
            return
        record = InputRecord.of(self.logical_by_name[message.topic], message, log_end=self._log_end(message))
        decision = await self.runtime.handle(record, self._state_of)
        if decision.new_state is not None:
            assert key is not None
            self.table[key] = decision.blob if decision.blob is not None else encode_state(decision.new_state)
            self.timers.update(key, decision.new_state)
        for emit in decision.emits:
            await self.publisher.publish(emit)

    async def _stop_lanes(self, sender: Any, *args: Any, signal: Any, **kwargs: Any) -> None:
        await self.lanes.stop()
        await self.offsets.close()
        close_provider = getattr(self.runtime.provider, "aclose", None)
        if close_provider is not None:
            await close_provider()  # pooled HTTP connections of a real provider

    async def _on_rebalance_complete(self, sender: Any, *args: Any, signal: Any, **kwargs: Any) -> None:
        self._rebuild_timers = True

    async def scan_timers(self) -> None:
        """Send a TimerFired for every due timer of this worker's keys into the key's partition."""
        if self._rebuild_timers:
            if not self.app.tables.recovery.completed.is_set():  # type: ignore[attr-defined]  # TableManager, not its Protocol
                return
            self._rebuild_timers = False
            self.timers.rebuild((key, decode_state(blob)) for key, blob in self.table.items())
            log.info("timer index rebuilt: %s keys with timers", len(self.timers))
        # Confirmed like a lane job's records: a timer command Kafka refused crashes the worker
        # (service/keylane/kafka/delivery.py) rather than leave its key waiting for good.
        async with confirming(self.app):
            for key, kind, timer in self.timers.due(self.runtime.clock()):
                fired = TimerFired(
                    entity_key=key.decode(), kind=kind, token=timer.token, deadline_ms=timer.deadline_ms
                )
                try:
                    await self._timers_topic.send(
                        key=key, value=encode(fired), partition=expected_partition(key, self.partitions)
                    )
                except Exception:
                    log.warning("could not send timer %s for %r; retrying", kind, key, exc_info=True)
                    self.timers.resend(key, kind, timer)
                    continue
                metrics.TIMERS_SENT.labels(kind).inc()

    def _state_of(self, key: bytes) -> KeyState:
        return decode_state(self.table.get(key))

    def _log_end(self, message: Any) -> int | None:
        """The consumer's high watermark of the record's partition (None when unknown)."""
        try:
            end = self.app.consumer.highwater(TP(message.topic, message.partition))
        except Exception:  # noqa: BLE001 - only a hint: a recreated topic goes unnoticed without it
            return None
        return end if isinstance(end, int) and end >= 0 else None

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
