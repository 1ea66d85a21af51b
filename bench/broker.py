"""Broker-backed benchmarks: keylane workers and their peers through one real Kafka broker.

Entry point: :func:`run_broker_benchmarks`. Every benchmark gets a fresh catalog under its
own topic prefix (6 co-partitioned partitions), its own Faust app id and data dir, and
starts its processes the way users do (``python -m keylane.cli worker ...``).

Throughput, the same way for keylane and the peers: pre-fill the input topic, then start
the consumer system, and take ``(count - 1) / (last - first)`` over the output records'
timestamps (CreateTime: when the producer of keylane's worker or of a peer took the record;
a producer's bounded buffer makes that its delivery rate over a run), so group join and
start-up are excluded. Latency: output record timestamp minus input record timestamp, in
ms on one machine's clock; and, as a check that includes the output's delivery, the time a
reader tailing agent.output received it minus the input timestamp.

Results (names from bench/names.py):

* ``e2e_noop``: rate = records/s of the no-op agent over 1,000 keys; samples = e2e latency
  (ms) of records produced live at a moderate fixed rate to the same worker, after its
  throughput phase and a 2 s settle; extra: ``ratio_to_aiokafka`` and ``ratio_to_faust``
  (keylane rate / peer rate), each peer's rate, ``received_latency_p50_ms`` /
  ``received_latency_p99_ms`` (by the reader's clock), the counts and the live rate;
* ``peer_aiokafka_loop`` / ``peer_faust_table``: rate = records/s of each peer on the same
  pre-filled input topic (run before keylane, each with its own consumer group);
* ``per_key_ceiling``: rate = activations/s of one hot key with a 50 ms FakeLLM call;
  extra: ``mean_activation_ms`` (keylane_activation_ms sum / count from /metrics),
  ``bound_rate`` = 1000 / mean_activation_ms, ``ratio`` = rate / bound_rate;
* ``hot_key_fanout_n{N}``: the same hot key behind ShardKeys(N); extra: ``shards``,
  ``ratio_to_n1``, ``spread`` (outputs per physical key), ``partitions`` (the partition,
  i.e. the lane, of each physical key), ``lanes`` (distinct partitions with traffic),
  ``events_per_lane``, ``lane_bound_rate`` ((events - 1) / ((busiest lane's events - 1) x
  mean_activation_ms / 1000): the rate this spread allows with perfect lanes),
  ``ideal_ratio`` (lane_bound_rate over one lane's 1000 / mean_activation_ms: the ratio to
  N=1 this spread allows) and ``efficiency`` (rate / lane_bound_rate).

The hot key's events carry distinct payloads, so ShardKeys spreads them by hash the way it
spreads real traffic: a finite sample is uneven, and shards whose physical keys hash to the
same partition share that partition's serial lane. Both limits are in the rate; the extras
say how much of the gap to N x each one explains.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import http.client
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from bench.agents import LLM_LATENCY_MS, SHARDS_ENV
from bench.harness import Recorder, Result, Size, percentile, progress
from bench.names import E2E_NOOP, FANOUT_SHARDS, HOT_KEY_FANOUT, PEER_AIOKAFKA, PEER_FAUST, PER_KEY_CEILING
from bench.peers import READY as PEER_READY
from keylane.catalog import (
    ERRORS,
    EVENTS,
    EVENTS_SHARDED,
    OUTPUT,
    Catalog,
    default_catalog_path,
    load_catalog,
)
from keylane.config import Settings
from keylane.kafka.faust_glue import expected_partition
from keylane.kafka.topic_admin import admin_client, apply_catalog
from keylane.records import ID_HEADER
from keylane.wire import AgentEnvelope, encode

REPO = Path(__file__).resolve().parent.parent
WORKER_READY = "[^Worker]: Ready"
HOT_KEY = b"hot-entity"
READY_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0
SETTLE_S = 2.0


@dataclass(frozen=True)
class Plan:
    """How much each broker benchmark does at one size."""

    noop_records: int  # pre-filled records for e2e_noop and both peers
    noop_keys: int
    latency_records: int  # produced live for e2e_noop's latency samples
    latency_rate: float  # records/s of the live phase
    ceiling_events: int  # events of the one hot key in per_key_ceiling
    fanout_events: int  # events of the one hot key for every N of hot_key_fanout


PLANS: dict[str, Plan] = {
    "smoke": Plan(
        noop_records=2000,
        noop_keys=1000,
        latency_records=100,
        latency_rate=100,
        ceiling_events=20,
        fanout_events=24,
    ),
    "quick": Plan(
        noop_records=6000,
        noop_keys=1000,
        latency_records=400,
        latency_rate=200,
        ceiling_events=40,
        fanout_events=96,
    ),
    "full": Plan(
        noop_records=60_000,
        noop_keys=1000,
        latency_records=6000,
        latency_rate=200,
        ceiling_events=300,
        fanout_events=800,
    ),
}


class BenchFailure(RuntimeError):
    """A broker benchmark could not measure what it set out to (said in one message)."""


# ---------------------------------------------------------------------------------------
# Processes


# Log lines after which a process will not make progress, although it keeps running: a
# keylane lane that failed stops taking work, and Faust restarts a crashed agent forever.
FATAL_MARKERS = ("no further records are processed", "Crashed reason=")


def _open_log(path: Path) -> IO[bytes]:
    return path.open("ab")


def _read_from(path: Path, offset: int) -> bytes:
    if not path.exists():
        return b""
    with path.open("rb") as log:
        log.seek(offset)
        return log.read()


class Process:
    """One subprocess (a keylane worker or a peer) with its log file."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_path: Path, ready: str) -> None:
        self.name = name
        self.argv = argv
        self.env = env
        self.log_path = log_path
        self.ready = ready
        self.proc: asyncio.subprocess.Process | None = None
        self.is_ready = False
        self._scanned = 0  # bytes of the log already scanned
        self._carry = ""  # the scanned text's end, for markers split across reads

    async def start(self, *, wait_ready_s: float = READY_TIMEOUT_S) -> Process:
        log = _open_log(self.log_path)
        try:
            self._scanned = log.tell()
            self.proc = await asyncio.create_subprocess_exec(
                *self.argv, env=self.env, cwd=REPO, stdout=log, stderr=asyncio.subprocess.STDOUT
            )
        finally:
            log.close()
        deadline = time.monotonic() + wait_ready_s
        while True:
            self.check_alive()
            if self.is_ready:
                return self
            if time.monotonic() > deadline:
                raise BenchFailure(f"{self.name} not ready within {wait_ready_s:.0f}s:\n{self.tail()}")
            await asyncio.sleep(0.1)

    def check_alive(self) -> None:
        """Raise BenchFailure if the process exited or logged that it stopped making progress."""
        if self.proc is not None and self.proc.returncode is not None:
            raise BenchFailure(f"{self.name} exited with {self.proc.returncode}:\n{self.tail()}")
        new = _read_from(self.log_path, self._scanned)
        self._scanned += len(new)
        text = self._carry + new.decode(errors="replace")
        self._carry = text[-200:]
        if self.ready in text:
            self.is_ready = True
        for marker in FATAL_MARKERS:
            at = text.find(marker)
            if at >= 0:
                raise BenchFailure(f"{self.name} logged {marker!r}:\n{text[max(0, at - 300) : at + 2500]}")

    async def stop(self) -> int | None:
        """SIGTERM, wait; SIGKILL after STOP_TIMEOUT_S. Returns the exit code."""
        proc = self.proc
        if proc is None:
            return None
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), timeout=STOP_TIMEOUT_S)
            except TimeoutError:
                progress(f"{self.name} ignored SIGTERM for {STOP_TIMEOUT_S:.0f}s; killing it")
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        return proc.returncode

    def tail(self, chars: int = 3000) -> str:
        return _read_from(self.log_path, 0)[-chars:].decode(errors="replace")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _scrape(port: int) -> dict[str, float]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        connection.request("GET", "/metrics")
        text = connection.getresponse().read().decode()
    finally:
        connection.close()
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            with contextlib.suppress(ValueError):
                samples[name] = float(value)
    return samples


