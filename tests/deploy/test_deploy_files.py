"""docker-compose.yml and the Dockerfile refer to things that exist and commands that parse."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from keylane.cli import build_parser

REPO = Path(__file__).resolve().parents[2]


def test_compose_services_run_valid_keylane_commands() -> None:
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())

    # The default stack: the services of a profile (three-brokers) run only when it is asked for.
    services = {name: s for name, s in compose["services"].items() if "profiles" not in s}
    assert set(services) == {"kafka", "topics", "worker", "effector", "prometheus", "grafana"}
    assert services["kafka"]["image"].startswith("apache/kafka:3.9.")
    for name in ("topics", "worker", "effector"):
        service = services[name]
        assert (REPO / service["build"]["dockerfile"]).exists()
        build_parser().parse_args(service["command"])
        assert service["environment"]["KEYLANE_BOOTSTRAP_SERVERS"] == "kafka:9092"


def test_dockerfile_copies_existing_paths() -> None:
    text = (REPO / "deploy" / "Dockerfile").read_text()

    copied = [src for line in re.findall(r"^COPY (.+)$", text, re.MULTILINE) for src in line.split()[:-1]]

    assert copied
    for source in copied:
        assert (REPO / source).exists(), source
