"""State cost against what changed: keys holding 1, 64 and 512 KiB of memory, each activation
rewriting 1 KiB of it.

Entry point: :func:`run_state_growth_benchmarks` (``python -m bench.run`` runs it). Each
memory size has a fresh deployment of its own (bench/deployment.py: 6 co-partitioned
partitions) and its own worker:

1. **Fill**, every size first: one ``fill`` event per key through a real ``keylane worker``
   running :func:`rewrite_one_cell`, which stores the size's worth of 1 KiB cells (``c0`` ...
   ``cN-1``, incompressible bytes) in ``ctx.memory``.
2. **Measured**, ROUNDS[size] rounds, each measuring every size in turn (1, 64, 512 KiB)
   on its running worker: a slow spell of the machine then lands on one repetition of each
   size, not on all three of one, and the medians compare sizes measured side by side.
   A repetition is ``EVENTS_PER_KEY`` events per key, produced at once; each activation
   rewrites one cell (its index in the event) with 1 KiB of new bytes and completes.
   Activations/s is the rate of the outputs' timestamps (bench/reader.py); changelog bytes
   per activation is the growth of the state changelog on the broker (DescribeLogDirs, as
   bench/recovery.py reads it) over the repetition, divided by its activations, and the same
   for records.

One Result per size, ``state_growth_<K>kib`` (rate = the median repetition's activations/s),
with ``changelog_bytes_per_activation``, ``changed_bytes_per_activation`` (1 KiB) and their
ratio ``write_amplification``. The report sets each size's rate beside the 1 KiB one. A key
whose memory is over 16 KiB keeps it in pages (service/keylane/core/pages.py), so an
activation writes the page it changed and a small state record; below that, the key's whole
state is one record, as the 1 KiB figure shows.
"""

from __future__ import annotations

import asyncio
import hashlib
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from bench.deployment import Deployment, Testbed, start
from bench.harness import REPETITIONS, BenchFailure, Recorder, Result, Size, progress
from bench.names import STATE_GROWTH, STATE_GROWTH_KIB
from bench.producers import produce_all
from bench.reader import Reader, rate_of
from bench.recovery import changelog_bytes, end_offsets
from keylane import ActivationContext, AgentConfig, Complete
from keylane.catalog import EVENTS, OUTPUT
from keylane.kafka.topic_admin import quiet_client_logs
from keylane.testing.processes import ManagedProcess
from keylane.wire import AgentEnvelope, encode

CELL_BYTES = 1024
KEYS: dict[Size, int] = {"smoke": 4, "quick": 10, "full": 20}
EVENTS_PER_KEY: dict[Size, int] = {"smoke": 3, "quick": 30, "full": 100}
"""Quick: 300 activations per repetition. With 10 per key, a repetition lasted 0.15 s and one
stall of the worker halved its rate (1 KiB: 340, 313 and 755/s in one run). Full: 2,000, about
a second: with 25 per key (a quarter second) one run's 512 KiB repetitions spread from 1,185
to 2,071/s."""
ROUNDS: dict[Size, int] = {**REPETITIONS, "full": 5}
"""Full: five rounds, where the other broker benchmarks run three. A repetition's rate moved by
a fifth between rounds of one run (2,000 activations each, no stall in any: the worker's CPU
time per repetition itself varied, 0.88 to 1.35 s), and the 512 KiB / 1 KiB ratio is of two
medians; five rounds cost about 15 s more than three."""
SETTLE_S = 1.0


# -- the agent (runs in the worker processes) -------------------------------------------------


