"""Runs keylane processes: an agent worker or an effector, each until SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import fcntl
import importlib.metadata
import logging
from pathlib import Path
from typing import IO

from keylane import metrics
from keylane.authoring.tools import default_registry
from keylane.catalog import INTENTS, Catalog
from keylane.config import Settings
from keylane.core.activation import KeyRuntime
from keylane.errors import ConfigError, TopicDrift
from keylane.kafka.app import App, build_app, changelog_record_limit, readiness, run
from keylane.kafka.clean_stop import discard_stores_after_unclean_stop, mark_clean_stop
from keylane.kafka.delivery import delivery_guard
from keylane.kafka.group_identity import refuse_foreign_agent, worker_client_id
from keylane.kafka.rocksdb_store import OFFSET_WRITE_INTERVAL_S
from keylane.kafka.topic_admin import admin_client, inspect_catalog, quiet_client_logs
from keylane.llm.errors import PROVIDER_ERRORS, RETRIABLE_ERRORS
from keylane.llm.provider_config import parse_provider_url
from keylane.llm.resilience import BreakerState, ResilientProvider
from keylane.llm.types import ProviderError
from keylane.loader import import_module, load_agent
from keylane.signing import parse_mode
from keylane.stages.agent import AgentProcessor
from keylane.stages.collector import collect_less_often, freeze_startup_objects
from keylane.stages.effector.service import Effector
from keylane.stages.health import Check, Heartbeat, MetricsServer
from keylane.stages.shard_keys import ShardKeys

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
    for report in reports:
        drift = report.partition_mismatch
        if drift is not None:
            raise TopicDrift(
                f"topic {report.spec.name} has {drift.have} partitions, the catalog says "
                f"{report.spec.partitions}; run 'keylane topics check' and recreate it"
            )


def serve_metrics(port: int, *, healthy: Check, ready: Check, host: str = "0.0.0.0") -> MetricsServer:  # noqa: S104
    """Serve /metrics, /healthz and /readyz on host:port (KEYLANE_METRICS_HOST, every interface
    by default) from daemon threads (service/keylane/stages/health.py); ConfigError, one line,
    when the port is taken or the address is not this machine's."""
    try:
        server = MetricsServer(port, healthy=healthy, ready=ready, host=host)
    except OSError as exc:
        raise ConfigError(
            f"cannot serve /metrics on {host}:{port} ({exc.strerror}); set KEYLANE_METRICS_PORT to a free "
            "port (0 disables it) and KEYLANE_METRICS_HOST to an address of this machine"
        ) from exc
    log.info("metrics on http://%s:%s/metrics, health on /healthz and /readyz", host, port)
    return server.start()


def keylane_version() -> str:
    """The installed keylane's version (``keylane_info``'s ``version``)."""
    try:
        return importlib.metadata.version("keylane")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def run_worker(settings: Settings, catalog: Catalog, *, agent_ref: str, config_ref: str | None) -> int:
    """Run one agent until a signal; returns the exit code."""
    agent, config = load_agent(agent_ref, config_ref)
    provider = provider_from_url(settings.provider) if settings.provider else None
    with quiet_client_logs():
        asyncio.run(verify_topics(settings, catalog))
        asyncio.run(refuse_foreign_agent(settings, agent_ref))
    # Its stores do not outlive a crash (_run's restore_after_crash): their offsets can wait,
    # and their writes need no log to survive one.
    app = build_app(
        settings,
        catalog,
        client_id=worker_client_id(agent_ref),
        offset_write_interval_s=OFFSET_WRITE_INTERVAL_S,
        write_ahead_log=False,
    )
    runtime = KeyRuntime(
        agent,
        config,
        provider=provider,
        keyring=settings.keyring(),
        approval_signatures=parse_mode(settings.approval_signatures, "KEYLANE_APPROVAL_SIGNATURES"),
        result_signatures=parse_mode(settings.result_signatures, "KEYLANE_RESULT_SIGNATURES"),
        changelog_max_bytes=changelog_record_limit(app, catalog),
    )
    processor = AgentProcessor(app, catalog, runtime, sharded=config.shards is not None)
    if config.shards is not None:
        ShardKeys(config.shards, assignment=config.shard_assignment).install(
            app, catalog, processor.publisher
        )
    metrics.zero(metrics.LLM_ERRORS, (error.__name__ for error in PROVIDER_ERRORS))
    metrics.zero(metrics.LLM_RETRIES, (error.__name__ for error in RETRIABLE_ERRORS))
    log.info("keylane worker %s running %s on %s", settings.app_id, agent_ref, settings.bootstrap_servers)
    return _run(app, settings, role="worker", app_id=settings.app_id, restore_after_crash=True)


