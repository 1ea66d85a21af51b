"""A changelog an older keylane (or Faust itself) created keeps its partitions, and gets the
configs keylane's tables need when a table starts: without max.message.bytes at the
producer's limit it refuses state blobs the runtime allows (the broker's default is about
1 MiB, the runtime keeps a key's state under 2 MiB), and without min.insync.replicas a
changelog write counts on one replica."""

from __future__ import annotations

import pytest
from aiokafka.admin import NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from keylane.catalog import EVENTS, Catalog
from keylane.config import Settings
from keylane.kafka.app import build_app, max_request_bytes
from keylane.kafka.topic_admin import admin_client, wait_until_every_broker_knows

pytestmark = pytest.mark.kafka


async def topic_configs(settings: Settings, name: str) -> dict[str, str]:
    async with admin_client(settings) as client:
        responses = await client.describe_configs([ConfigResource(ConfigResourceType.TOPIC, name)])
    return {entry[0]: entry[1] for r in responses for *_, entries in r.resources for entry in entries}


async def test_an_existing_changelog_gets_the_configs_keylane_s_tables_need(
    settings: Settings, catalog: Catalog
) -> None:
    app = build_app(settings, catalog)
    table = app.Table(
        "keylane-state", default=None, partitions=catalog[EVENTS].partitions, key_type=bytes, value_type=bytes
    )
    changelog = table.changelog_topic.get_topic_name()
    async with admin_client(settings) as client:  # as an older keylane left it: Faust's configs only
        await client.create_topics(
            [NewTopic(changelog, catalog[EVENTS].partitions, 1, topic_configs={"cleanup.policy": "compact"})]
        )
        assert await wait_until_every_broker_knows(client, [changelog]) == []
    before = await topic_configs(settings, changelog)
    assert int(before["max.message.bytes"]) < max_request_bytes(catalog)

    await table.start()
    await table.stop()

    after = await topic_configs(settings, changelog)
    assert after["max.message.bytes"] == str(max_request_bytes(catalog))
    assert after["min.insync.replicas"] == str(catalog[EVENTS].min_insync_replicas)
    assert after["cleanup.policy"] == "compact"
