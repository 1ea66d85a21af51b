"""Runs a keylane worker process: checks the topics, builds the Faust app, runs it until a signal."""

from __future__ import annotations

import asyncio
import logging

import faust
import prometheus_client

from service.app import build_app, install_echo_agent
from service.catalog import Catalog
from service.config import Settings
from service.errors import ConfigError, TopicDrift
from service.topic_admin import admin_client, inspect_catalog

log = logging.getLogger(__name__)


async def verify_topics(settings: Settings, catalog: Catalog) -> None:
    """Refuse to start on a broker whose topics are missing or mis-partitioned.

    Faust would otherwise create missing topics with its own defaults, and a wrong partition
    count silently breaks co-partitioning (a key's inputs would land on different lanes).
    """
    async with admin_client(settings) as client:
        reports = await inspect_catalog(client, catalog)
    missing = [r.spec.name for r in reports if r.status == "missing"]
    if missing:
        raise TopicDrift(f"topics {', '.join(missing)} do not exist; run 'keylane topics apply' first")
    mismatched = [r for r in reports if r.partition_mismatch is not None]
    if mismatched:
        first = mismatched[0]
        raise TopicDrift(
            f"topic {first.spec.name} has {first.partition_mismatch.have} partitions, the catalog says "  # type: ignore[union-attr]
            f"{first.spec.partitions}; run 'keylane topics check' and recreate it"
        )


def serve_metrics(port: int) -> None:
    """Serve Prometheus /metrics on 0.0.0.0:port from a daemon thread."""
    try:
        prometheus_client.start_http_server(port)
    except OSError as exc:
        raise ConfigError(
            f"cannot serve /metrics on port {port} ({exc.strerror}); set KEYLANE_METRICS_PORT to a free "
            "port, or 0 to disable it"
        ) from exc
    log.info("metrics on http://0.0.0.0:%s/metrics", port)


def run_worker(settings: Settings, catalog: Catalog) -> int:
    """Run the worker in this process until SIGINT/SIGTERM; returns the exit code."""
    asyncio.run(verify_topics(settings, catalog))
    if settings.metrics_port:
        serve_metrics(settings.metrics_port)
    app = build_app(settings, catalog)
    install_echo_agent(app, catalog)
    worker = faust.Worker(app, loglevel=settings.log_level.upper(), redirect_stdouts=False)
    log.info("keylane worker %s consuming from %s", settings.app_id, settings.bootstrap_servers)
    try:
        worker.execute_from_commandline()
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0
