"""`keylane worker` as a process: it refuses missing topics and echoes kcat's records."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from keylane.catalog import EVENTS, OUTPUT, Catalog
from keylane.config import Settings
from keylane.testing.processes import free_port
from tests.kafka_io import consume, kcat_produce
from tests.processes import KeylaneProcess, process_env

pytestmark = pytest.mark.kafka


def http_get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - a loopback URL we built
        return int(response.status), response.read().decode()


@pytest.fixture
def metrics_port() -> int:
    return free_port()


@pytest.fixture
def worker(
    settings: Settings, catalog: Catalog, tmp_path: Path, metrics_port: int
) -> Iterator[KeylaneProcess]:
    process = KeylaneProcess(
        ["worker", "--agent", "examples.echo:agent"],
        process_env(settings, KEYLANE_METRICS_PORT=str(metrics_port)),
        tmp_path / "worker.log",
    )
    process.start()
    yield process
    assert process.stop() == 0, process.tail()


async def test_worker_echoes_records_produced_by_kcat(
    settings: Settings, catalog: Catalog, worker: KeylaneProcess
) -> None:
    kcat_produce(
        settings,
        catalog.name(EVENTS),
        b'entity-1|{"v":1,"payload":"first"}\nentity-2|{"v":1,"payload":"second"}\n',
    )

    echoed = await consume(settings, catalog.name(OUTPUT), 2, timeout_s=60)

    assert sorted(echoed) == [(b"entity-1", b"first"), (b"entity-2", b"second")]
    assert worker.running, "the worker must keep running"


async def test_worker_serves_prometheus_metrics(
    settings: Settings, catalog: Catalog, worker: KeylaneProcess, metrics_port: int
) -> None:
    kcat_produce(settings, catalog.name(EVENTS), b'k|{"v":1,"payload":"v"}\n')
    await consume(settings, catalog.name(OUTPUT), 1, timeout_s=60)  # the worker is up by now

    status, body = await asyncio.to_thread(http_get, f"http://127.0.0.1:{metrics_port}/metrics")

    assert status == 200
    assert "process_cpu_seconds_total" in body
    assert 'keylane_activations_total{kind="start"} 1.0' in body


def test_worker_refuses_to_start_without_topics(settings: Settings) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "keylane.cli", "worker", "--agent", "examples.echo:agent"],
        env=process_env(settings),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith("keylane: topics ")
    assert result.stderr.strip().endswith("do not exist; run 'keylane topics apply' first")
    assert "Traceback" not in result.stderr