def cell_bytes(key: bytes, cell: int, version: int) -> bytes:
    """CELL_BYTES incompressible bytes, different for each key, cell and version."""
    seed = hashlib.sha256(b"%s/%d/%d" % (key, cell, version)).digest()
    return b"".join(hashlib.sha256(seed + bytes([i])).digest() for i in range(CELL_BYTES // 32))


async def rewrite_one_cell(ctx: ActivationContext) -> Complete:
    """``fill:<cells>``: store that many cells. ``set:<cell>:<version>``: rewrite one cell."""
    command, *args = ctx.event.decode().split(":")
    if command == "fill":
        for cell in range(int(args[0])):
            ctx.memory.set(f"c{cell}", cell_bytes(ctx.entity_key, cell, 0))
        return Complete(output=b"filled")
    cell, version = int(args[0]), int(args[1])
    ctx.memory.set(f"c{cell}", cell_bytes(ctx.entity_key, cell, version))
    return Complete(output=b"set:%d" % version)


config = AgentConfig()


# -- the benchmark (runs in the bench process) ------------------------------------------------


@dataclass
class Sized:
    """One memory size's deployment, its worker (filled), and what it measured."""

    kib: int
    deployment: Deployment
    reader: Reader
    worker: ManagedProcess
    changelog: str
    runs: list[dict[str, float]] = field(default_factory=list)


class StateGrowthBench(Testbed):
    def __init__(self, recorder: Recorder, size: Size, bootstrap: str) -> None:
        super().__init__(bootstrap)
        self.recorder = recorder
        self.keys = [f"grow-{i}".encode() for i in range(KEYS[size])]
        self.events_per_key = EVENTS_PER_KEY[size]
        self.repetitions = ROUNDS[size]

    async def run(self) -> None:
        """Fill every size, then measure them in turn, repetition by repetition, so that a slow
        spell of the machine falls on one repetition of each size rather than on every
        repetition of one size (the report sets each size beside the smallest)."""
        sized: list[Sized] = []
        try:
            for kib in STATE_GROWTH_KIB:
                await self.fill(kib, sized)
            for rep in range(self.repetitions):
                for one in sized:
                    one.runs.append(await self.repetition(one, rep))
        finally:
            for one in sized:
                await one.reader.stop()
            await self.stop_all()
        for one in sized:
            self.record(one)

    async def fill(self, kib: int, sized: list[Sized]) -> None:
        """Add to ``sized`` a deployment whose worker holds ``kib`` KiB of memory for each key
        (added as soon as its reader runs, so a fill that fails still has its reader stopped)."""
        name = STATE_GROWTH[kib]
        deployment = await self.deploy(f"grow-{kib}")
        reader = Reader(self.bootstrap, deployment.topic(OUTPUT), deployment.partitions(OUTPUT))
        worker = self.worker(
            deployment, agent="bench.state_growth:rewrite_one_cell", config="bench.state_growth:config"
        )
        changelog = f"{deployment.settings.app_id}-keylane-state-changelog"
        await reader.start()
        one = Sized(kib, deployment, reader, worker, changelog)
        sized.append(one)
        progress(f"{name}: filling {len(self.keys)} keys with {kib} KiB of memory each")
        fill = encode(AgentEnvelope(payload=f"fill:{kib}"))
        await produce_all(self.bootstrap, deployment.topic(EVENTS), [(key, fill) for key in self.keys])
        await start(worker)
        await reader.take(len(self.keys), timeout_s=120, watch=[worker], match=lambda r: r.value == b"filled")
        # The fill's state writes are all in the changelog before the first batch is measured.
        await self.changelog_records(changelog, deployment.partitions(EVENTS), len(self.keys))

    def record(self, one: Sized) -> None:
        rates = [run["rate"] for run in one.runs]
        per_activation = statistics.median(run["bytes_per_activation"] for run in one.runs)
        extra: dict[str, Any] = {
            "memory_kib": one.kib,
            "keys": len(self.keys),
            "activations_per_repetition": len(self.keys) * self.events_per_key,
            "changed_bytes_per_activation": CELL_BYTES,
            "changelog_bytes_per_activation": per_activation,
            "changelog_records_per_activation": statistics.median(
                run["records_per_activation"] for run in one.runs
            ),
            "write_amplification": per_activation / CELL_BYTES,
            "changelog_bytes_source": "DescribeLogDirs partition_size growth, summed over partitions",
        }
        one_kib = self.recorder.results.get(STATE_GROWTH[STATE_GROWTH_KIB[0]])
        if one_kib is not None and one_kib.rate:
            extra["rate_ratio_to_1kib"] = statistics.median(rates) / one_kib.rate
        self.recorder.add(
            Result(
                name=STATE_GROWTH[one.kib],
                unit="activations/s",
                rate=statistics.median(rates),
                repetitions=rates,
                extra=extra,
            )
        )

    async def repetition(self, one: Sized, rep: int) -> dict[str, float]:
        """One measured batch: every key rewrites a cell EVENTS_PER_KEY times."""
        changelog, kib = one.changelog, one.kib
        partitions = one.deployment.partitions(EVENTS)
        bytes_before = await changelog_bytes(self.bootstrap, changelog)
        records_before = await self.changelog_count(changelog, partitions)
        version = rep + 1
        records = [
            (key, encode(AgentEnvelope(payload=f"set:{(i * 7) % kib}:{version}")))
            for i in range(self.events_per_key)
            for key in self.keys
        ]
        await produce_all(self.bootstrap, one.deployment.topic(EVENTS), records)
        tag = b"set:%d" % version
        timeout_s = 120 + len(records) / 5
        outputs = await one.reader.take(
            len(records), timeout_s=timeout_s, watch=[one.worker], match=lambda r: r.value == tag
        )
        # An output can be visible a moment before the state write of its activation is
        # confirmed (both are confirmed when the job ends): wait for at least one record per
        # activation, and for the changelog to stop growing.
        records_after = await self.changelog_records(changelog, partitions, records_before + len(records))
        bytes_after = await changelog_bytes(self.bootstrap, changelog)
        if bytes_before is None or bytes_after is None:
            raise BenchFailure(f"{STATE_GROWTH[kib]}: the broker did not say how large the changelog is")
        rate = rate_of(outputs)
        per_activation = (bytes_after - bytes_before) / len(records)
        progress(
            f"{STATE_GROWTH[kib]} ({rep + 1}/{self.repetitions}): {rate:.0f} activations/s, "
            f"{per_activation / 1024:.1f} KiB of changelog per activation"
        )
        return {
            "rate": rate,
            "bytes_per_activation": per_activation,
            "records_per_activation": (records_after - records_before) / len(records),
        }

    async def changelog_count(self, changelog: str, partitions: int) -> int:
        """The changelog's record count: its end offsets, summed."""
        return sum((await end_offsets(self.bootstrap, changelog, partitions)).values())

    async def changelog_records(self, changelog: str, partitions: int, at_least: int) -> int:
        """The changelog's record count once it reached ``at_least`` and stopped growing for
        SETTLE_S (BenchFailure after 30 s): a paged memory's activation writes its pages
        besides its record, so how many records an activation writes is not known here."""
        deadline = time.monotonic() + 30
        last, since = -1, time.monotonic()
        while True:
            count = await self.changelog_count(changelog, partitions)
            if count != last:
                last, since = count, time.monotonic()
            elif count >= at_least and time.monotonic() - since >= SETTLE_S:
                return count
            if time.monotonic() > deadline:
                raise BenchFailure(f"{changelog} holds {count} records, expected at least {at_least}")
            await asyncio.sleep(0.2)


async def run_state_growth_benchmarks(recorder: Recorder, *, size: Size, bootstrap: str) -> None:
    """Every memory size of STATE_GROWTH_KIB, smallest first (the others compare to it)."""
    bench = StateGrowthBench(recorder, size, bootstrap)
    with quiet_client_logs():
        try:
            await bench.run()
        finally:
            await bench.stop_all()
            await bench.delete_topics()