async def mean_activation_ms(port: int) -> tuple[float, int]:
    """E[activation_ms] and the activation count, from a worker's /metrics."""
    samples = await asyncio.to_thread(_scrape, port)
    count = samples.get("keylane_activation_ms_count", 0.0)
    if not count:
        raise BenchFailure(f"/metrics on port {port} shows no activations")
    return samples["keylane_activation_ms_sum"] / count, int(count)


# ---------------------------------------------------------------------------------------
# Topics


@dataclass(frozen=True)
class OutRecord:
    key: bytes | None
    value: bytes
    timestamp: int  # the record's timestamp, ms
    record_id: str | None
    received_ms: float  # when the reader got it (wall clock, ms)


class Reader:
    """Reads one topic from the beginning, all partitions, without a consumer group."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        self.topic = topic
        self.partitions = [TopicPartition(topic, p) for p in range(partitions)]
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest"
        )
        self.seen_ids: set[str] = set()
        self.duplicates = 0

    async def start(self) -> Reader:
        await self.consumer.start()
        self.consumer.assign(self.partitions)
        await self.consumer.seek_to_beginning(*self.partitions)
        return self

    async def stop(self) -> None:
        await self.consumer.stop()

    async def take(
        self,
        count: int,
        *,
        timeout_s: float,
        watch: Sequence[Process] = (),
        match: Callable[[OutRecord], bool] = lambda record: True,
    ) -> list[OutRecord]:
        """The next ``count`` matching records (at least), or BenchFailure on timeout or when a
        watched process dies. Records with a ``keylane.id`` seen before are skipped."""
        got: list[OutRecord] = []
        deadline = time.monotonic() + timeout_s
        while len(got) < count:
            for process in watch:
                process.check_alive()
            if time.monotonic() > deadline:
                raise BenchFailure(
                    f"only {len(got)} of {count} records arrived on {self.topic} in {timeout_s:.0f}s"
                )
            batch = await self.consumer.getmany(timeout_ms=200)
            received_ms = time.time() * 1000
            for messages in batch.values():
                for message in messages:
                    headers = dict(message.headers or ())
                    raw_id = headers.get(ID_HEADER)
                    record_id = raw_id.decode() if raw_id is not None else None
                    if record_id is not None:
                        if record_id in self.seen_ids:
                            self.duplicates += 1
                            continue
                        self.seen_ids.add(record_id)
                    record = OutRecord(
                        message.key, message.value or b"", message.timestamp, record_id, received_ms
                    )
                    if match(record):
                        got.append(record)
        return got


async def record_count(bootstrap: str, topic: str, partitions: int) -> int:
    """How many records ``topic`` holds (sum of end offsets; the topics are fresh)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        ends = await consumer.end_offsets([TopicPartition(topic, p) for p in range(partitions)])
        return int(sum(ends.values()))
    finally:
        await consumer.stop()


