"""The Maven-jar launcher starts a real 3-node KRaft cluster and stops it without leftovers;
on it, keylane's topics and Faust's changelogs are replicated 3 ways with min.insync.replicas 2."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from keylane.catalog import EVENTS, load_catalog
from keylane.config import Settings
from keylane.kafka.app import build_app
from keylane.kafka.topic_admin import admin_client, apply_catalog
from tests.broker import local_kafka

pytestmark = pytest.mark.kafka

TOPIC_OVERRIDE = 1  # DescribeConfigs' config_source for a value set on the topic itself


def test_three_node_cluster_starts_serves_and_stops(tmp_path: Path) -> None:
    launcher = local_kafka()

    cluster = launcher.start(tmp_path, nodes=3, quiet=True)
    try:
        for node in cluster.nodes:
            assert sorted(launcher.metadata_brokers("127.0.0.1", node.port)) == [1, 2, 3]
        assert launcher.running_cluster(tmp_path) == cluster
    finally:
        assert launcher.stop(tmp_path, quiet=True) is True

    for node in cluster.nodes:
        with pytest.raises(ProcessLookupError):
            os.kill(node.pid, 0)
    assert launcher.running_cluster(tmp_path) is None


async def describe(settings: Settings, names: list[str]) -> dict[str, tuple[set[int], dict[str, Any]]]:
    """Per topic: the replica counts of its partitions, and its configs as (value, source).
    Waits (30 s at most) until the metadata lists every topic's partitions: a topic created
    a moment ago may not have reached every broker yet."""
    deadline = time.monotonic() + 30
    async with admin_client(settings) as client:
        while True:
            topics = await client.describe_topics(names)
            if all(t["error_code"] == 0 and t["partitions"] for t in topics) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        responses = await client.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, n) for n in names]
        )
    configs = {
        name: {entry[0]: (entry[1], entry[3]) for entry in entries}
        for response in responses
        for _code, _msg, _type, name, entries in response.resources
    }
    return {t["topic"]: ({len(p["replicas"]) for p in t["partitions"]}, configs[t["topic"]]) for t in topics}


async def test_three_node_cluster_replicates_topics_and_changelogs_and_takes_writes_with_a_broker_down(
    tmp_path: Path,
) -> None:
    launcher = local_kafka()
    state = tmp_path / "kafka"
    cluster = launcher.start(state, nodes=3, quiet=True)
    try:
        env = {"KEYLANE_BOOTSTRAP_SERVERS": cluster.bootstrap, "KEYLANE_REPLICATION_FACTOR": "3"}
        unique = uuid.uuid4().hex[:8]
        settings = Settings.from_env(
            env, topic_prefix=f"r{unique}.", app_id=f"keylane-r{unique}", data_dir=tmp_path / "data"
        )
        assert settings.replication_factor == 3
        catalog = load_catalog(prefix=settings.topic_prefix, replication_factor=settings.replication_factor)
        async with admin_client(settings) as client:
            applied = await apply_catalog(client, catalog)
            local_default = await apply_catalog(client, load_catalog(prefix=f"l{unique}."))
        assert applied.warnings == []
        assert local_default.warnings == [
            f"10 topic(s) (l{unique}.agent.events, ...) have replication factor below 3 on a cluster of 3 "
            "brokers: losing one broker can lose their data; set KEYLANE_REPLICATION_FACTOR=3"
        ]

        # A table creates its changelog when it starts, as in a worker.
        app = build_app(settings, catalog)
        table = app.Table("keylane-state", default=None, key_type=bytes, value_type=bytes)
        await table.start()
        await table.stop()
        changelog = table.changelog_topic.get_topic_name()

        described = await describe(settings, [spec.name for spec in catalog] + [changelog])
        for name, (replicas, configs) in described.items():
            assert replicas == {3}, name
            assert configs["min.insync.replicas"] == ("2", TOPIC_OVERRIDE), name
        assert described[changelog][1]["cleanup.policy"] == ("compact", TOPIC_OVERRIDE)

        # One broker down (kill -9): acks=all writes still succeed on the two in-sync replicas.
        launcher.kill_node(state, 2)
        producer = AIOKafkaProducer(bootstrap_servers=settings.bootstrap_list, acks="all")
        await producer.start()
        try:
            for partition in range(catalog[EVENTS].partitions):
                await producer.send_and_wait(catalog.name(EVENTS), b"v", key=b"k", partition=partition)
        finally:
            await producer.stop()
        restarted = launcher.restart_node(state, 2)
        for node in restarted.nodes:
            assert sorted(launcher.metadata_brokers("127.0.0.1", node.port)) == [1, 2, 3]
    finally:
        launcher.stop(state, quiet=True)
