"""docker-compose.yml renders in docker-compose (no Docker engine needed), with and without its
three-brokers profile; its Prometheus and Grafana mount the files in deploy/ that exist, at the
paths their configs expect, and the profile is a three-node KRaft cluster with keylane's topics
at replication factor 3 and min.insync.replicas 2, two workers and an effector."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from keylane.catalog import load_catalog
from keylane.cli import build_parser
from keylane.config import Settings
from tests.deploy.tools import REPO, explain, require, run

COMPOSE = REPO / "docker-compose.yml"


@pytest.fixture(scope="module")
def rendered() -> dict[str, Any]:
    tool = require("docker-compose")
    result = run([tool, "-f", str(COMPOSE), "config"])
    assert result.returncode == 0, explain(result)
    config: dict[str, Any] = yaml.safe_load(result.stdout)
    return config


def _binds(service: dict[str, Any]) -> dict[str, Path]:
    """Container path -> host path of a service's bind mounts (rendered as host:container[:mode])."""
    binds: dict[str, Path] = {}
    for volume in service.get("volumes", []):
        if isinstance(volume, dict):
            if volume.get("type") == "bind":
                binds[volume["target"]] = Path(volume["source"])
            continue
        source, target, *_ = volume.split(":")
        if source.startswith("/"):
            binds[target] = Path(source)
    return binds


def _published(service: dict[str, Any]) -> set[tuple[int, int]]:
    ports = set()
    for port in service.get("ports", []):
        if isinstance(port, dict):
            ports.add((int(port["published"]), int(port["target"])))
        else:
            published, target = str(port).split(":")[-2:]
            ports.add((int(published), int(target)))
    return ports


def test_compose_renders_with_every_service(rendered: dict[str, Any]) -> None:
    assert {"kafka", "topics", "worker", "effector", "prometheus", "grafana"} <= set(rendered["services"])


def test_prometheus_is_pinned_and_mounts_deploy_prometheus(rendered: dict[str, Any]) -> None:
    prometheus = rendered["services"]["prometheus"]

    image, _, tag = prometheus["image"].partition(":")
    assert image == "prom/prometheus"
    assert tag.startswith(("v2.", "v3.")) and tag.count(".") == 2, f"pin a full version, not {tag!r}"
    assert _binds(prometheus)["/etc/prometheus"] == REPO / "deploy" / "prometheus"
    assert "--config.file=/etc/prometheus/prometheus.yml" in prometheus["command"]
    assert (9090, 9090) in _published(prometheus)


def test_grafana_is_pinned_and_mounts_provisioning_and_dashboards(rendered: dict[str, Any]) -> None:
    grafana = rendered["services"]["grafana"]
    provider = yaml.safe_load((REPO / "deploy/grafana/provisioning/dashboards/keylane.yml").read_text())

    image, _, tag = grafana["image"].partition(":")
    assert image == "grafana/grafana"
    assert tag.startswith("11.") and tag.count(".") == 2, f"pin a full Grafana 11 version, not {tag!r}"
    binds = _binds(grafana)
    assert binds["/etc/grafana/provisioning"] == REPO / "deploy" / "grafana" / "provisioning"
    dashboards = provider["providers"][0]["options"]["path"]
    assert binds[dashboards] == REPO / "deploy" / "grafana" / "dashboards"
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home.startswith(dashboards + "/")
    assert (binds[dashboards] / Path(home).name).is_file()
    assert grafana["environment"]["GF_AUTH_ANONYMOUS_ENABLED"] == "true"
    assert (3000, 3000) in _published(grafana)
    assert "prometheus" in grafana["depends_on"]


def test_every_bind_mount_exists(rendered: dict[str, Any]) -> None:
    for name, service in rendered["services"].items():
        for target, source in _binds(service).items():
            assert source.exists(), f"{name}: {source} (mounted at {target}) does not exist"


def test_scrape_targets_and_datasource_are_compose_services(rendered: dict[str, Any]) -> None:
    services = rendered["services"]
    config = yaml.safe_load((REPO / "deploy/prometheus/prometheus.yml").read_text())
    datasources = yaml.safe_load(
        (REPO / "deploy/grafana/provisioning/datasources/prometheus.yml").read_text()
    )

    for job in config["scrape_configs"]:
        if not job["job_name"].startswith("keylane-"):
            continue
        for target in (t for c in job["static_configs"] for t in c["targets"]):
            host, port = target.split(":")
            assert host in services, f"{job['job_name']}: no compose service {host}"
            # The image serves metrics on 9464 unless the service says otherwise.
            assert port == services[host].get("environment", {}).get("KEYLANE_METRICS_PORT", "9464")
    assert datasources["datasources"][0]["url"] == "http://prometheus:9090"


