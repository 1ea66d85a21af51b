"""Settings validation and the topic catalog's shape."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.errors import NodeNotReadyError

from keylane.catalog import ERRORS, EVENTS, LOGICAL_NAMES, Catalog, load_catalog
from keylane.config import Settings
from keylane.errors import ConfigError
from keylane.kafka.app import build_app, changelog_record_limit
from keylane.kafka.topic_admin import inspect_catalog
from tests.broker import local_kafka


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
    assert settings.app_id == "stage.keylane"  # the prefix keeps the deployment's group its own


def test_the_app_id_is_keylane_without_a_prefix_and_an_explicit_one_wins() -> None:
    assert Settings.from_env({}).app_id == "keylane"
    assert Settings.from_env({"KEYLANE_TOPIC_PREFIX": "a.", "KEYLANE_APP_ID": "mine"}).app_id == "mine"


def test_kafka_bootstrap_servers_is_a_fallback() -> None:
    assert Settings.from_env({"KAFKA_BOOTSTRAP_SERVERS": "k:9"}).bootstrap_servers == "k:9"


def test_the_broker_a_local_run_wrote_is_found_when_nothing_names_one(tmp_path: Path) -> None:
    (tmp_path / "keylane.env").write_text(
        "KEYLANE_BOOTSTRAP_SERVERS=127.0.0.1:40123\nKEYLANE_REPLICATION_FACTOR=3\n"
    )

    found = Settings.from_env({"KEYLANE_KAFKA_STATE": str(tmp_path)})
    named = Settings.from_env({"KEYLANE_KAFKA_STATE": str(tmp_path), "KEYLANE_BOOTSTRAP_SERVERS": "k:9"})
    nothing = Settings.from_env({"KEYLANE_KAFKA_STATE": str(tmp_path / "none")})

    assert (found.bootstrap_servers, found.replication_factor) == ("127.0.0.1:40123", 3)
    assert found.bootstrap_source == f"from {tmp_path / 'keylane.env'}"
    assert (named.bootstrap_servers, named.bootstrap_source) == ("k:9", "KEYLANE_BOOTSTRAP_SERVERS")
    assert (nothing.bootstrap_servers, nothing.bootstrap_source) == ("127.0.0.1:9092", "the default")


def test_the_address_of_a_killed_local_broker_says_its_process_is_gone(tmp_path: Path) -> None:
    (tmp_path / "keylane.env").write_text("KEYLANE_BOOTSTRAP_SERVERS=127.0.0.1:40123\n")
    gone = subprocess.Popen(["true"])  # a process that ran and is gone: its pid, free
    gone.wait()
    (tmp_path / "cluster.json").write_text(json.dumps({"nodes": [{"pid": gone.pid}, {"pid": os.getpid()}]}))

    found = Settings.from_env({"KEYLANE_KAFKA_STATE": str(tmp_path)})

    assert found.bootstrap_source == (
        f"from {tmp_path / 'keylane.env'}, whose broker is not running (process {gone.pid} is gone)"
    )


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"KEYLANE_BOOTSTRAP_SERVERS": "127.0.0.1:99999"},
            "bootstrap servers '127.0.0.1:99999' (KEYLANE_BOOTSTRAP_SERVERS) are not host:port[,host:port] "
            "with ports 1-65535; set KEYLANE_BOOTSTRAP_SERVERS or --bootstrap-servers, e.g. 127.0.0.1:9092",
        ),
        (
            {"KEYLANE_LOG_LEVEL": "loud"},
            "KEYLANE_LOG_LEVEL='loud' is not a log level; use one of debug, info, warning, error, critical",
        ),
        (
            {"KEYLANE_METRICS_PORT": "abc"},
            "KEYLANE_METRICS_PORT='abc' is not a whole number; set it to one, e.g. KEYLANE_METRICS_PORT=9464",
        ),
        (
            {"KEYLANE_METRICS_PORT": "70000"},
            "KEYLANE_METRICS_PORT=70000 is not a port; use 1-65535, or 0 to disable /metrics",
        ),
        (
            {"KEYLANE_METRICS_HOST": "local host"},
            "KEYLANE_METRICS_HOST='local host' is not an address to listen on; use e.g. 0.0.0.0 "
            "(every interface) or 127.0.0.1",
        ),
    ],
)
def test_a_bad_value_is_one_line_saying_what_to_set(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        Settings.from_env(env)

    assert str(refused.value) == message


def test_group_instance_id_makes_the_consumer_a_static_member(monkeypatch: pytest.MonkeyPatch) -> None:
    # Faust lets its own CONSUMER_GROUP_INSTANCE_ID win over its constructor's argument.
    monkeypatch.setenv("CONSUMER_GROUP_INSTANCE_ID", "shared-by-every-pod")

    static = Settings.from_env({"KEYLANE_GROUP_INSTANCE_ID": "keylane-worker-1"})
    dynamic = Settings.from_env({})

    assert static.group_instance_id == "keylane-worker-1"
    assert dynamic.group_instance_id is None
    assert build_app(static, load_catalog()).conf.consumer_group_instance_id == "keylane-worker-1"
    assert build_app(dynamic, load_catalog()).conf.consumer_group_instance_id is None


@pytest.mark.parametrize("value", ["", "   ", "w\n0", "w\x000"])
def test_a_blank_or_unprintable_group_instance_id_is_refused(value: str) -> None:
    with pytest.raises(ConfigError, match=r"^KEYLANE_GROUP_INSTANCE_ID=.* must be a non-empty") as info:
        Settings.from_env({"KEYLANE_GROUP_INSTANCE_ID": value})
    assert "\n" not in str(info.value)


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
        "min.insync.replicas": "2",
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


@pytest.mark.parametrize(("replicas", "min_insync"), [(None, 1), (1, 1), (2, 2), (3, 2), (5, 2)])
def test_min_insync_replicas_is_two_or_the_replication_factor(replicas: int | None, min_insync: int) -> None:
    catalog = load_catalog(replication_factor=replicas)

    assert {spec.min_insync_replicas for spec in catalog} == {min_insync}
    assert {spec.broker_configs()["min.insync.replicas"] for spec in catalog} == {str(min_insync)}


def _catalog_text() -> str:
    return (Path(__file__).resolve().parents[2] / "topics" / "catalog.toml").read_text()


def test_catalog_min_insync_replicas_can_be_set_and_must_fit_the_replication_factor(tmp_path: Path) -> None:
    path = tmp_path / "catalog.toml"
    path.write_text(_catalog_text().replace("[defaults]\n", "[defaults]\nmin_insync_replicas = 3\n"))

    assert {spec.min_insync_replicas for spec in load_catalog(path=path, replication_factor=5)} == {3}
    with pytest.raises(ConfigError, match=r"min_insync_replicas is 3 but the replication factor is 2"):
        load_catalog(path=path, replication_factor=2)


def test_faust_app_produces_with_acks_all_and_replicates_changelogs(monkeypatch: pytest.MonkeyPatch) -> None:
    # Faust lets these environment variables win over its constructor's arguments.
    monkeypatch.setenv("PRODUCER_ACKS", "1")
    monkeypatch.setenv("TOPIC_REPLICATION_FACTOR", "1")

    app = build_app(Settings.from_env({}), load_catalog(replication_factor=3))
    table = app.Table("keylane-state", default=None, partitions=6, key_type=bytes, value_type=bytes)

    assert app.producer._settings_default()["acks"] == -1  # what aiokafka is given: acks=all
    assert app.conf.topic_replication_factor == 3
    assert app.conf.topic_allow_declare is False  # keylane's admin client creates the changelog
    changelog = table.changelog_topic
    # max.message.bytes: the producer's limit, above the broker default a full state can pass
    assert changelog.config == {"min.insync.replicas": "2", "max.message.bytes": "2097152"}
    assert changelog_record_limit(app, load_catalog()) == 2097152
    assert changelog.compacting is True


def test_local_cluster_defaults_replicate_like_production() -> None:
    launcher = local_kafka()
    three = launcher.plan_nodes(Path("/nonexistent"), 3, 40000)
    one = launcher.plan_nodes(Path("/nonexistent"), 1, 40000)

    props = launcher.server_properties(three[0], three)
    assert "default.replication.factor=3\n" in props
    assert "min.insync.replicas=2\n" in props
    assert "transaction.state.log.min.isr=2\n" in props
    single = launcher.server_properties(one[0], one)
    assert "default.replication.factor=1\n" in single
    assert "min.insync.replicas=1\n" in single
    cluster = launcher.Cluster(state_dir="/nonexistent", nodes=three)
    assert launcher.keylane_env(cluster) == {
        "KEYLANE_BOOTSTRAP_SERVERS": "127.0.0.1:40000,127.0.0.1:40002,127.0.0.1:40004",
        "KEYLANE_REPLICATION_FACTOR": "3",
    }


class _BrokerJustKilled:
    """An admin client whose first metadata request goes to a broker that was just killed
    (aiokafka raises NodeNotReadyError at once); later requests reach a live broker."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.describe_calls = 0

    async def describe_topics(self, names: list[str]) -> list[dict[str, Any]]:
        self.describe_calls += 1
        if self.describe_calls == 1:
            raise NodeNotReadyError("Attempt to send a request to node which is not ready (node id 3).")
        return [
            {
                "topic": n,
                "error_code": 0,
                "partitions": [{"replicas": [1]}] * self.catalog[_logical(n)].partitions,
            }
            for n in names
        ]

    async def describe_configs(self, resources: list[Any]) -> list[Any]:
        entries = {
            r.name: [(k, v) for k, v in self.catalog[_logical(r.name)].broker_configs().items()]
            for r in resources
        }
        return [SimpleNamespace(resources=[(0, "", 2, name, e) for name, e in entries.items()])]


def _logical(name: str) -> str:
    return name.removeprefix("prod.")


async def test_inspecting_retries_a_request_that_reached_a_broker_just_killed() -> None:
    catalog = load_catalog(prefix="prod.")
    client = _BrokerJustKilled(catalog)

    reports = await inspect_catalog(client, catalog)  # type: ignore[arg-type]

    assert {r.status for r in reports} == {"ok"}
    assert client.describe_calls == 2
