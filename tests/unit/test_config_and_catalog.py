"""Settings validation and the topic catalog's shape."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.catalog import ERRORS, EVENTS, LOGICAL_NAMES, load_catalog
from service.config import Settings
from service.errors import ConfigError


def test_environment_is_read_and_flags_win() -> None:
    env = {
        "KEYLANE_BOOTSTRAP_SERVERS": "a:1,b:2",
        "KEYLANE_TOPIC_PREFIX": "prod.",
        "KEYLANE_REPLICATION_FACTOR": "3",
        "KEYLANE_METRICS_PORT": "0",
    }

    settings = Settings.from_env(env, topic_prefix="stage.", app_id=None)

    assert settings.bootstrap_list == ["a:1", "b:2"]
    assert settings.topic_prefix == "stage."
    assert settings.replication_factor == 3
    assert settings.metrics_port == 0
    assert settings.app_id == "keylane"


def test_kafka_bootstrap_servers_is_a_fallback() -> None:
    assert Settings.from_env({"KAFKA_BOOTSTRAP_SERVERS": "k:9"}).bootstrap_servers == "k:9"


@pytest.mark.parametrize("prefix", ["has space.", "slash/", "x" * 201, ".", "ünïcode."])
def test_illegal_prefixes_are_refused(prefix: str) -> None:
    with pytest.raises(ConfigError, match="prefix"):
        Settings.from_env({}, topic_prefix=prefix)


def test_catalog_defines_every_topic_with_its_settings() -> None:
    catalog = load_catalog(prefix="prod.", replication_factor=3)

    assert [spec.logical_name for spec in catalog] == list(LOGICAL_NAMES)
    assert catalog.name(EVENTS) == "prod.agent.events"
    assert {spec.replication_factor for spec in catalog} == {3}
    co_partitioned = {spec.partitions for spec in catalog if spec.co_partitioned}
    assert len(co_partitioned) == 1
    assert catalog[ERRORS].broker_configs() == {
        "cleanup.policy": "delete",
        "retention.ms": "2592000000",
        "max.message.bytes": "2097152",
    }


def test_catalog_that_disagrees_on_co_partitioning_is_refused(tmp_path: Path) -> None:
    text = (Path(__file__).resolve().parents[2] / "topics" / "catalog.toml").read_text()
    bad = text.replace('[topics."agent.results"]\n', '[topics."agent.results"]\npartitions = 12\n')
    path = tmp_path / "catalog.toml"
    path.write_text(bad)

    with pytest.raises(ConfigError, match=r"co-partitioned topics disagree on partitions \[6, 12\]"):
        load_catalog(path=path)


def test_catalog_missing_a_topic_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "catalog.toml"
    path.write_text('[defaults]\npartitions = 1\n[topics."agent.events"]\n')

    with pytest.raises(ConfigError, match="must define exactly the system's topics"):
        load_catalog(path=path)