def provider_from_url(url: str) -> ResilientProvider:
    """The provider a URL names, with its retries and breaker reported as metrics."""
    provider_settings = parse_provider_url(url)
    log.info("model provider: %s", provider_settings.redacted())

    def retried(error: ProviderError, delay_s: float) -> None:
        metrics.LLM_RETRIES.labels(type(error).__name__).inc()

    def breaker_moved(old: BreakerState, new: BreakerState) -> None:
        metrics.LLM_BREAKER_OPEN.set(0 if new == "closed" else 1)
        log.warning("provider circuit breaker %s -> %s", old, new)

    return provider_settings.build(on_retry=retried, on_state_change=breaker_moved)


def run_effector(
    settings: Settings, catalog: Catalog, *, tool_modules: list[str], tool_timeout_s: float
) -> int:
    """Run the effector until a signal; tools come from the modules named (their @tool calls)."""
    for module in tool_modules:
        import_module(module, "--tools")
    if not default_registry.names():
        raise ConfigError("no tools are registered: pass --tools with the module(s) that declare them")
    with quiet_client_logs():
        asyncio.run(verify_topics(settings, catalog))
    effector_settings = settings.with_overrides(
        app_id=f"{settings.app_id}-effector", data_dir=Path(settings.data_dir) / "effector"
    )
    app = build_app(
        effector_settings, catalog, partitions=catalog[INTENTS].partitions, client_id="keylane-effector"
    )
    Effector(
        app,
        catalog,
        default_registry,
        tool_timeout_s=tool_timeout_s,
        keyring=settings.keyring(),
        intent_signatures=parse_mode(settings.intent_signatures, "KEYLANE_INTENT_SIGNATURES"),
    )
    log.info("keylane effector with tools %s", ", ".join(default_registry.names()))
    # Claims are one record each, and a Done the local store holds is written again before its
    # result is republished: what a crash left there saves a tool a second run.
    return _run(app, effector_settings, role="effector", app_id=settings.app_id, restore_after_crash=False)


CRASH_EXIT_AFTER_S = 20.0
"""A process whose produce failed exits this long after its crash began at the latest."""


def _run(app: App, settings: Settings, *, role: str, app_id: str, restore_after_crash: bool) -> int:
    """Run a worker's or an effector's app until a signal, with its metrics port (when
    ``settings.metrics_port`` is not 0) and ``keylane_info``; returns the exit code. With
    ``restore_after_crash``, table stores are kept only across a clean stop
    (service/keylane/kafka/clean_stop.py)."""
    delivery_guard(app).exit_after_s = CRASH_EXIT_AFTER_S
    data_dir = Path(settings.data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    lock = _lock_data_dir(data_dir)
    metrics.set_info(role=role, app_id=app_id, topic_prefix=settings.topic_prefix, version=keylane_version())
    metrics.zero_fixed_labels()
    heartbeat = Heartbeat()
    if settings.metrics_port:
        serve_metrics(
            settings.metrics_port,
            healthy=heartbeat.problem,
            ready=readiness(app).not_ready,
            host=settings.metrics_host,
        )
    if restore_after_crash:
        discard_stores_after_unclean_stop(app, data_dir)
    freeze_startup_objects(app)
    collect_less_often()
    code = 0
    try:
        try:
            run(app, loglevel=settings.log_level.upper(), on_loop=heartbeat.start)
        except SystemExit as exc:
            code = int(exc.code or 0)
        if code == 0 and restore_after_crash:
            mark_clean_stop(app, data_dir)
    finally:
        lock.close()
    return code


def _lock_data_dir(data_dir: Path) -> IO[bytes]:
    """Hold an exclusive lock on the data dir for the life of the process.

    RocksDB would refuse a second process only when it opens a table during a rebalance,
    crashing the worker then; refusing at start-up says what to fix instead.
    """
    handle = (data_dir / ".keylane.lock").open("wb")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise ConfigError(
            f"another keylane process uses the data dir {data_dir}; give each worker its own KEYLANE_DATA_DIR"
        ) from None
    return handle
