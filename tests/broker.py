"""Where the test run's Kafka broker comes from.

Order: KAFKA_BOOTSTRAP_SERVERS if set; else a testcontainers broker when a Docker daemon
answers; else the local Maven-jar broker (deploy/kafka/local_kafka.py), started once per
run. Under CI=true a run without a broker fails; it never skips broker tests.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parent.parent
CONTAINER_IMAGE = "confluentinc/cp-kafka:7.9.1"  # Confluent Platform 7.9 ships Apache Kafka 3.9


@dataclass
class Broker:
    """A bootstrap address, where it came from, and how to give it back."""

    bootstrap: str
    source: str
    release: Callable[[], None] = lambda: None


class NoBroker(Exception):
    """No broker could be had; the message lists what was tried."""


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def local_kafka() -> ModuleType:
    """The launcher module from deploy/, loaded by path (it is a script, not a package)."""
    if "local_kafka" in sys.modules:
        return sys.modules["local_kafka"]
    spec = importlib.util.spec_from_file_location("local_kafka", REPO / "deploy" / "kafka" / "local_kafka.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["local_kafka"] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def acquire(state_dir: Path) -> Broker:
    """Find or start a broker, trying each source in order."""
    tried: list[str] = []
    from_env = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if from_env:
        return Broker(from_env, f"KAFKA_BOOTSTRAP_SERVERS={from_env}")
    tried.append("KAFKA_BOOTSTRAP_SERVERS is not set")

    container = _testcontainers_broker(tried)
    if container is not None:
        return container

    launcher = local_kafka()
    try:
        cluster = launcher.start(state_dir, nodes=1, quiet=True)
    except launcher.LauncherError as exc:
        tried.append(f"local Maven-jar broker failed: {exc}")
        raise NoBroker("; ".join(tried)) from exc
    return Broker(
        cluster.bootstrap,
        f"local Maven-jar Kafka {launcher.KAFKA_VERSION} (deploy/kafka) at {cluster.bootstrap}",
        release=lambda: launcher.stop(state_dir, quiet=True),
    )


def _testcontainers_broker(tried: list[str]) -> Broker | None:
    reason = _docker_unavailable()
    if reason:
        tried.append(reason)
        return None
    from testcontainers.community.kafka import KafkaContainer

    container = KafkaContainer(CONTAINER_IMAGE).with_kraft()
    container.start()
    bootstrap = container.get_bootstrap_server()
    return Broker(bootstrap, f"testcontainers {CONTAINER_IMAGE} at {bootstrap}", release=container.stop)


def _docker_unavailable() -> str | None:
    """None when a Docker daemon answers /_ping, else why not.

    A raw request on the daemon's socket: the docker SDK leaks that socket when the
    daemon is absent, which pytest (warnings as errors) reports as a failure.
    """
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if host.startswith("unix://"):
        path = host.removeprefix("unix://")
        if not Path(path).exists():
            return f"no Docker daemon (no socket at {path})"
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.settimeout(3)
                conn.connect(path)
                conn.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
                answer = conn.recv(64)
        except OSError as exc:
            return f"no Docker daemon answers at {path} ({exc.strerror or exc})"
        return None if b" 200 " in answer else f"Docker daemon at {path} answered {answer[:40]!r}"
    return None  # a TCP DOCKER_HOST: let testcontainers try it and report its own error
