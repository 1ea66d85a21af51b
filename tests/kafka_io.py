"""Test helpers that read and write real topics: aiokafka for reading, kcat for writing."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from service.config import Settings
from service.topic_reader import read_to_end


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


@dataclass(frozen=True)
class Record:
    key: bytes | None
    value: bytes | None
    headers: dict[str, bytes]
    partition: int
    offset: int

    @property
    def record_id(self) -> str:
        return self.headers["keylane.id"].decode()


async def read_all(settings: Settings, topic: str) -> list[Record]:
    """Every record on ``topic`` right now (service.topic_reader, the product's own reader)."""
    return [
        Record(r.key, r.value, r.headers, r.partition, r.offset) for r in await read_to_end(settings, topic)
    ]


async def wait_for_records(
    settings: Settings, topic: str, predicate: Callable[[list[Record]], bool], *, timeout_s: float = 60
) -> list[Record]:
    """Poll ``topic`` until ``predicate(all records)`` holds; fail with what was there."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        records = await read_all(settings, topic)
        if predicate(records):
            return records
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition not met on {topic} within {timeout_s}s; {len(records)} records")
        await asyncio.sleep(0.5)


async def produce(settings: Settings, topic: str, records: list[tuple[bytes | None, bytes]]) -> None:
    """Produce (key, value) pairs with aiokafka (murmur2 partitioner, acks=all), in order."""
    producer = AIOKafkaProducer(bootstrap_servers=settings.bootstrap_list, acks="all")
    await producer.start()
    try:
        for key, value in records:
            await producer.send_and_wait(topic, key=key, value=value)
    finally:
        await producer.stop()
