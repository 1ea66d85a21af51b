"""RunAgent on Faust: input topics -> lanes -> KeyRuntime -> one table write -> publish -> ack.

Per input record, in order (the job a lane runs):

1. if the record sits on another partition than Kafka's default partitioner gives its key
   (a producer with another partitioner), re-produce it to the right partition and stop:
   its key's state and continuation live there;
2. ``KeyRuntime.handle`` decides, reading the key's state from the table;
3. the new state, if any, is written as one table value (one changelog record);
4. every emitted record is handed to the producer, with its deterministic id in the
   ``keylane.id`` header;
5. the record is acked. Faust flushes the producer before it commits offsets, so the
   changelog record and the emits are durable before the input's offset is committed.
"""

from __future__ import annotations

import logging
from typing import Any

import faust

from service import metrics
from service.catalog import APPROVALS, ERRORS, EVENTS, EVENTS_SHARDED, INTENTS, OUTPUT, RESULTS, Catalog
from service.records import Emit, InputRecord
from service.runtime.activation import KeyRuntime
from service.runtime.faust_glue import event_context, expected_partition
from service.runtime.lanes import LaneScheduler, PartitionLanes
from service.runtime.state import KeyState, decode_state, encode_state

log = logging.getLogger(__name__)

STATE_TABLE = "keylane-state"
ID_HEADER = "keylane.id"
REROUTED_HEADER = "keylane.rerouted-from"
_RAW: dict[str, Any] = {
    "key_type": bytes,
    "value_type": bytes,
    "key_serializer": "raw",
    "value_serializer": "raw",
}


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
        self.lanes: LaneScheduler = lanes or PartitionLanes()
        self.partitions = catalog[EVENTS].partitions
        events = EVENTS_SHARDED if sharded else EVENTS
        self.logical_by_name = {catalog.name(t): t for t in (events, RESULTS, APPROVALS)}
        self.inputs = app.topic(*self.logical_by_name, **_RAW)
        self._reroute_topics = {name: raw_topic(app, name) for name in self.logical_by_name}
        # key_type/value_type bytes make Faust use the raw codec for both.
        self.table = app.Table(
            STATE_TABLE, default=None, partitions=self.partitions, key_type=bytes, value_type=bytes
        )
        self.publisher = Publisher(app, catalog, runtime)
        app.agent(self.inputs, name="keylane.run-agent")(self._consume)
        # Faust waits for every unacked record (our queued jobs) before this signal fires.
        app.on_before_shutdown.connect(self._stop_lanes)  # type: ignore[arg-type]  # mode types receivers as positional-only

    async def _consume(self, stream: Any) -> None:
        async for event in stream.noack().events():
            message = event.message
            await self.lanes.submit(message.partition, message.key, self._job(stream, event))

    def _job(self, stream: Any, event: Any) -> Any:
        async def run() -> None:
            with event_context(event):
                await self.process(event)
            await stream.ack(event)

        return run

    async def process(self, event: Any) -> None:
        """Steps 1-4 of the module docstring for one Faust event."""
        message = event.message
        key: bytes | None = message.key
        if key is not None and expected_partition(key, self.partitions) != message.partition:
            await self._reroute(message)
            return
        record = InputRecord(
            topic=self.logical_by_name[message.topic],
            broker_topic=message.topic,
            partition=message.partition,
            offset=message.offset,
            key=key,
            value=message.value,
        )
        decision = await self.runtime.handle(record, self._state_of)
        if decision.new_state is not None:
            assert key is not None
            self.table[key] = encode_state(decision.new_state)
        for emit in decision.emits:
            await self.publisher.publish(emit)

    async def _stop_lanes(self, sender: Any, *args: Any, signal: Any, **kwargs: Any) -> None:
        await self.lanes.stop()

    def _state_of(self, key: bytes) -> KeyState:
        return decode_state(self.table.get(key))

    async def _reroute(self, message: Any) -> None:
        origin = f"{message.topic}/{message.partition}/{message.offset}"
        metrics.RECORDS_REROUTED.labels(self.logical_by_name[message.topic]).inc()
        log.info("record %s is on the wrong partition for its key; re-producing it", origin)
        headers = [*(message.headers or []), (REROUTED_HEADER, origin.encode())]
        await self._reroute_topics[message.topic].send(
            key=message.key,
            value=message.value,
            partition=expected_partition(message.key, self.partitions),
            headers=headers,
        )
