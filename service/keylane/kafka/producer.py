"""A plain Kafka producer (acks=all) for the one-off records the CLI sends, outside any Faust app."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager

from aiokafka import AIOKafkaProducer

from keylane.config import Settings
from keylane.kafka.topic_admin import broker_unreachable


@asynccontextmanager
async def producer(settings: Settings) -> AsyncIterator[AIOKafkaProducer]:
    """``async with producer(settings) as p: await p.send_and_wait(topic, key=..., value=...)``:
    a started producer on the settings' bootstrap servers, stopped on exit. BrokerUnavailable
    when no broker answers. Idempotent: a send the client retries after a lost answer (a broker
    timing out, a leader moving) is written once, so a decision, a command or a re-driven dead
    letter never lands twice."""
    client = AIOKafkaProducer(bootstrap_servers=settings.bootstrap_list, acks="all", enable_idempotence=True)
    try:
        await client.start()
    except Exception as exc:
        await client.stop()
        raise broker_unreachable(settings, exc) from exc
    try:
        yield client
    finally:
        await client.stop()


async def produce_in_order(
    settings: Settings, topic: str, records: Iterable[tuple[bytes | None, bytes | None]]
) -> None:
    """Produce (key, value) pairs to ``topic`` one after another, each confirmed before the
    next (so a key's records keep their order), with the default murmur2 partitioner."""
    async with producer(settings) as client:
        for key, value in records:
            await client.send_and_wait(topic, key=key, value=value)