async def produce_all(bootstrap: str, topic: str, records: Sequence[tuple[bytes, bytes]]) -> None:
    """Produce (key, value) pairs fast: murmur2 partitioner, acks=all, batched sends."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        futures = [await producer.send(topic, key=key, value=value) for key, value in records]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def produce_paced(
    bootstrap: str, topic: str, records: Sequence[tuple[bytes, bytes]], rate: float
) -> list[int]:
    """Produce at a fixed rate (records/s); the input timestamps (ms), in order."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        loop = asyncio.get_running_loop()
        started = loop.time()
        futures = []
        for i, (key, value) in enumerate(records):
            delay = started + i / rate - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            futures.append(await producer.send(topic, key=key, value=value))
        metadata = await asyncio.gather(*futures)
        return [m.timestamp for m in metadata]
    finally:
        await producer.stop()


def rate_of(records: Sequence[OutRecord]) -> float:
    """(count - 1) / (last - first output timestamp), per second."""
    stamps = sorted(r.timestamp for r in records)
    span_s = (stamps[-1] - stamps[0]) / 1000 if stamps else 0.0
    if len(stamps) < 2 or span_s <= 0:
        raise BenchFailure(
            f"{len(stamps)} outputs within {span_s * 1000:.0f} ms: too few to time; raise the size"
        )
    return (len(stamps) - 1) / span_s


