"""Broker-backed benchmarks: keylane workers and their peers through one real Kafka broker.

Entry point: :func:`run_broker_benchmarks`. Every benchmark gets a fresh catalog under its
own topic prefix (6 co-partitioned partitions), its own Faust app id and data dir, and
starts its processes the way users do (``python -m keylane.cli worker ...``): see
bench/deployment.py. This module is the benchmarks themselves; they fill topics with
bench/producers.py, read outputs with bench/reader.py and a worker's /metrics with
bench/scrape.py.

Throughput, the same way for keylane and the peers: pre-fill the input topic, then start
the consumer system, and take ``(count - 1) / (last - first)`` over the output records'
timestamps (CreateTime: when the producer of keylane's worker or of a peer took the record;
a producer's bounded buffer makes that its delivery rate over a run), so group join and
start-up are excluded. Latency: output record timestamp minus input record timestamp, in
ms on one machine's clock; and, as a check that includes the output's delivery, the time a
reader tailing agent.output received it minus the input timestamp.

Repetitions: every benchmark runs REPETITIONS[size] times (bench/harness.py), each on a
fresh deployment. A Result's rate is the median of its repetitions' (``repetitions`` holds
each), so the report can flag a figure whose repetitions spread more than SPREAD_LIMIT; a
ratio to a peer is the median of the repetitions' ratios, each of two rates measured side
by side. e2e_noop's live latency records are split over the repetitions.

Results (names from bench/names.py):

* ``e2e_noop``: rate = records/s of the no-op agent over 1,000 keys; samples = e2e latency
  (ms) of records produced live at a moderate fixed rate to the same worker, after its
  throughput phase and a 2 s settle; extra: ``ratio_to_aiokafka`` and ``ratio_to_faust``
  (keylane rate / peer rate), each peer's rate, ``received_latency_p50_ms`` /
  ``received_latency_p99_ms`` (by the reader's clock), the counts and the live rate;
* ``peer_aiokafka_loop`` / ``peer_faust_table``: rate = records/s of each peer on the same
  pre-filled input topic (run before keylane, each with its own consumer group);
* ``per_key_ceiling``: rate = activations/s of one hot key with a 50 ms FakeLLM call;
  extra: ``mean_activation_ms`` (keylane_activation_duration_seconds sum / count from /metrics, in ms),
  ``bound_rate`` = 1000 / mean_activation_ms, ``ratio`` = rate / bound_rate;
* ``hot_key_fanout_n{N}``: the same hot key behind ShardKeys(N); extra: ``shards``,
  ``ratio_to_n1``, ``spread`` (outputs per physical key), ``partitions`` (the partition of
  each physical key), ``lanes`` (physical keys with traffic: the worker runs key lanes, so
  each is its own serial lane whatever partition it shares), ``lane_bound_rate`` ((events -
  1) / ((busiest key's events - 1) x mean_activation_ms / 1000): the rate this spread allows
  with perfect lanes), ``ideal_ratio`` (lane_bound_rate over one lane's 1000 /
  mean_activation_ms: the ratio to N=1 this spread allows) and ``efficiency`` (rate /
  lane_bound_rate).

The hot key's events carry distinct payloads, chosen (``even_payloads``) so that ShardKeys'
hash spreads them evenly over the N physical keys: the spread-bound ideal is then N itself,
and the ratio to N=1 measures the lanes, not the luck of a finite sample's hashes.
"""

from __future__ import annotations

import asyncio
import functools
import shutil
import statistics
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from bench.agents import LLM_LATENCY_MS, SHARDS_ENV
from bench.deployment import Deployment, Testbed, start, stop
from bench.harness import (
    REPETITIONS,
    BenchFailure,
    Recorder,
    Result,
    Size,
    Step,
    percentile,
    progress,
    run_steps,
)
from bench.names import E2E_NOOP, FANOUT_SHARDS, HOT_KEY_FANOUT, PEER_AIOKAFKA, PEER_FAUST, PER_KEY_CEILING
from bench.producers import produce_all, produce_paced
from bench.reader import OutRecord, Reader, rate_of
from bench.scrape import mean_activation_ms
from keylane.catalog import ERRORS, EVENTS, EVENTS_SHARDED, OUTPUT
from keylane.kafka.partitioner import expected_partition
from keylane.kafka.topic_admin import quiet_client_logs
from keylane.kafka.topic_reader import read_to_end
from keylane.keys import shard_key
from keylane.testing.processes import ProcessFailed, free_port
from keylane.wire import AgentEnvelope, encode

HOT_KEY = b"hot-entity"
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