# --- profile three-brokers ---------------------------------------------------------------

PROFILE = "three-brokers"


@pytest.fixture(scope="module")
def rendered_profile() -> dict[str, Any]:
    tool = require("docker-compose")
    result = run([tool, "-f", str(COMPOSE), "--profile", PROFILE, "config"])
    assert result.returncode == 0, explain(result)
    config: dict[str, Any] = yaml.safe_load(result.stdout)
    return config


def _in_profile(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n: s for n, s in config["services"].items() if PROFILE in s.get("profiles", [])}


def _volume_names(service: dict[str, Any]) -> set[str]:
    names = set()
    for volume in service.get("volumes", []):
        source = volume["source"] if isinstance(volume, dict) else volume.split(":")[0]
        if not source.startswith("/"):
            names.add(source)
    return names


def _volume_targets(service: dict[str, Any]) -> set[str]:
    return {
        volume["target"] if isinstance(volume, dict) else volume.split(":")[1]
        for volume in service.get("volumes", [])
    }


def test_default_stack_has_no_profile(rendered: dict[str, Any]) -> None:
    default = {n for n, s in rendered["services"].items() if not s.get("profiles")}

    assert default == {"kafka", "topics", "worker", "effector", "prometheus", "grafana"}
    assert set(_in_profile(rendered)) == set(rendered["services"]) - default, "one profile only"


def test_three_brokers_form_one_kraft_quorum(rendered_profile: dict[str, Any]) -> None:
    services = _in_profile(rendered_profile)
    brokers = {n: s for n, s in services.items() if s.get("image", "").startswith("apache/kafka:")}

    assert set(brokers) == {"kafka-1", "kafka-2", "kafka-3"}
    envs = {name: broker["environment"] for name, broker in brokers.items()}
    voters = {f"{env['KAFKA_NODE_ID']}@{name}:9093" for name, env in envs.items()}
    for name, env in envs.items():
        assert brokers[name]["image"] == rendered_profile["services"]["kafka"]["image"], "one Kafka version"
        assert set(env["KAFKA_CONTROLLER_QUORUM_VOTERS"].split(",")) == voters
        assert env["KAFKA_ADVERTISED_LISTENERS"] == f"PLAINTEXT://{name}:9092"
        assert env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"] == "3"
        assert env["KAFKA_MIN_INSYNC_REPLICAS"] == "2"
        # Its data on a named volume, not in the container (the image's default is under /tmp).
        assert env["KAFKA_LOG_DIRS"] in _volume_targets(brokers[name]), name
        assert "healthcheck" in brokers[name]
    assert len({env["CLUSTER_ID"] for env in envs.values()}) == 1
    assert len({env["KAFKA_NODE_ID"] for env in envs.values()}) == 3


def test_three_brokers_run_two_workers_and_an_effector_at_replication_factor_3(
    rendered: dict[str, Any], rendered_profile: dict[str, Any]
) -> None:
    services = _in_profile(rendered_profile)
    keylane = {n: s for n, s in services.items() if "build" in s}
    commands = {n: build_parser().parse_args(s["command"]) for n, s in keylane.items()}

    assert sorted(a.command for a in commands.values()) == ["effector", "topics", "worker", "worker"]
    for name, service in keylane.items():
        settings = Settings.from_env(service["environment"])
        assert set(settings.bootstrap_list) == {"kafka-1:9092", "kafka-2:9092", "kafka-3:9092"}, name
        catalog = load_catalog(prefix=settings.topic_prefix, replication_factor=settings.replication_factor)
        assert all(t.replication_factor == 3 and t.min_insync_replicas == 2 for t in catalog), name
        if commands[name].command == "topics":
            assert set(service["depends_on"]) == {"kafka-1", "kafka-2", "kafka-3"}
            assert all(d["condition"] == "service_healthy" for d in service["depends_on"].values())
        else:
            (topics,) = service["depends_on"]
            assert commands[topics].command == "topics"
            assert service["depends_on"][topics]["condition"] == "service_completed_successfully"
    workers = [n for n, a in commands.items() if a.command in ("worker", "effector")]
    volumes = [_volume_names(keylane[n]) for n in workers]
    assert all(volumes) and not set.intersection(*volumes), "each process has its own data dir"
    # Published ports clash neither with each other nor with the default stack's.
    published = [p for s in rendered_profile["services"].values() for p, _ in _published(s)]
    assert len(published) == len(set(published))
    assert rendered["services"].keys() <= rendered_profile["services"].keys()
