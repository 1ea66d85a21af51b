"""docker-compose.yml renders in docker-compose (no Docker engine needed), and its Prometheus
and Grafana mount the files in deploy/ that exist, at the paths their configs expect."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

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