async def wait_for_leaders(client: AIOKafkaAdminClient, topics: Sequence[str], timeout_s: float = 30) -> None:
    """Wait until every partition of fresh ``topics`` has a leader. (The broker may still
    answer the first requests with a retriable NotLeaderForPartition for a moment.)"""
    deadline = time.monotonic() + timeout_s
    while True:
        described = await client.describe_topics(list(topics))
        if all(
            d["error_code"] == 0 and d["partitions"] and all(p["leader"] >= 0 for p in d["partitions"])
            for d in described
        ):
            return
        if time.monotonic() > deadline:
            raise BenchFailure(f"topics {', '.join(topics)} have no leaders after {timeout_s:.0f}s")
        await asyncio.sleep(0.1)


@dataclass(frozen=True)
class PrefilledRun:
    """One worker run over pre-filled events: its outputs, their rate, the worker's
    E[activation_ms]."""

    outputs: list[OutRecord]
    rate: float
    mean_activation_ms: float
    partitions: int  # of the co-partitioned topics: the lanes a key can hash to


# ---------------------------------------------------------------------------------------
# One benchmark's deployment


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


class BrokerBench:
    """Runs the broker benchmarks of one size against one broker."""

    def __init__(self, recorder: Recorder, plan: Plan, bootstrap: str) -> None:
        self.recorder = recorder
        self.plan = plan
        self.bootstrap = bootstrap
        self.run_id = f"bench-{time.strftime('%m%d%H%M%S')}-{uuid.uuid4().hex[:4]}"
        self.work_dir = Path(tempfile.mkdtemp(prefix=f"keylane-{self.run_id}-"))
        self.catalog_path = default_catalog_path()
        self.processes: list[Process] = []
        self.fanout_n1_rate: float | None = None

    # -- set-up and processes -------------------------------------------------------------

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
            if extra_topics:
                output = catalog[OUTPUT]
                response = await client.create_topics(
                    [
                        NewTopic(
                            t,
                            output.partitions,
                            output.replication_factor,
                            topic_configs=output.broker_configs(),
                        )
                        for t in extra_topics
                    ]
                )
                for topic, code, message in response.topic_errors:
                    if code != 0:
                        raise BenchFailure(f"creating topic {topic} failed: {message or code}")
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
    ) -> Process:
        settings = deployment.settings
        environment = self._env(
            KEYLANE_BOOTSTRAP_SERVERS=settings.bootstrap_servers,
            KEYLANE_TOPIC_PREFIX=settings.topic_prefix,
            KEYLANE_APP_ID=settings.app_id,
            KEYLANE_DATA_DIR=str(settings.data_dir),
            KEYLANE_METRICS_PORT=str(metrics_port),
            KEYLANE_SESSION_TIMEOUT_S="6",
            KEYLANE_LOG_LEVEL="info",
            KEYLANE_TOPIC_CATALOG=str(self.catalog_path),
            **env,
        )
        argv = [sys.executable, "-m", "keylane.cli", "worker", "--agent", agent, "--config", config]
        return self._process(f"{deployment.name} worker", argv, environment, deployment, WORKER_READY)

    def peer(self, deployment: Deployment, kind: str, source: str, sink: str) -> Process:
        group = f"{deployment.settings.app_id}-peer-{kind}"
        argv = [
            *(sys.executable, "-m", "bench.peers", kind),
            *("--bootstrap", self.bootstrap, "--input", source, "--output", sink, "--group", group),
            *("--data-dir", str(deployment.work_dir / f"peer-{kind}")),
        ]
        ready = PEER_READY if kind == "aiokafka" else WORKER_READY
        return self._process(f"{kind} peer", argv, self._env(), deployment, ready)

    def _process(
        self, name: str, argv: list[str], env: dict[str, str], deployment: Deployment, ready: str
    ) -> Process:
        log_path = deployment.work_dir / f"{name.replace(' ', '-')}.log"
        process = Process(name, argv, env, log_path, ready)
        self.processes.append(process)
        return process

    async def stop_all(self) -> None:
        for process in reversed(self.processes):
            await process.stop()
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

    # -- the benchmarks --------------------------------------------------------------------

    async def e2e_and_peers(self) -> None:
        """e2e_noop and both peers, on one pre-filled input topic."""
        plan = self.plan
        sinks = {kind: f"{self.run_id}-e2e.peer.{kind}.output" for kind in ("aiokafka", "faust")}
        deployment = await self.deploy("e2e", extra_topics=list(sinks.values()))
        source = deployment.topic(EVENTS)
        keys = [f"key-{k:04d}".encode() for k in range(plan.noop_keys)]
        records = [
            (keys[i % len(keys)], encode(AgentEnvelope(payload=f"p{i}"))) for i in range(plan.noop_records)
        ]
        progress(f"e2e_noop: pre-filling {len(records)} records over {len(keys)} keys")
        await produce_all(self.bootstrap, source, records)
        timeout_s = 60 + plan.noop_records / 100

        # The peers first: keylane's latency phase adds records to the input afterwards.
        peer_rates: dict[str, float] = {}
        peer_failure: BenchFailure | None = None
        for kind, name in (("aiokafka", PEER_AIOKAFKA), ("faust", PEER_FAUST)):
            progress(f"{name}: {kind} peer over the same {len(records)} records")
            peer = self.peer(deployment, kind, source, sinks[kind])
            reader = Reader(self.bootstrap, sinks[kind], deployment.partitions(OUTPUT))
            try:
                await reader.start()
                await peer.start()
                outputs = await reader.take(len(records), timeout_s=timeout_s, watch=[peer])
                peer_rates[kind] = rate_of(outputs)
            except BenchFailure as exc:
                # keylane is still measured; the step fails at its end.
                progress(f"FAILED {name}: {exc}")
                peer_failure = peer_failure or exc
                continue
            finally:
                await peer.stop()
                await reader.stop()
            self.recorder.add(
                Result(
                    name=name,
                    unit="records/s",
                    rate=peer_rates[kind],
                    extra={"records": len(outputs), "keys": len(keys)},
                )
            )

        progress(f"{E2E_NOOP}: keylane worker, no-op agent")
        worker = self.worker(deployment, agent="bench.agents:noop", config="bench.agents:noop_config")
        reader = Reader(self.bootstrap, deployment.topic(OUTPUT), deployment.partitions(OUTPUT))
        try:
            await reader.start()
            await worker.start()
            outputs = await reader.take(
                len(records), timeout_s=timeout_s, watch=[worker], match=lambda r: r.value.startswith(b"p")
            )
            rate = rate_of(outputs)
            progress(
                f"{E2E_NOOP}: {rate:.0f} records/s; latency phase: {plan.latency_records} records "
                f"at {plan.latency_rate:.0f}/s"
            )
            # Let the worker finish what follows a burst (producer drain, commit) first: the
            # latency phase measures a worker at moderate load, not the tail of the burst.
            await asyncio.sleep(SETTLE_S)
            live = [
                (keys[i % len(keys)], encode(AgentEnvelope(payload=f"l{i}")))
                for i in range(plan.latency_records)
            ]
            sent_ms, latency_outputs = await asyncio.gather(
                produce_paced(self.bootstrap, source, live, plan.latency_rate),
                reader.take(
                    len(live),
                    timeout_s=60 + len(live) / plan.latency_rate,
                    watch=[worker],
                    match=lambda r: r.value.startswith(b"l"),
                ),
            )
            errors = await record_count(
                self.bootstrap, deployment.topic(ERRORS), deployment.partitions(ERRORS)
            )
        finally:
            await worker.stop()
            await reader.stop()
        if errors:
            raise BenchFailure(f"{E2E_NOOP}: {errors} records on agent.errors; see {worker.log_path}")
        produced_at = {b"l%d" % i: ms for i, ms in enumerate(sent_ms)}
        latencies = [float(r.timestamp - produced_at[r.value]) for r in latency_outputs]
        received = sorted(r.received_ms - produced_at[r.value] for r in latency_outputs)
        extra: dict[str, Any] = {
            "records": len(outputs),
            "keys": len(keys),
            "latency_records": len(latencies),
            "latency_produce_rate": plan.latency_rate,
            "latency_source": "output CreateTime - input CreateTime (ms)",
            "received_latency_p50_ms": percentile(received, 50),
            "received_latency_p99_ms": percentile(received, 99),
            "duplicates": reader.duplicates,
        }
        for kind, peer_rate in peer_rates.items():
            extra[f"{kind}_rate"] = peer_rate
            extra[f"ratio_to_{kind}"] = rate / peer_rate
        self.recorder.add(Result(name=E2E_NOOP, unit="ms", samples=latencies, rate=rate, extra=extra))
        if peer_failure is not None:
            raise peer_failure

    async def hot_key(self, name: str, *, events: int, config: str, payload: str, **env: str) -> PrefilledRun:
        """The 50 ms agent on ``events`` pre-filled events of HOT_KEY (distinct payloads
        ``<payload><i>``); a pessimistic 10 events/s, plus start-up, before giving up."""
        deployment = await self.deploy(name)
        records = [(HOT_KEY, encode(AgentEnvelope(payload=f"{payload}{i}"))) for i in range(events)]
        return await self.run_prefilled(deployment, records, config=config, timeout_s=60 + events / 10, **env)

    async def run_prefilled(
        self,
        deployment: Deployment,
        records: list[tuple[bytes, bytes]],
        *,
        config: str,
        timeout_s: float,
        **env: str,
    ) -> PrefilledRun:
        """Produce ``records`` to the deployment's events, then start one worker with the 50 ms
        agent and ``config``; measured from its outputs and its /metrics."""
        await produce_all(self.bootstrap, deployment.topic(EVENTS), records)
        port = free_port()
        worker = self.worker(
            deployment, agent="bench.agents:model_call", config=config, metrics_port=port, **env
        )
        reader = Reader(self.bootstrap, deployment.topic(OUTPUT), deployment.partitions(OUTPUT))
        try:
            await reader.start()
            await worker.start()
            outputs = await reader.take(len(records), timeout_s=timeout_s, watch=[worker])
            mean_ms, activations = await mean_activation_ms(port)
        finally:
            await worker.stop()
            await reader.stop()
        if activations < len(records):
            raise BenchFailure(
                f"{deployment.name}: /metrics counts {activations} activations for {len(records)} events"
            )
        return PrefilledRun(outputs, rate_of(outputs), mean_ms, deployment.partitions(EVENTS_SHARDED))

    async def per_key_ceiling(self) -> None:
        events = self.plan.ceiling_events
        progress(f"{PER_KEY_CEILING}: {events} events of one key, FakeLLM {LLM_LATENCY_MS:.0f} ms, unsharded")
        run = await self.hot_key("ceiling", events=events, config="bench.agents:config", payload="c")
        bound = 1000 / run.mean_activation_ms
        self.recorder.add(
            Result(
                name=PER_KEY_CEILING,
                unit="activations/s",
                rate=run.rate,
                extra={
                    "events": len(run.outputs),
                    "llm_latency_ms": LLM_LATENCY_MS,
                    "mean_activation_ms": run.mean_activation_ms,
                    "bound_rate": bound,
                    "ratio": run.rate / bound,
                },
            )
        )

    async def hot_key_fanout(self, shards: int) -> None:
        """hot_key_fanout_n{shards}; N=1 first, since the others' ratio_to_n1 divides by it."""
        events = self.plan.fanout_events
        name = HOT_KEY_FANOUT[shards]
        progress(f"{name}: {events} events of one key behind ShardKeys({shards})")
        run = await self.hot_key(
            f"fanout-n{shards}",
            events=events,
            config="bench.agents:sharded",
            payload="f",  # the same payloads for every N
            **{SHARDS_ENV: str(shards)},
        )
        if shards == 1:
            self.fanout_n1_rate = run.rate
        spread = Counter((r.key or b"").decode() for r in run.outputs)
        partitions = {key: expected_partition(key.encode(), run.partitions) for key in sorted(spread)}
        per_lane = Counter[int]()
        for key, count in spread.items():
            per_lane[partitions[key]] += count
        # The rate the spread allows with perfect lanes, in the same (count - 1) / span terms
        # as the rate: the busiest lane runs its (busiest - 1) activations end to end.
        busiest = max(per_lane.values())
        mean_ms = run.mean_activation_ms
        lane_bound = (len(run.outputs) - 1) * 1000 / ((busiest - 1) * mean_ms) if busiest > 1 else None
        n1_rate = self.fanout_n1_rate
        self.recorder.add(
            Result(
                name=name,
                unit="events/s",
                rate=run.rate,
                extra={
                    "shards": shards,
                    "events": len(run.outputs),
                    "ratio_to_n1": run.rate / n1_rate if n1_rate else None,
                    "spread": dict(sorted(spread.items())),
                    "partitions": partitions,
                    "lanes": len(per_lane),
                    "events_per_lane": {str(p): c for p, c in sorted(per_lane.items())},
                    "mean_activation_ms": mean_ms,
                    "lane_bound_rate": lane_bound,
                    "ideal_ratio": lane_bound * mean_ms / 1000 if lane_bound else None,
                    "efficiency": run.rate / lane_bound if lane_bound else None,
                },
            )
        )


