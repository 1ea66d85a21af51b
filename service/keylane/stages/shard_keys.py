"""ShardKeys: the Faust stage that fans a hot logical key out over N physical keys.

It consumes agent.events (logical keys) and produces agent.events.sharded with the record
key and the envelope's ``entity_key`` both rewritten to ``key#i`` (see service/keylane/keys.py for
the assignment). Only events pass through it: tool results and approvals already carry
the physical key, and re-sharding them would route them away from their continuation.

A record it cannot read becomes ``malformed_record`` on agent.errors; it is never dropped.
A copy too large for agent.events.sharded becomes ``record_too_large`` there instead. A
record is acked only once Kafka confirmed its copy or its dead letter
(service/keylane/kafka/delivery.py).

Every copy carries its original's position (``keylane.origin``). A crash or a rebalance makes
the stage copy a record again at a new offset; with ``hash`` assignment the copy lands on
the same physical key, which recognises it by origin and applies it once. ``round_robin``
is the one mode that cannot promise this: a second copy may go to another shard, which has
never seen it.
"""

from __future__ import annotations

from typing import Any

from keylane.catalog import EVENTS, EVENTS_SHARDED, Catalog
from keylane.clock import wall_clock_ms
from keylane.core.lanes import PartitionLanes
from keylane.kafka.app import App, on_shutdown
from keylane.kafka.delivery import RecordTooLarge, confirming
from keylane.kafka.lane_feed import lane_agent
from keylane.kafka.offset_guard import guard_offsets
from keylane.kafka.publish import Publisher, raw_topic
from keylane.keys import Assignment, ShardAssigner
from keylane.records import InputRecord, error_emit, origin_header, redrive_headers
from keylane.wire import AgentEnvelope, MalformedRecord, decode, decode_key, encode


class ShardKeys:
    """``ShardKeys(4)``: route each event to one of 4 physical keys of its logical key."""

    def __init__(self, n: int, *, assignment: Assignment = "hash") -> None:
        self.assigner = ShardAssigner(n, assignment=assignment)

    def reshard(self, key: bytes | None, value: bytes | None) -> tuple[bytes, bytes]:
        """(physical key, rewritten value) for one agent.events record, or MalformedRecord."""
        key_text = decode_key(key)
        envelope = decode(value, AgentEnvelope)
        envelope.payload_bytes()
        if envelope.entity_key is not None and envelope.entity_key != key_text:
            raise MalformedRecord(
                f"entity_key {envelope.entity_key!r} differs from the record key {key_text!r}"
            )
        assert key is not None and value is not None
        physical = self.assigner.physical_key(key, value)
        envelope.entity_key = physical.decode()
        return physical, encode(envelope)

    def install(self, app: App, catalog: Catalog, publisher: Publisher) -> None:
        """Add the stage to a Faust app: agent.events -> agent.events.sharded, in offset order
        per partition and acked only after Kafka confirmed the sharded record."""
        source = raw_topic(app, catalog.name(EVENTS))
        target = raw_topic(app, catalog.name(EVENTS_SHARDED))
        lanes = PartitionLanes()
        offsets = guard_offsets(app, [catalog.name(EVENTS)])

        async def copy(event: Any) -> None:
            message = event.message
            try:
                physical, value = self.reshard(message.key, message.value)
            except MalformedRecord as exc:
                record = InputRecord.of(EVENTS, message)
                await publisher.publish(
                    error_emit(record, "malformed_record", exc.detail, now_ms=wall_clock_ms())
                )
                return
            try:
                # A re-driven event's copy keeps its re-drive count for its dead letter, if any.
                headers = [*redrive_headers(message.headers), origin_header(message)]
                await target.send(key=physical, value=value, headers=headers)
            except RecordTooLarge as refused:  # the rewritten envelope grew past the limit
                await publisher.refuse(refused)

        async def forward(event: Any) -> None:
            async with confirming(app):
                await copy(event)

        async def dead_letter(event: Any, exc: Exception) -> None:
            record = InputRecord.of(EVENTS, event.message)
            detail = f"{type(exc).__name__}: {exc}"
            async with confirming(app):
                await publisher.publish(
                    error_emit(record, "processing_failed", detail, now_ms=wall_clock_ms())
                )

        async def stop_lanes() -> None:
            await lanes.stop()
            await offsets.close()

        lane_agent(app, source, name="keylane.shard-keys", lanes=lanes, handle=forward, on_poison=dead_letter)
        on_shutdown(app, stop_lanes)
