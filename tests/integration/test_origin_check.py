"""OriginCheck on a real broker: copies checked in their originals' order, or a little ahead of
it, read the log once through, one batch after another, without repositioning its consumer. A
seek (or an assign) drops what the consumer fetched ahead, and the fetch that replaces it waits
for the one in flight, a long poll at the log's end: ShardKeys' lanes stood still for half a
second every FETCH_RECORDS copies before."""

from __future__ import annotations

from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from keylane.catalog import EVENTS, Catalog
from keylane.config import Settings
from keylane.kafka.origin_check import FETCH_RECORDS, OriginCheck
from keylane.kafka.partitioner import expected_partition
from tests.kafka_io import kcat_produce

pytestmark = pytest.mark.kafka

KEY = b"origin-check"


class SeekCounting:
    """Starts the real consumers OriginCheck reads with, counting their seeks and assigns."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.repositions: list[tuple[str, Any]] = []

    async def __call__(self) -> AIOKafkaConsumer:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.settings.bootstrap_list,
            enable_auto_commit=False,
            auto_offset_reset="none",
        )
        await consumer.start()
        seek, assign = consumer.seek, consumer.assign

        def counted_seek(tp: TopicPartition, offset: int) -> None:
            self.repositions.append(("seek", offset))
            seek(tp, offset)

        def counted_assign(partitions: list[TopicPartition]) -> None:
            self.repositions.append(("assign", partitions))
            assign(partitions)

        consumer.seek, consumer.assign = counted_seek, counted_assign  # type: ignore[method-assign]
        return consumer


@pytest.mark.timeout(180)
async def test_copies_in_their_originals_order_read_the_log_without_a_seek_per_batch(
    settings: Settings, catalog: Catalog
) -> None:
    topic = catalog.name(EVENTS)
    partition = expected_partition(KEY, catalog[EVENTS].partitions)
    count = 2 * FETCH_RECORDS + 200  # three batches
    values = [b"event-%d" % i for i in range(count)]
    kcat_produce(settings, topic, b"".join(KEY + b"|" + value + b"\n" for value in values))
    consumers = SeekCounting(settings)
    check = OriginCheck(consumers)
    try:
        for offset, value in enumerate(values):
            assert await check.forged((topic, partition, offset), key=KEY, value=value) is None
        # One assign and one seek, at the first copy; the later batches follow on.
        assert consumers.repositions == [("assign", [TopicPartition(topic, partition)]), ("seek", 0)]
    finally:
        await check.close()

    # Out of order, a fresh check repositions only when its consumer stands elsewhere.
    consumers.repositions.clear()
    check = OriginCheck(consumers)
    try:
        middle = FETCH_RECORDS + 10
        assert await check.forged((topic, partition, middle), key=KEY, value=values[middle]) is None
        assert await check.forged((topic, partition, middle + 1), key=KEY, value=values[middle + 1]) is None
        assert await check.forged((topic, partition, 5), key=KEY, value=b"not-it") == (
            f"its value differs from the record at {topic}/{partition}/5"
        )
        assert await check.forged((topic, partition, count), key=KEY, value=b"x") == (
            f"no record at {topic}/{partition}/{count}"
        )
        assert [what for what in consumers.repositions if what[0] == "seek"] == [
            ("seek", middle),
            ("seek", 5),
            ("seek", count),
        ]
    finally:
        await check.close()

    # A copy whose original lies a little ahead of where the consumer stands (lanes go at
    # their own pace) is read on to, not sought: a seek stalled a ShardKeys lane for half a
    # second. Back, or further ahead, it seeks (above).
    consumers.repositions.clear()
    check = OriginCheck(consumers)
    try:
        assert await check.forged((topic, partition, 0), key=KEY, value=values[0]) is None
        ahead = FETCH_RECORDS + FETCH_RECORDS // 2
        assert await check.forged((topic, partition, ahead), key=KEY, value=values[ahead]) is None
        assert await check.forged((topic, partition, ahead + 1), key=KEY, value=b"forged") == (
            f"its value differs from the record at {topic}/{partition}/{ahead + 1}"
        )
        last = count - 1
        assert await check.forged((topic, partition, last), key=KEY, value=values[last]) is None
        assert consumers.repositions == [("assign", [TopicPartition(topic, partition)]), ("seek", 0)]
    finally:
        await check.close()
