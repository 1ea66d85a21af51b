"""Test helpers that read and write real topics: aiokafka for reading, kcat and the package's
producer (``produce``: keylane.kafka.producer.produce_in_order) for writing."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from collections.abc import Callable

from aiokafka import AIOKafkaConsumer

from keylane.config import Settings
from keylane.kafka.partitioner import expected_partition
from keylane.kafka.producer import produce_in_order as produce
from keylane.kafka.topic_reader import TopicRecord, read_to_end

__all__ = ["consume", "kcat_produce", "one_key_per_partition", "produce", "wait_for_records"]


async def consume(
    settings: Settings, topic: str, count: int, *, timeout_s: float = 30.0
) -> list[tuple[bytes, bytes]]:
    """Read ``count`` records from the start of ``topic`` (all partitions), or fail on timeout."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=settings.bootstrap_list,
        group_id=f"{settings.app_id}-reader-{topic}",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    records: list[tuple[bytes, bytes]] = []
    try:
        async with asyncio.timeout(timeout_s):
            async for message in consumer:
                assert message.key is not None and message.value is not None
                records.append((message.key, message.value))
                if len(records) == count:
                    break
    except TimeoutError:
        raise AssertionError(
            f"only {len(records)} of {count} records arrived on {topic} within {timeout_s}s: {records}"
        ) from None
    finally:
        await consumer.stop()
    return records


def kcat_produce(settings: Settings, topic: str, lines: bytes, *, key_delimiter: str = "|") -> None:
    """Produce ``key<delim>value`` lines with kcat, a real third-party client (librdkafka)."""
    kcat = shutil.which("kcat")
    assert kcat is not None, "kcat is not installed: run 'make install' (it apt-get installs kcat)"
    subprocess.run(
        [kcat, "-b", settings.bootstrap_servers, "-t", topic, "-P", "-K", key_delimiter],
        input=lines,
        check=True,
        timeout=30,
    )


async def wait_for_records(
    settings: Settings, topic: str, predicate: Callable[[list[TopicRecord]], bool], *, timeout_s: float = 60
) -> list[TopicRecord]:
    """Poll ``topic`` until ``predicate(all records)`` holds; fail with what was there."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        records = await read_to_end(settings, topic)
        if predicate(records):
            return records
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition not met on {topic} within {timeout_s}s; {len(records)} records")
        await asyncio.sleep(0.5)


def one_key_per_partition(partitions: int, template: str) -> list[bytes]:
    """The first key ``template.format(n)`` (n = 0, 1, ...) on each partition, by murmur2, in
    partition order: one record each gives every partition exactly one."""
    found: dict[int, bytes] = {}
    n = 0
    while len(found) < partitions:
        key = template.format(n).encode()
        found.setdefault(expected_partition(key, partitions), key)
        n += 1
    return [found[p] for p in range(partitions)]