async def run_broker_benchmarks(recorder: Recorder, *, size: Size, bootstrap: str) -> None:
    """Run every broker benchmark and add its Result to ``recorder``.

    A benchmark that fails does not stop the others; after all ran, the first failure is
    raised (the results that were measured are already recorded). Processes are stopped and
    the run's topics deleted either way.
    """
    bench = BrokerBench(recorder, PLANS[size], bootstrap)
    # Fresh topics answer the first produce and offset lookups with NotLeaderForPartition
    # for a moment; aiokafka retries them and logs each retry. Keep that off stderr: real
    # failures raise on their own.
    aiokafka_log = logging.getLogger("aiokafka")
    aiokafka_level = aiokafka_log.level
    aiokafka_log.setLevel(logging.CRITICAL)
    progress(f"broker benchmarks ({size}) on {bootstrap}; topics {bench.run_id}-*; logs in {bench.work_dir}")
    steps: list[tuple[str, Callable[[], Awaitable[None]]]] = [
        ("e2e_noop and peers", bench.e2e_and_peers),
        (PER_KEY_CEILING, bench.per_key_ceiling),
        *((HOT_KEY_FANOUT[n], functools.partial(bench.hot_key_fanout, n)) for n in FANOUT_SHARDS),
    ]
    failures: list[tuple[str, BaseException]] = []
    try:
        for label, step in steps:
            try:
                await step()
            except Exception as exc:  # noqa: BLE001 - reported below, raised after the other steps
                failures.append((label, exc))
                progress(f"FAILED {label}: {type(exc).__name__}: {exc}")
                traceback.print_exc(file=sys.stderr)
            finally:
                await bench.stop_all()
    finally:
        await bench.stop_all()
        await bench.delete_topics()
        aiokafka_log.setLevel(aiokafka_level)
    if failures:
        label, first = failures[0]
        raise BenchFailure(
            f"{len(failures)} broker benchmark step(s) failed, first {label}: {first}; "
            f"logs in {bench.work_dir}"
        ) from first
    shutil.rmtree(bench.work_dir, ignore_errors=True)
