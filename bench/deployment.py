"""Where the broker benchmarks run: a fresh catalog per benchmark, and its processes.

A :class:`Testbed` gives every benchmark its own topic prefix, Faust app id and data dir
(a :class:`Deployment`), starts keylane workers and peers the way users do (``python -m
keylane.cli worker ...``) through keylane.testing.processes, and removes it all afterwards.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from aiokafka.admin import AIOKafkaAdminClient

from bench.harness import BenchFailure, progress
from bench.peers import READY as PEER_READY
from keylane.catalog import OUTPUT, Catalog, default_catalog_path, load_catalog
from keylane.config import Settings
from keylane.kafka.topic_admin import admin_client, apply_catalog, ensure_topic, wait_until_leaders_serve
from keylane.testing.processes import (
    READY_LINE,
    KeylaneProcess,
    LogLineProbe,
    ManagedProcess,
    settings_env,
)

REPO = Path(__file__).resolve().parent.parent
READY_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0
# Log lines after which a process will not make progress, although it keeps running: a
# keylane lane that failed stops taking work, and Faust restarts a crashed agent forever.
FATAL_MARKERS = ("no further records are processed", "Crashed reason=")


@dataclass
class Deployment:
    """A fresh catalog, app id and data dir for one benchmark."""

    name: str
    settings: Settings
    catalog: Catalog
    work_dir: Path

    @property
    def bootstrap(self) -> str:
        return self.settings.bootstrap_servers

    def topic(self, logical: str) -> str:
        return self.catalog.name(logical)

    def partitions(self, logical: str) -> int:
        return self.catalog[logical].partitions


async def wait_for_leaders(client: AIOKafkaAdminClient, topics: Sequence[str], timeout_s: float = 30) -> None:
    """Wait until the leader of every partition of fresh ``topics`` serves it, so that no
    benchmark's first records meet a NotLeaderForPartition retry."""
    leaderless = await wait_until_leaders_serve(client, list(topics), timeout_s=timeout_s)
    if leaderless:
        shown = ", ".join(leaderless[:5])
        raise BenchFailure(f"partitions {shown} have no serving leader after {timeout_s:.0f}s")


async def start(process: ManagedProcess) -> ManagedProcess:
    """Start ``process`` and wait until it is ready (ProcessFailed if it is not)."""
    return await asyncio.to_thread(process.start, wait_ready_s=READY_TIMEOUT_S)


async def stop(process: ManagedProcess) -> int | None:
    """SIGTERM, wait; SIGKILL after STOP_TIMEOUT_S. Returns the exit code."""
    code = await asyncio.to_thread(process.stop, STOP_TIMEOUT_S)
    if code == -signal.SIGKILL:
        progress(f"{process.name} ignored SIGTERM for {STOP_TIMEOUT_S:.0f}s; killed it")
    return code


class Testbed:
    """The deployments and processes of one benchmark run against one broker."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.run_id = f"bench-{time.strftime('%m%d%H%M%S')}-{uuid.uuid4().hex[:4]}"
        self.work_dir = Path(tempfile.mkdtemp(prefix=f"keylane-{self.run_id}-"))
        self.catalog_path = default_catalog_path()
        self.processes: list[ManagedProcess] = []

    async def deploy(self, name: str, extra_topics: Sequence[str] = ()) -> Deployment:
        """Create the catalog (and ``extra_topics``, shaped like agent.output) under a fresh prefix."""
        app_id = f"{self.run_id}-{name}"
        settings = Settings(
            bootstrap_servers=self.bootstrap,
            topic_prefix=f"{app_id}.",
            app_id=app_id,
            data_dir=self.work_dir / name / "data",
            session_timeout_s=6,
        )
        catalog = load_catalog(prefix=settings.topic_prefix, path=self.catalog_path)
        async with admin_client(settings) as client:
            await apply_catalog(client, catalog)
            output = catalog[OUTPUT]
            for topic in extra_topics:
                await ensure_topic(
                    client,
                    name=topic,
                    partitions=output.partitions,
                    replication_factor=output.replication_factor,
                    configs=output.broker_configs(),
                )
            await wait_for_leaders(client, [spec.name for spec in catalog] + list(extra_topics))
        (self.work_dir / name).mkdir(parents=True, exist_ok=True)
        return Deployment(name, settings, catalog, self.work_dir / name)

    def _env(self, **extra: str) -> dict[str, str]:
        inherited = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("KEYLANE_") and k != "KAFKA_BOOTSTRAP_SERVERS"
        }
        return {**inherited, "PYTHONUNBUFFERED": "1", **extra}

    def worker(
        self, deployment: Deployment, *, agent: str, config: str, metrics_port: int = 0, **env: str
    ) -> KeylaneProcess:
        """A `keylane worker` of ``deployment`` (not started)."""
        settings = deployment.settings.with_overrides(metrics_port=metrics_port)
        environment = self._env(
            **settings_env(settings),
            KEYLANE_LOG_LEVEL="info",
            KEYLANE_TOPIC_CATALOG=str(self.catalog_path),
            **env,
        )
        name = f"{deployment.name} worker"
        process = KeylaneProcess(
            ["worker", "--agent", agent, "--config", config],
            environment,
            self._log_path(deployment, name),
            name=name,
            cwd=REPO,
            fatal_lines=FATAL_MARKERS,
        )
        self.processes.append(process)
        return process

    def peer(self, deployment: Deployment, kind: str, source: str, sink: str) -> ManagedProcess:
        """A peer (bench/peers.py) of ``kind`` forwarding ``source`` to ``sink`` (not started)."""
        group = f"{deployment.settings.app_id}-peer-{kind}"
        argv = [
            *(sys.executable, "-m", "bench.peers", kind),
            *("--bootstrap", self.bootstrap, "--input", source, "--output", sink, "--group", group),
            *("--data-dir", str(deployment.work_dir / f"peer-{kind}")),
        ]
        # The Faust peer is a plain Faust app: its readiness is Faust's log line, whatever
        # keylane's own probe becomes.
        ready = LogLineProbe(PEER_READY if kind == "aiokafka" else READY_LINE)
        name = f"{kind} peer"
        process = ManagedProcess(
            argv,
            self._env(),
            self._log_path(deployment, name),
            name=name,
            cwd=REPO,
            ready=ready,
            fatal_lines=FATAL_MARKERS,
        )
        self.processes.append(process)
        return process

    @staticmethod
    def _log_path(deployment: Deployment, name: str) -> Path:
        return deployment.work_dir / f"{name.replace(' ', '-')}.log"

    async def stop_all(self) -> None:
        for process in reversed(self.processes):
            await stop(process)
        self.processes.clear()

    async def delete_topics(self) -> None:
        """Best effort: remove every topic this run created (catalogs, peers, changelogs)."""
        settings = Settings(bootstrap_servers=self.bootstrap)
        try:
            async with admin_client(settings) as client:
                ours = [t for t in await client.list_topics() if t.startswith(self.run_id)]
                if ours:
                    await client.delete_topics(ours)
        except Exception as exc:  # noqa: BLE001 - clean-up must not hide the results
            progress(f"could not delete the run's topics ({type(exc).__name__}: {exc})")
