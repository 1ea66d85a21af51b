"""A worker that joins, or takes over after a kill -9, reads on from the committed offsets.

The offset guard positions every input partition at the offset the group coordinator
answered. On the runtime whose wrap of Faust's ``seek_to_committed`` was never reached (the
aiokafka driver's consumer overrides it), every assignment started at the log start: each
rebalance re-read every input from offset 0 and re-produced every misplaced record (kcat's
partitioner) again. Identities kept that from running anything twice, but the re-reads grew
with the log: 40,743 copies for 10,000 events in a chaos run.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from keylane.catalog import EVENTS, OUTPUT, Catalog
from keylane.config import Settings
from keylane.kafka.partitioner import expected_partition
from keylane.kafka.topic_reader import read_to_end
from keylane.testing.processes import free_port
from keylane.wire import AgentEnvelope, encode
from tests.chaos.harness import committed_lags
from tests.integration.test_redelivery import by_id, metric
from tests.kafka_io import kcat_produce, wait_for_records
from tests.processes import KeylaneProcess, process_env

pytestmark = pytest.mark.kafka

KEYS = [f"pos-{i}".encode() for i in range(12)]


def batch(n: int) -> bytes:
    return b"".join(k + b"|" + encode(AgentEnvelope(payload=f"{k.decode()}-e{n}")) + b"\n" for k in KEYS)


async def outputs_reach(settings: Settings, catalog: Catalog, total: int) -> None:
    await wait_for_records(settings, catalog.name(OUTPUT), lambda rs: len(by_id(rs)) == total, timeout_s=120)


async def commits_reach_the_end(settings: Settings, catalog: Catalog) -> None:
    groups = {settings.app_id: [catalog.name(EVENTS)]}
    deadline = time.monotonic() + 60
    while lags := await committed_lags(settings, groups):
        assert time.monotonic() < deadline, f"commits never reached the log end: {lags}"
        await asyncio.sleep(0.5)


@pytest.mark.timeout(300)
async def test_a_joining_and_a_surviving_worker_read_on_from_the_committed_offsets(
    settings: Settings, catalog: Catalog, tmp_path: Path
) -> None:
    env = process_env(settings, LLM_LEDGER=str(tmp_path / "llm.jsonl"))
    args = ["worker", "--agent", "tests.agents.flow:remember"]
    ports = {name: free_port() for name in ("w1", "w2")}
    workers = {
        name: KeylaneProcess(
            args,
            {**env, "KEYLANE_METRICS_PORT": str(port), "KEYLANE_DATA_DIR": str(tmp_path / name)},
            tmp_path / f"{name}.log",
        )
        for name, port in ports.items()
    }
    events = catalog.name(EVENTS)
    try:
        workers["w1"].start()
        kcat_produce(settings, events, batch(0))
        await outputs_reach(settings, catalog, len(KEYS))
        await commits_reach_the_end(settings, catalog)

        workers["w2"].start()  # a rebalance: both are positioned at the committed offsets
        kcat_produce(settings, events, batch(1))
        await outputs_reach(settings, catalog, 2 * len(KEYS))
        await commits_reach_the_end(settings, catalog)
        before_kill = await metric(ports["w1"], "keylane_redeliveries_total")

        workers["w1"].kill9()  # w2 takes every partition over, at the committed offsets
        kcat_produce(settings, events, batch(2))
        await outputs_reach(settings, catalog, 3 * len(KEYS))
        after_kill = await metric(ports["w2"], "keylane_redeliveries_total")
    finally:
        for worker in workers.values():
            if worker.proc is not None:
                worker.stop()

    records = await read_to_end(settings, events)
    partitions = catalog[EVENTS].partitions
    originals = [r for r in records if not r.headers]
    misplaced = [r for r in originals if expected_partition(r.key or b"", partitions) != r.partition]
    copies = [r for r in records if r.headers]
    assert len(originals) == 3 * len(KEYS)
    assert misplaced, "kcat's partitioner puts some keys off their murmur2 partition"
    assert (before_kill, after_kill) == (0, 0), (
        f"no input below a committed offset was read again:\n{workers['w2'].tail()}"
    )
    assert len(copies) == len(misplaced), "each misplaced record was re-produced once"
