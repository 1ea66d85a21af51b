"""Key lanes vs partition lanes: one partition, 1,000 keys, FakeLLM 50 ms.

With the partition as the lane, every key of a partition waits behind the one activation in
it: about 1000 / 50 = 20 activations/s however many keys are idle. With key lanes, up to
``max_in_flight`` keys of the partition run at once, so the ideal is
min(keys, max_in_flight) x 20 activations/s. Each mode runs REPETITIONS[size] times on fresh
deployments: the rate is their median, and ``min_ratio_to_ideal`` the worst repetition's
(bench/targets.py's goal: 0.9).

An ideal the worker's whole path cannot carry measures that path, not the lanes: key lanes
run with the largest ``max_in_flight`` up to AgentConfig's default 64 whose ideal stays
within IDEAL_SHARE_OF_E2E of the e2e_noop rate measured earlier in the same run (``in_flight``).
The result reports both.

All keys are chosen so that Kafka's partitioner puts them on partition 0: one partition
really carries all 1,000 keys (a record on another partition would be re-routed).
"""

from __future__ import annotations

import shutil
import statistics

from bench import agents
from bench.broker import BrokerBench
from bench.harness import Recorder, Result, Size, progress
from bench.names import E2E_NOOP, LANES
from keylane.catalog import EVENTS
from keylane.kafka.partitioner import expected_partition
from keylane.wire import AgentEnvelope, encode

KEYS = 1000
IDEAL_SHARE_OF_E2E = 0.75
"""Key lanes' ideal stays at or below this share of the no-op path's rate (e2e_noop)."""
# (events in key mode, events in partition mode): partition mode runs at ~20/s.
EVENT_COUNTS: dict[Size, tuple[int, int]] = {"smoke": (200, 30), "quick": (1000, 60), "full": (3000, 200)}


def keys_on_partition(partition: int, partitions: int, count: int) -> list[bytes]:
    """The first ``count`` keys user-<i> that murmur2 puts on ``partition``."""
    keys: list[bytes] = []
    i = 0
    while len(keys) < count:
        key = f"user-{i}".encode()
        if expected_partition(key, partitions) == partition:
            keys.append(key)
        i += 1
    return keys


def in_flight(e2e_rate: float | None) -> int:
    """Key lanes' max_in_flight for this run: AgentConfig's default, lowered until the ideal
    (in_flight x 1000 / LLM_LATENCY_MS) is at most IDEAL_SHARE_OF_E2E of ``e2e_rate``, the
    rate the worker's path carried with a no-op agent (the default when unmeasured)."""
    if e2e_rate is None:
        return agents.MAX_IN_FLIGHT
    carried = int(IDEAL_SHARE_OF_E2E * e2e_rate * agents.LLM_LATENCY_MS / 1000)
    return max(1, min(agents.MAX_IN_FLIGHT, carried))


async def one_partition_many_keys(bench: BrokerBench, recorder: Recorder, mode: str, events: int) -> None:
    name = LANES[mode]
    e2e = recorder.results.get(E2E_NOOP)
    e2e_rate = e2e.rate if e2e is not None else None
    concurrent = min(KEYS, in_flight(e2e_rate)) if mode == "key" else 1
    env = {agents.IN_FLIGHT_ENV: str(concurrent)} if mode == "key" else {}
    runs = []
    for rep in range(bench.repetitions):
        deployment = await bench.deploy(f"lanes-{mode}-r{rep}")
        keys = keys_on_partition(0, deployment.partitions(EVENTS), KEYS)
        progress(
            f"{name} ({rep + 1}/{bench.repetitions}): {events} events over {len(keys)} keys of "
            f"partition 0, FakeLLM 50 ms, lanes={mode}, max_in_flight {concurrent}"
        )
        records = [(keys[i % len(keys)], encode(AgentEnvelope(payload=f"e{i}"))) for i in range(events)]
        runs.append(
            await bench.run_prefilled(
                deployment, records, config=f"bench.agents:lanes_{mode}", timeout_s=90 + events / 10, **env
            )
        )
        await bench.stop_all()
    ideal = concurrent * 1000 / agents.LLM_LATENCY_MS
    default_ideal = (min(KEYS, agents.MAX_IN_FLIGHT) if mode == "key" else 1) * 1000 / agents.LLM_LATENCY_MS
    rates = [run.rate for run in runs]
    rate = statistics.median(rates)
    recorder.add(
        Result(
            name=name,
            unit="activations/s",
            rate=rate,
            repetitions=rates,
            extra={
                "lanes": mode,
                "keys": KEYS,
                "events": len(runs[-1].outputs),
                "max_in_flight": concurrent if mode == "key" else None,
                "ideal_rate": ideal,
                "ideal_at_default_in_flight": default_ideal,
                "ratio_to_ideal": rate / ideal,
                "min_ratio_to_ideal": min(rates) / ideal,
                # The ideal is only reachable when the worker's whole path carries it.
                "e2e_noop_rate": e2e_rate,
                "mean_activation_ms": statistics.median(run.mean_activation_ms for run in runs),
            },
        )
    )


async def run_lanes_benchmarks(recorder: Recorder, *, size: Size, bootstrap: str) -> None:
    """Both lane modes on one partition with 1,000 keys."""
    bench = BrokerBench(recorder, size, bootstrap)
    key_events, partition_events = EVENT_COUNTS[size]
    try:
        await one_partition_many_keys(bench, recorder, "key", key_events)
        await one_partition_many_keys(bench, recorder, "partition", partition_events)
    finally:
        await bench.stop_all()
        await bench.delete_topics()
    shutil.rmtree(bench.work_dir, ignore_errors=True)