def noop_events(keys: int, count: int, tag: str) -> list[tuple[bytes, bytes]]:
    """e2e_noop's input: ``count`` events over ``keys`` keys ``key-<k>`` in turn, payloads
    ``<tag><i>`` (the tag tells a phase's outputs from another's)."""
    return [
        (f"key-{i % keys:04d}".encode(), encode(AgentEnvelope(payload=f"{tag}{i}"))) for i in range(count)
    ]


@dataclass
class E2eRun:
    """One repetition of e2e_noop and its peers."""

    rate: float = 0.0
    peer_rates: dict[str, float] = field(default_factory=dict)
    peer_failure: BenchFailure | ProcessFailed | None = None
    latencies: list[float] = field(default_factory=list)  # output - input CreateTime (ms)
    received: list[float] = field(default_factory=list)  # reader's receipt - input CreateTime (ms)
    duplicates: int = 0


@dataclass(frozen=True)
class PrefilledRun:
    """One worker run over pre-filled events: its outputs, their rate, the worker's
    E[activation_ms]."""

    outputs: list[OutRecord]
    rate: float
    mean_activation_ms: float
    partitions: int  # of the co-partitioned topics: the lanes a key can hash to


def even_payloads(key: bytes, shards: int, events: int) -> list[str]:
    """``events`` distinct payloads ``f<i>`` for ``key`` that ShardKeys(``shards``) spreads as
    evenly as ``events`` allows over the key's physical keys, ordered round-robin over them
    (the hash picks the shard from the record's value: see keylane.keys.shard_key)."""
    per_shard = -(-events // shards)
    by_shard: dict[bytes, list[str]] = {}
    chosen, i = 0, 0
    while chosen < events:
        payload = f"f{i}"
        i += 1
        shard = shard_key(key, shards, payload=encode(AgentEnvelope(payload=payload)))
        taken = by_shard.setdefault(shard, [])
        if len(taken) < per_shard:
            taken.append(payload)
            chosen += 1
    columns = list(by_shard.values())
    return [column[row] for row in range(per_shard) for column in columns if row < len(column)]


class BrokerBench(Testbed):
    """Runs the broker benchmarks of one size against one broker."""

    def __init__(self, recorder: Recorder, size: Size, bootstrap: str) -> None:
        super().__init__(bootstrap)
        self.recorder = recorder
        self.plan = PLANS[size]
        self.repetitions = REPETITIONS[size]
        self.fanout_n1_rate: float | None = None

    # -- the benchmarks --------------------------------------------------------------------

    async def e2e_and_peers(self) -> None:
        """e2e_noop and both peers, REPETITIONS[size] times, each repetition on a fresh
        pre-filled input topic: rates and ratios are the medians of the repetitions'."""
        reps = self.repetitions
        runs = [await self._e2e_repetition(rep, reps) for rep in range(reps)]
        for kind, name in (("aiokafka", PEER_AIOKAFKA), ("faust", PEER_FAUST)):
            rates = [run.peer_rates[kind] for run in runs if kind in run.peer_rates]
            if rates:
                self.recorder.add(
                    Result(
                        name=name,
                        unit="records/s",
                        rate=statistics.median(rates),
                        repetitions=rates,
                        extra={"records": self.plan.noop_records, "keys": self.plan.noop_keys},
                    )
                )
        rates = [run.rate for run in runs]
        latencies = [latency for run in runs for latency in run.latencies]
        received = sorted(latency for run in runs for latency in run.received)
        extra: dict[str, Any] = {
            "records": self.plan.noop_records,
            "keys": self.plan.noop_keys,
            "latency_records": len(latencies),
            "latency_produce_rate": self.plan.latency_rate,
            "latency_source": "output CreateTime - input CreateTime (ms)",
            "latency_p50_by_repetition": [percentile(sorted(run.latencies), 50) for run in runs],
            "received_latency_p50_ms": percentile(received, 50),
            "received_latency_p99_ms": percentile(received, 99),
            "duplicates": sum(run.duplicates for run in runs),
        }
        for kind in ("aiokafka", "faust"):
            paired = [(run.rate, run.peer_rates[kind]) for run in runs if kind in run.peer_rates]
            if paired:
                extra[f"{kind}_rate"] = statistics.median(peer for _, peer in paired)
                # Each repetition's ratio is of two rates measured side by side; their median
                # is steadier than the ratio of two medians when the machine's speed drifts.
                ratios = [ours / peer for ours, peer in paired]
                extra[f"ratio_to_{kind}"] = statistics.median(ratios)
                extra[f"ratio_to_{kind}_by_repetition"] = ratios
        self.recorder.add(
            Result(
                name=E2E_NOOP,
                unit="ms",
                samples=latencies,
                rate=statistics.median(rates),
                repetitions=rates,
                extra=extra,
            )
        )
        failure = next((run.peer_failure for run in runs if run.peer_failure is not None), None)
        if failure is not None:
            raise failure

    async def _e2e_repetition(self, rep: int, reps: int) -> E2eRun:
        """One repetition: both peers, then keylane's worker, over the same pre-filled
        topic; then this repetition's share of the live latency phase."""
        plan = self.plan
        label = f"e2e repetition {rep + 1}/{reps}"
        sinks = {kind: f"{self.run_id}-e2e{rep}.peer.{kind}.output" for kind in ("aiokafka", "faust")}
        deployment = await self.deploy(f"e2e{rep}", extra_topics=list(sinks.values()))
        source = deployment.topic(EVENTS)
        records = noop_events(plan.noop_keys, plan.noop_records, "p")
        progress(f"{label}: pre-filling {len(records)} records over {plan.noop_keys} keys")
        await produce_all(self.bootstrap, source, records)
        timeout_s = 60 + plan.noop_records / 100
        run = E2eRun()

        # The peers first: keylane's latency phase adds records to the input afterwards.
        for kind, name in (("aiokafka", PEER_AIOKAFKA), ("faust", PEER_FAUST)):
            progress(f"{label}: {name}, {kind} peer over the same {len(records)} records")
            peer = self.peer(deployment, kind, source, sinks[kind])
            reader = Reader(self.bootstrap, sinks[kind], deployment.partitions(OUTPUT))
            try:
                await reader.start()
                await start(peer)
                outputs = await reader.take(len(records), timeout_s=timeout_s, watch=[peer])
                run.peer_rates[kind] = rate_of(outputs)
            except (BenchFailure, ProcessFailed) as exc:
                # keylane is still measured; the step fails at its end.
                progress(f"FAILED {name}: {exc}")
                run.peer_failure = run.peer_failure or exc
                continue
            finally:
                await stop(peer)
                await reader.stop()

        progress(f"{label}: {E2E_NOOP}, keylane worker, no-op agent")
        worker = self.worker(deployment, agent="bench.agents:noop", config="bench.agents:noop_config")
        reader = Reader(self.bootstrap, deployment.topic(OUTPUT), deployment.partitions(OUTPUT))
        live_records = max(1, plan.latency_records // reps)
        try:
            await reader.start()
            await start(worker)
            outputs = await reader.take(
                len(records), timeout_s=timeout_s, watch=[worker], match=lambda r: r.value.startswith(b"p")
            )
            run.rate = rate_of(outputs)
            progress(
                f"{label}: {E2E_NOOP} {run.rate:.0f} records/s; latency phase: {live_records} records "
                f"at {plan.latency_rate:.0f}/s"
            )
            # Let the worker finish what follows a burst (producer drain, commit) first: the
            # latency phase measures a worker at moderate load, not the tail of the burst.
            await asyncio.sleep(SETTLE_S)
            live = noop_events(plan.noop_keys, live_records, "l")
            sent_ms, latency_outputs = await asyncio.gather(
                produce_paced(self.bootstrap, source, live, plan.latency_rate),
                reader.take(
                    len(live),
                    timeout_s=60 + len(live) / plan.latency_rate,
                    watch=[worker],
                    match=lambda r: r.value.startswith(b"l"),
                ),
            )
            errors = len(await read_to_end(deployment.settings, deployment.topic(ERRORS)))
        finally:
            await stop(worker)
            await reader.stop()
        if errors:
            raise BenchFailure(f"{E2E_NOOP}: {errors} records on agent.errors; see {worker.log_path}")
        produced_at = {b"l%d" % i: ms for i, ms in enumerate(sent_ms)}
        run.latencies = [float(r.timestamp - produced_at[r.value]) for r in latency_outputs]
        run.received = [float(r.received_ms - produced_at[r.value]) for r in latency_outputs]
        run.duplicates = reader.duplicates
        return run

    async def hot_key(self, name: str, *, payloads: list[str], config: str, **env: str) -> list[PrefilledRun]:
        """The 50 ms agent on one pre-filled event of HOT_KEY per payload, once per repetition
        on a fresh deployment; a pessimistic 10 events/s, plus start-up, before giving up."""
        records = [(HOT_KEY, encode(AgentEnvelope(payload=payload))) for payload in payloads]
        runs, timeout_s = [], 60 + len(records) / 10
        for rep in range(self.repetitions):
            deployment = await self.deploy(f"{name}-r{rep}")
            measured = self.run_prefilled(deployment, records, config=config, timeout_s=timeout_s, **env)
            runs.append(await measured)
            await self.stop_all()
        return runs

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
            await start(worker)
            outputs = await reader.take(len(records), timeout_s=timeout_s, watch=[worker])
            mean_ms, activations = await mean_activation_ms(port)
        finally:
            await stop(worker)
            await reader.stop()
        if activations < len(records):
            raise BenchFailure(
                f"{deployment.name}: /metrics counts {activations} activations for {len(records)} events"
            )
        return PrefilledRun(outputs, rate_of(outputs), mean_ms, deployment.partitions(EVENTS_SHARDED))

    async def per_key_ceiling(self) -> None:
        events = self.plan.ceiling_events
        progress(f"{PER_KEY_CEILING}: {events} events of one key, FakeLLM {LLM_LATENCY_MS:.0f} ms, unsharded")
        payloads = [f"c{i}" for i in range(events)]
        runs = await self.hot_key("ceiling", payloads=payloads, config="bench.agents:config")
        rates = [run.rate for run in runs]
        rate = statistics.median(rates)
        mean_ms = statistics.median(run.mean_activation_ms for run in runs)
        bound = 1000 / mean_ms
        self.recorder.add(
            Result(
                name=PER_KEY_CEILING,
                unit="activations/s",
                rate=rate,
                repetitions=rates,
                extra={
                    "events": len(runs[-1].outputs),
                    "llm_latency_ms": LLM_LATENCY_MS,
                    "mean_activation_ms": mean_ms,
                    "bound_rate": bound,
                    "ratio": rate / bound,
                    "ratio_by_repetition": [run.rate * run.mean_activation_ms / 1000 for run in runs],
                },
            )
        )

    async def hot_key_fanout(self, shards: int) -> None:
        """hot_key_fanout_n{shards}; N=1 first, since the others' ratio_to_n1 divides by it."""
        events = self.plan.fanout_events
        name = HOT_KEY_FANOUT[shards]
        progress(f"{name}: {events} events of one key behind ShardKeys({shards})")
        runs = await self.hot_key(
            f"fanout-n{shards}",
            payloads=even_payloads(HOT_KEY, shards, events),
            config="bench.agents:sharded",
            **{SHARDS_ENV: str(shards)},
        )
        rates = [run.rate for run in runs]
        rate = statistics.median(rates)
        if shards == 1:
            self.fanout_n1_rate = rate
        run = runs[-1]  # the payloads, and so the spread over physical keys, are every run's
        spread = Counter((r.key or b"").decode() for r in run.outputs)
        partitions = {key: expected_partition(key.encode(), run.partitions) for key in sorted(spread)}
        # The worker runs key lanes: each physical key is its own serial lane, whatever
        # partition it shares. The rate the spread allows with perfect lanes, in the same
        # (count - 1) / span terms as the rate: the busiest key runs its (busiest - 1)
        # activations end to end.
        busiest = max(spread.values())
        mean_ms = statistics.median(r.mean_activation_ms for r in runs)
        lane_bound = (len(run.outputs) - 1) * 1000 / ((busiest - 1) * mean_ms) if busiest > 1 else None
        n1_rate = self.fanout_n1_rate
        self.recorder.add(
            Result(
                name=name,
                unit="events/s",
                rate=rate,
                repetitions=rates,
                extra={
                    "shards": shards,
                    "events": len(run.outputs),
                    "ratio_to_n1": rate / n1_rate if n1_rate else None,
                    "spread": dict(sorted(spread.items())),
                    "partitions": partitions,
                    "lanes": len(spread),
                    "mean_activation_ms": mean_ms,
                    "lane_bound_rate": lane_bound,
                    "ideal_ratio": lane_bound * mean_ms / 1000 if lane_bound else None,
                    "efficiency": rate / lane_bound if lane_bound else None,
                },
            )
        )


async def run_broker_benchmarks(recorder: Recorder, *, size: Size, bootstrap: str) -> None:
    """Run every broker benchmark and add its Result to ``recorder``.

    A benchmark that fails does not stop the others; after all ran, the first failure is
    raised (the results that were measured are already recorded). Processes are stopped and
    the run's topics deleted either way.
    """
    bench = BrokerBench(recorder, size, bootstrap)
    progress(f"broker benchmarks ({size}) on {bootstrap}; topics {bench.run_id}-*; logs in {bench.work_dir}")
    steps: list[Step] = [
        ("e2e_noop and peers", bench.e2e_and_peers),
        (PER_KEY_CEILING, bench.per_key_ceiling),
        *((HOT_KEY_FANOUT[n], functools.partial(bench.hot_key_fanout, n)) for n in FANOUT_SHARDS),
    ]
    with quiet_client_logs():  # fresh topics: NotLeaderForPartition retries for a moment
        try:
            await run_steps("broker benchmark step(s)", steps, after_each=bench.stop_all, logs=bench.work_dir)
        finally:
            await bench.stop_all()
            await bench.delete_topics()
    shutil.rmtree(bench.work_dir, ignore_errors=True)
