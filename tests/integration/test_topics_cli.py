"""`keylane topics apply` / `check` against a real broker, run as a user runs them."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from aiokafka.admin import NewTopic

from keylane.catalog import EVENTS, LOGICAL_NAMES, RESULTS, load_catalog
from keylane.config import Settings
from keylane.kafka.topic_admin import admin_client

pytestmark = pytest.mark.kafka


def keylane(settings: Settings, *args: str, **extra_env: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "KEYLANE_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "KEYLANE_TOPIC_PREFIX": settings.topic_prefix,
        **extra_env,
    }
    return subprocess.run(
        [sys.executable, "-m", "keylane.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


async def broker_topics(settings: Settings) -> set[str]:
    async with admin_client(settings) as client:
        return {t for t in await client.list_topics() if t.startswith(settings.topic_prefix)}


async def test_apply_twice_changes_nothing_the_second_time(settings: Settings) -> None:
    first = keylane(settings, "topics", "apply")
    assert first.returncode == 0, first.stderr
    assert first.stdout.count("created ") == len(LOGICAL_NAMES)
    assert await broker_topics(settings) == {settings.topic_prefix + n for n in LOGICAL_NAMES}

    second = keylane(settings, "topics", "apply")

    assert second.returncode == 0, second.stderr
    assert "0 created, 0 reconfigured, 10 unchanged: nothing to change" in second.stdout
    check = keylane(settings, "topics", "check")
    assert check.returncode == 0, check.stdout
    assert "all 10 topics match the catalog" in check.stdout


async def test_partition_mismatch_is_refused_and_nothing_changes(settings: Settings) -> None:
    catalog = load_catalog(prefix=settings.topic_prefix)
    wrong = catalog[RESULTS].partitions + 1
    async with admin_client(settings) as client:
        await client.create_topics([NewTopic(catalog.name(RESULTS), wrong, 1)])

    result = keylane(settings, "topics", "apply")

    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0] == (
        f"keylane: topic {catalog.name(RESULTS)} has {wrong} partitions but the catalog says "
        f"{catalog[RESULTS].partitions}; co-partitioning needs them equal: recreate the topic with "
        f"{catalog[RESULTS].partitions} partitions or use another --topic-prefix"
    )
    assert "Traceback" not in result.stderr
    assert await broker_topics(settings) == {catalog.name(RESULTS)}, "apply must not create anything"


async def test_check_reports_drift_without_changing_it(settings: Settings) -> None:
    assert keylane(settings, "topics", "apply").returncode == 0
    catalog = load_catalog(prefix=settings.topic_prefix)
    async with admin_client(settings) as client:
        from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

        await client.alter_configs(
            [
                ConfigResource(
                    ConfigResourceType.TOPIC,
                    catalog.name(EVENTS),
                    {**catalog[EVENTS].broker_configs(), "retention.ms": "1000"},
                )
            ]
        )

    check = keylane(settings, "topics", "check")
    again = keylane(settings, "topics", "check")

    assert check.returncode == 1
    assert (
        f"drift    {catalog.name(EVENTS)}: retention.ms: catalog {catalog[EVENTS].retention_ms}, broker 1000"
        in check.stdout
    )
    assert again.stdout == check.stdout, "check must not change the broker"
    fixed = keylane(settings, "topics", "apply")
    assert f"reconfigured {catalog.name(EVENTS)}" in fixed.stdout
    assert keylane(settings, "topics", "check").returncode == 0


async def test_replication_factor_above_the_broker_count_is_refused_and_nothing_changes(
    settings: Settings,
) -> None:
    async with admin_client(settings) as client:
        brokers = len((await client.describe_cluster())["brokers"])
    too_many = str(brokers + 1)

    result = keylane(settings, "topics", "apply", KEYLANE_REPLICATION_FACTOR=too_many)

    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"keylane: topic {settings.topic_prefix}agent.events needs replication factor {too_many} but the "
        f"cluster has {brokers} broker(s); set KEYLANE_REPLICATION_FACTOR to at most {brokers} "
        "(nothing was changed)"
    ]
    assert await broker_topics(settings) == set(), "apply must not create anything"


async def test_min_insync_replicas_is_set_checked_and_restored(settings: Settings) -> None:
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    assert keylane(settings, "topics", "apply").returncode == 0
    catalog = load_catalog(prefix=settings.topic_prefix)
    want = 1  # the catalog's replication factor is 1 unless KEYLANE_REPLICATION_FACTOR says otherwise
    async with admin_client(settings) as client:
        await client.alter_configs(
            [
                ConfigResource(
                    ConfigResourceType.TOPIC,
                    catalog.name(EVENTS),
                    {**catalog[EVENTS].broker_configs(), "min.insync.replicas": "2"},
                )
            ]
        )

    check = keylane(settings, "topics", "check")

    assert check.returncode == 1
    assert f"drift    {catalog.name(EVENTS)}: min.insync.replicas: catalog {want}, broker 2" in check.stdout
    fixed = keylane(settings, "topics", "apply")
    assert f"reconfigured {catalog.name(EVENTS)}" in fixed.stdout
    async with admin_client(settings) as client:
        [response] = await client.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, catalog.name(EVENTS))]
        )
    configs = {
        entry[0]: entry[1] for _code, _msg, _type, _name, entries in response.resources for entry in entries
    }
    assert configs["min.insync.replicas"] == str(want)
