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
   ``keylane.id`` header;
5. the record is acked. Faust flushes the producer before it commits offsets, so the
   changelog record and the emits are durable before the input's offset is committed.

Every second a scan sends the due timers of this worker's keys to agent.timers (see
service/runtime/timers.py); the index behind it is rebuilt from the table after each
rebalance, in one synchronous pass, so no lane commit can interleave with it.
"""

from __future__ import annotations

import logging
from typing import Any

import faust
from faust.types import TP

from service import metrics
from service.catalog import (
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
from service.records import ID_HEADER, ORIGIN_HEADER, Emit, InputRecord, error_emit, origin_header
from service.runtime.activation import KeyRuntime
from service.runtime.api import AgentConfig
from service.runtime.faust_glue import expected_partition, feed_lanes, guard_offsets
from service.runtime.lanes import WINDOW_PER_IN_FLIGHT, KeyLanes, LaneScheduler, PartitionLanes
from service.runtime.state import KeyState, decode_state, encode_state
from service.runtime.timers import TimerIndex
from service.wire import TimerFired, encode

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


def raw_topic(app: faust.App, name: str) -> Any:
    """A Faust topic that passes key and value bytes through untouched."""
    return app.topic(name, **_RAW)


class Publisher:
    """Publishes Emits to their catalog topics and keeps the metric identities."""

    def __init__(self, app: faust.App, catalog: Catalog, runtime: KeyRuntime | None = None) -> None:
        self._topics = {
            logical: raw_topic(app, catalog.name(logical))
            for logical in (OUTPUT, INTENTS, ERRORS, RESULTS, "agent.approval-requests")
        }
        self._runtime = runtime

    async def publish(self, emit: Emit) -> None:
        """Hand one record to the producer; delivery is confirmed through a callback."""
        runtime = self._runtime
        if runtime is not None:
            runtime.on_published(emit.record_id)

        def delivered(_: Any) -> None:
            if runtime is not None:
                runtime.on_delivered(emit.record_id)

        await self._topics[emit.topic].send(
            key=emit.key,
            value=emit.value,
            headers=[(ID_HEADER, emit.record_id.encode())],
            callback=delivered,
        )
        _count(emit)


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
        exception) replaces it, and the partition moves on."""
        message = event.message
        record = InputRecord.of(self.logical_by_name[message.topic], message)
        detail = f"{type(exc).__name__}: {exc}"
        await self.publisher.publish(
            error_emit(record, "processing_failed", detail, now_ms=self.runtime.clock())
        )

    async def process(self, event: Any) -> None:
        """Steps 1-4 of the module docstring for one Faust event."""
        message = event.message
        key: bytes | None = message.key
        if key is not None and expected_partition(key, self.partitions) != message.partition:
            await self._reroute(message)
            return
        record = InputRecord.of(self.logical_by_name[message.topic], message, log_end=self._log_end(message))
        decision = await self.runtime.handle(record, self._state_of)
        if decision.new_state is not None:
            assert key is not None
            self.table[key] = encode_state(decision.new_state)
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
