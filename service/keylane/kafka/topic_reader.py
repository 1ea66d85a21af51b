"""Read every record of a topic up to its current end: a snapshot, for CLIs and tests."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, TopicPartition

from keylane.config import Settings
from keylane.kafka.topic_admin import admin_client, broker_unreachable
from keylane.records import ID_HEADER


@dataclass(frozen=True)
class TopicRecord:
    """One record as read: key, value, headers, where it sits and when it was written."""

    key: bytes | None
    value: bytes | None
    headers: dict[str, bytes]
    partition: int
    offset: int
    timestamp_ms: int

    @property
    def record_id(self) -> str:
        """The deterministic id keylane put in the record's ID_HEADER (KeyError if none)."""
        return self.headers[ID_HEADER].decode()


async def partition_ids(settings: Settings, topic: str) -> list[int]:
    """The partition numbers of ``topic``, from the broker."""
    async with admin_client(settings) as client:
        (described,) = await client.describe_topics([topic])
    if described["error_code"] != 0:
        raise LookupError(f"topic {topic} does not exist (error {described['error_code']})")
    return sorted(p["partition"] for p in described["partitions"])


async def read_to_end(
    settings: Settings, topic: str, *, partitions: list[int] | None = None, timeout_s: float = 30.0
) -> list[TopicRecord]:
    """Every record of ``topic`` (of its ``partitions`` only, when given) up to the end offsets
    at the time of the call, per partition in offset order. Uses no consumer group: it commits
    nothing and disturbs no one."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.bootstrap_list, enable_auto_commit=False, auto_offset_reset="earliest"
    )
    try:
        await consumer.start()
    except Exception as exc:  # aiokafka's start raises several types for one cause: no broker
        await consumer.stop()
        raise broker_unreachable(settings, exc) from exc
    try:
        chosen = partitions if partitions is not None else await partition_ids(settings, topic)
        assigned = [TopicPartition(topic, p) for p in chosen]
        consumer.assign(assigned)
        ends = await consumer.end_offsets(assigned)
        for tp in assigned:
            consumer.seek(tp, 0)
        records: list[TopicRecord] = []
        async with asyncio.timeout(timeout_s):
            while [tp for tp in assigned if await consumer.position(tp) < ends[tp]]:
                batch = await consumer.getmany(timeout_ms=500)
                for messages in batch.values():
                    records.extend(
                        TopicRecord(m.key, m.value, dict(m.headers or ()), m.partition, m.offset, m.timestamp)
                        for m in messages
                        if m.offset < ends[TopicPartition(topic, m.partition)]
                    )
        return records
    finally:
        await consumer.stop()
