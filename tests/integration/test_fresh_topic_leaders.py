"""A topic keylane creates is ready to take records when the call that created it returns: its
partitions' leaders serve them, so the first records produced meet no NotLeaderForPartition
retry (the metadata names a fresh topic's leaders a moment before they act as leaders)."""

from __future__ import annotations

import logging

import pytest
from aiokafka import AIOKafkaProducer

from keylane.config import Settings
from keylane.kafka.topic_admin import admin_client, ensure_topic, wait_until_leaders_serve

pytestmark = pytest.mark.kafka

PARTITIONS = 24  # many leaders to elect at once widen the window


async def test_records_produced_right_after_ensure_topic_meet_no_not_leader_retry(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    name = f"{settings.topic_prefix}fresh"
    async with admin_client(settings) as client:
        created = await ensure_topic(
            client, name=name, partitions=PARTITIONS, replication_factor=1, configs={}
        )
        assert created
        assert await wait_until_leaders_serve(client, [name], timeout_s=1) == []
    producer = AIOKafkaProducer(bootstrap_servers=settings.bootstrap_list, acks="all")
    caplog.set_level(logging.WARNING, logger="aiokafka")
    await producer.start()
    try:
        sent = [await producer.send(name, b"v", partition=p) for p in range(PARTITIONS)]
        for future in sent:
            await future
    finally:
        await producer.stop()
    retries = [r.getMessage() for r in caplog.records if "NotLeaderForPartition" in r.getMessage()]
    assert retries == []


async def test_a_topic_that_does_not_exist_is_reported_at_the_deadline(settings: Settings) -> None:
    name = f"{settings.topic_prefix}never-created"
    async with admin_client(settings) as client:
        assert await wait_until_leaders_serve(client, [name], timeout_s=0.5) == [name]
