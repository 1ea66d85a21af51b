"""Filling a benchmark's input topic: all at once (pre-fill) or at a fixed rate (latency)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from aiokafka import AIOKafkaProducer


async def produce_all(bootstrap: str, topic: str, records: Sequence[tuple[bytes, bytes]]) -> None:
    """Produce (key, value) pairs fast: murmur2 partitioner, acks=all, batched sends."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        futures = [await producer.send(topic, key=key, value=value) for key, value in records]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def produce_paced(
    bootstrap: str, topic: str, records: Sequence[tuple[bytes, bytes]], rate: float
) -> list[int]:
    """Produce at a fixed rate (records/s); the input timestamps (ms), in order."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        loop = asyncio.get_running_loop()
        started = loop.time()
        futures = []
        for i, (key, value) in enumerate(records):
            delay = started + i / rate - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            futures.append(await producer.send(topic, key=key, value=value))
        metadata = await asyncio.gather(*futures)
        return [m.timestamp for m in metadata]
    finally:
        await producer.stop()
