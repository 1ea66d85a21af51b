"""Recovery benchmarks: what scaling out costs, as the time a worker needs for its state.

Entry point: :func:`run_recovery_benchmarks` (``python -m bench.run`` runs it; ``python -m
bench.recovery --keys N`` runs it alone). For each size of :data:`KEYS` (the full run's can
be changed with BENCH_RECOVERY_KEYS), in one fresh deployment (bench/deployment.py: 6
co-partitioned partitions, session timeout 6 s):

1. **Fill**: N pre-filled events, one per key ``rk-<i>``, through a real ``keylane worker``
   running :func:`remember`, which stores ``MEMORY_BYTES`` (10 KiB, incompressible) in
   ``ctx.memory`` per key; done when all N outputs arrived, then the worker stops cleanly
   (SIGTERM). The changelog ``<app_id>-keylane-state-changelog`` then holds N records of
   about 10 KiB: its size is the broker's own figure (DescribeLogDirs: each partition's log
   size, the largest replica of each, summed over the partitions), its record count the sum
   of its end offsets.
2. **Volume kept**: a worker starts on the same KEYLANE_DATA_DIR (RocksDB present with its
   offsets: it replays only the changelog tail). **Volume lost**: a worker starts on a fresh
   data dir (the whole changelog). Each is timed from the process launch to ready (/readyz
   answers 200: the readiness probe of keylane.testing.processes) and to the first processed
   event on the key in the middle of the range: one probe event for it, produced before the
   launch, waits on its partition, and its output's CreateTime (the worker's producer, this
   machine's clock) ends the measurement. A run fails when keylane's stall check had to read
   a probe's partition again (the probe went missing on its way in; the time would include
   the check's wait). The answer says whether the key's 10 KiB came back intact.
   From the worker's log: the records it replayed (Faust's "Reading Starts At - Active" and
   "Highwater - Active" tables), how long the replay took ("Restoring state from changelog
   topics" to "Done reading from changelog topics"), and when keylane's timer index, rebuilt
   from a scan of the whole table after each rebalance, was done.
3. **Failover, standby replicas 0 and 1** (Faust's ``table_standby_replicas``, set through
   Faust's own TABLE_STANDBY_REPLICAS variable, which keylane's build_app leaves alone; Faust's
   default is 1): worker A starts on a full volume, so it holds every partition; worker B
   joins with an empty one and restores the 3 partitions it is given (``join_ready_s``: what
   adding a worker costs). With standby 1, B then waits as long as the full replay took, for
   its standby copies of A's 3 partitions to catch up. "Who" probes find which worker owns
   which partition; A is killed with SIGKILL, and one probe for the key of A's partitions
   nearest the middle of the range is produced then. ``failover_s`` is from the kill to the
   first answer from B. It includes detecting the crash: a killed worker never leaves the
   group, so the coordinator waits out the session timeout (``rebalance_s`` is when B's
   rebalance began, ``restored_s`` when B's tables were current). From B's log, the records
   B replayed of A's partitions at the takeover: none when its standby copy was current,
   about N/2 without one. A, not B, is killed: A's volume held every partition, B never had
   A's partitions but as standby copies.

One Result per size, ``recovery_<N>keys`` (unit s; rate = changelog records replayed per
second with the volume lost); extra holds every figure above. No gate judges them: absolute
times depend on the machine. The report shows the ratio volume kept / volume lost.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import hashlib
import os
import re
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.deployment import FATAL_MARKERS, REPO, Deployment, Testbed, stop
from bench.harness import BenchFailure, Recorder, Result, Size, progress, run_steps
from bench.producers import produce_all
from bench.reader import OutRecord, Reader, rate_of
from keylane import ActivationContext, AgentConfig, Complete
from keylane.catalog import EVENTS, OUTPUT
from keylane.kafka.partitioner import expected_partition
from keylane.kafka.topic_admin import quiet_client_logs
from keylane.testing.processes import KeylaneProcess, ManagedProcess, free_port, settings_env
from keylane.wire import AgentEnvelope, encode

MEMORY_BYTES = 10 * 1024
WORKER_ENV = "BENCH_WORKER"
STANDBY_ENV = "TABLE_STANDBY_REPLICAS"  # read by Faust itself (faust.types.settings)
KEYS: dict[str, tuple[int, ...]] = {"smoke": (200,), "quick": (500,), "full": (10_000, 100_000)}
FULL_KEYS_ENV = "BENCH_RECOVERY_KEYS"
"""Overrides the full run's sizes, e.g. ``BENCH_RECOVERY_KEYS=10000`` (comma-separated): the
100,000-key size takes about 8 minutes on 2 cores, most of it the fill."""
PREFIX = "recovery_"


def result_name(keys: int) -> str:
    return f"{PREFIX}{keys}keys"


# -- the agent (runs in the worker processes) -------------------------------------------------


def filler(key: bytes) -> bytes:
    """MEMORY_BYTES of incompressible bytes, the same for a key every time."""
    seed = hashlib.sha256(key).digest()
    chunks = [hashlib.sha256(seed + i.to_bytes(4, "big")).digest() for i in range(MEMORY_BYTES // 32 + 1)]
    return b"".join(chunks)[:MEMORY_BYTES]


async def remember(ctx: ActivationContext) -> Complete:
    """``fill``: store the key's 10 KiB. ``probe:<tag>``: answer
    ``probe:<tag>|<intact 0/1>|<worker>`` from the stored bytes, leaving memory as it is."""
    if ctx.event.startswith(b"probe:"):
        stored = ctx.memory.get("blob")
        intact = int(stored == filler(ctx.entity_key))
        worker = os.environ.get(WORKER_ENV, "?")
        return Complete(output=b"%s|%d|%s" % (ctx.event, intact, worker.encode()))
    ctx.memory.set("blob", filler(ctx.entity_key))
    return Complete(output=b"filled")


config = AgentConfig()


# -- the benchmark (runs in the bench process) ------------------------------------------------


def key_of(i: int) -> bytes:
    return f"rk-{i:06d}".encode()


@dataclass(frozen=True)
class Probe:
    """The output of one probe: which worker answered, whether the key's bytes were intact,
    and its CreateTime (s since the epoch)."""

    tag: str
    intact: bool
    worker: str
    at_s: float


@dataclass(frozen=True)
class Replay:
    """Changelog records a worker's recovery read, per partition (from its log)."""

    per_partition: dict[int, int]

    def total(self, partitions: Sequence[int] | None = None) -> int:
        return sum(n for p, n in self.per_partition.items() if partitions is None or p in partitions)


# Faust's recovery tables, as the worker logs them on one line (service/keylane/kafka/app.py):
# "Highwater - Active: t.keylane-keylane-state-changelog 0 41, 〃 1 -1, ...".
_TABLE_ROW = re.compile(r"(\S+) (\d+) (-?\d+)(?=,|$|\s)")


def takeover_replays(log_text: str, changelog: str) -> list[Replay]:
    """Every active recovery in a Faust worker's log, in order: the records between the
    "Reading Starts At - Active" offset and the "Highwater - Active" offset of each of its
    changelog partitions."""
    replays: list[Replay] = []
    highwaters: dict[int, int] | None = None
    for block in re.split(r"\n(?=\[\d{4}-\d\d-\d\d )", log_text):
        if "Highwater - Active" in block:
            highwaters = _rows(block, changelog)
        elif "Reading Starts At - Active" in block and highwaters is not None:
            starts = _rows(block, changelog)
            replays.append(
                Replay({p: max(0, highwaters[p] - s) for p, s in starts.items() if p in highwaters})
            )
            highwaters = None
    return replays


_STAMP = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]")
REBALANCE_LINE = "Revoking previously assigned partitions"  # aiokafka, as a rebalance begins
REPLAY_LINE = "Restoring state from changelog topics"  # Faust's Recovery: a replay begins...
REPLAYED_LINE = "Done reading from changelog topics"  # ... and ends (neither when nothing to read)
RESTORED_LINE = "Restore complete!"  # Faust's Recovery: active tables current, streams resume
TIMERS_LINE = "timer index rebuilt"  # keylane's agent processor, after its scan of the table
STALL_LINE = "no record from offset"  # keylane's offset guard, when its stall check re-reads a partition


def first_logged(log_text: str, marker: str) -> float | None:
    """When the first line of ``log_text`` containing ``marker`` was logged (s since the
    epoch, from the line's local timestamp), None if no line has it."""
    for line in log_text.splitlines():
        if marker in line:
            stamp = _STAMP.match(line)
            if stamp:
                return datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return None


def _since(stamp: float | None, start: float) -> float | None:
    return None if stamp is None else stamp - start


def _seconds(value: float | None) -> str:
    return "?" if value is None else f"{value:.2f} s"


def _rows(block: str, topic: str) -> dict[int, int]:
    rows: dict[int, int] = {}
    current = None
    for name, partition, offset in _TABLE_ROW.findall(block):
        if name != "〃":
            current = name
        if current == topic:
            rows[int(partition)] = int(offset)
    return rows


async def changelog_bytes(bootstrap: str, topic: str) -> int | None:
    """The topic's size on the brokers: DescribeLogDirs' partition sizes, summed over
    partitions (the largest replica of each). None if the brokers do not answer it."""
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.protocol.api import Request, RequestStruct, Response
    from aiokafka.protocol.types import Array, Boolean, Int16, Int32, Int64, Schema, String

    # aiokafka ships no type information: its protocol classes are Any to mypy.
    class DescribeLogDirsResponse_v1(Response):  # type: ignore[misc]
        API_KEY = 35
        API_VERSION = 1
        SCHEMA = Schema(
            ("throttle_time_ms", Int32),
            (
                "results",
                Array(
                    ("error_code", Int16),
                    ("log_dir", String("utf-8")),
                    (
                        "topics",
                        Array(
                            ("name", String("utf-8")),
                            (
                                "partitions",
                                Array(
                                    ("partition_index", Int32),
                                    ("partition_size", Int64),
                                    ("offset_lag", Int64),
                                    ("is_future_key", Boolean),
                                ),
                            ),
                        ),
                    ),
                ),
            ),
        )

    class DescribeLogDirsRequest_v1(RequestStruct):  # type: ignore[misc]
        API_KEY = 35
        API_VERSION = 1
        RESPONSE_TYPE = DescribeLogDirsResponse_v1
        SCHEMA = Schema(("topics", Array(("topic", String("utf-8")), ("partitions", Array(Int32)))))

    class DescribeLogDirs(Request[DescribeLogDirsRequest_v1]):  # type: ignore[misc]
        API_KEY = 35

        def build(self, request_struct_class: type[DescribeLogDirsRequest_v1]) -> DescribeLogDirsRequest_v1:
            return request_struct_class(None)  # every partition the broker hosts

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        sizes: dict[int, int] = {}
        for broker in admin._client.cluster.brokers():
            response: Any = await admin._send_request_to_node(broker.nodeId, DescribeLogDirs())
            for error_code, _dir, topics in response.results:
                if error_code:
                    continue
                for name, partitions in topics:
                    if name != topic:
                        continue
                    for index, size, _lag, future in partitions:
                        if not future:
                            sizes[index] = max(sizes.get(index, 0), size)
        return sum(sizes.values()) if sizes else None
    except Exception as exc:  # noqa: BLE001 - the figure goes missing, the benchmark goes on
        progress(f"DescribeLogDirs failed ({type(exc).__name__}: {exc}); changelog bytes unknown")
        return None
    finally:
        await admin.close()


async def end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        ends = await consumer.end_offsets(tps)
        return {tp.partition: int(offset) for tp, offset in ends.items()}
    finally:
        await consumer.stop()


class RecoveryBench(Testbed):
    def __init__(self, recorder: Recorder, bootstrap: str) -> None:
        super().__init__(bootstrap)
        self.recorder = recorder

    def recovery_worker(
        self, deployment: Deployment, label: str, data_dir: Path, *, standby: int = 1
    ) -> KeylaneProcess:
        """A `keylane worker` running :func:`remember` on ``data_dir``, its own log and
        metrics port (readiness by /readyz), not started."""
        settings = deployment.settings.with_overrides(metrics_port=free_port(), data_dir=data_dir)
        environment = self._env(
            **settings_env(settings),
            KEYLANE_LOG_LEVEL="info",
            KEYLANE_TOPIC_CATALOG=str(self.catalog_path),
            **{WORKER_ENV: label, STANDBY_ENV: str(standby)},
        )
        name = f"{deployment.name} worker {label}"
        process = KeylaneProcess(
            ["worker", "--agent", "bench.recovery:remember", "--config", "bench.recovery:config"],
            environment,
            deployment.work_dir / f"worker-{label}.log",
            name=name,
            cwd=REPO,
            fatal_lines=FATAL_MARKERS,
        )
        self.processes.append(process)
        return process

    async def retire(self, process: ManagedProcess) -> int | None:
        """Stop ``process`` (SIGTERM, see bench.deployment.stop) and forget it; its exit code."""
        code = await stop(process)
        self.processes.remove(process)
        return code

    async def launch_ready(self, process: ManagedProcess, timeout_s: float) -> tuple[float, float]:
        """Launch ``process``; (launch time, seconds until ready)."""
        launched = time.time()
        process.launch()
        await asyncio.to_thread(process.wait_ready, timeout_s)
        return launched, time.time() - launched

    async def probe(
        self,
        deployment: Deployment,
        reader: Reader,
        keys: Sequence[bytes],
        tag: str,
        *,
        timeout_s: float,
        watch: Sequence[ManagedProcess],
    ) -> dict[bytes, Probe]:
        """Produce ``probe:<tag>`` for each key; their outputs by key."""
        await self.send_probes(deployment, keys, tag)
        return await self.await_probes(reader, tag, len(keys), timeout_s=timeout_s, watch=watch)

    async def send_probes(self, deployment: Deployment, keys: Sequence[bytes], tag: str) -> None:
        probe = encode(AgentEnvelope(payload=f"probe:{tag}"))
        await produce_all(self.bootstrap, deployment.topic(EVENTS), [(k, probe) for k in keys])

    def check_no_stall(self, process: ManagedProcess, after: int, what: str) -> None:
        """Fail when keylane's stall check had to read a partition again in what ``process``
        logged from character ``after`` on: a probe record went missing on its way in, and
        the time measured includes the check's wait."""
        if STALL_LINE in process.log_since_start()[after:]:
            raise BenchFailure(f"{what}: a probe waited for keylane's stall check; see {process.log_path}")

    @staticmethod
    def logged(process: ManagedProcess, marker: str, after: int) -> bool:
        """Whether ``marker`` is in what the latest start logged from character ``after`` on."""
        return marker in process.log_since_start()[after:]

    async def wait_logged(self, process: ManagedProcess, marker: str, after: int, timeout_s: float) -> None:
        """Wait (at most ``timeout_s``) until ``marker`` is logged (see :meth:`logged`): keylane
        rebuilds its timer index from a scan of the whole table within a second of each
        restore, and the scan's end is worth recording."""
        deadline = time.monotonic() + timeout_s
        while not self.logged(process, marker, after) and time.monotonic() < deadline:
            process.check()
            await asyncio.sleep(0.2)

    async def await_probes(
        self, reader: Reader, tag: str, count: int, *, timeout_s: float, watch: Sequence[ManagedProcess]
    ) -> dict[bytes, Probe]:
        prefix = f"probe:{tag}|".encode()
        got = await reader.take(
            count, timeout_s=timeout_s, watch=watch, match=lambda r: r.value.startswith(prefix)
        )
        probes: dict[bytes, Probe] = {}
        for record in got:
            _tag, intact, worker = record.value.decode().rsplit("|", 2)
            probes[record.key or b""] = Probe(tag, intact == "1", worker, record.timestamp / 1000)
        return probes

    async def size(self, keys: int) -> None:
        name = result_name(keys)
        deployment = await self.deploy(f"recovery-{keys}")
        partitions = deployment.partitions(EVENTS)
        changelog = f"{deployment.settings.app_id}-keylane-state-changelog"
        all_keys = [key_of(i) for i in range(keys)]
        work = deployment.work_dir
        timeout_s = 120 + keys / 200  # a pessimistic 200 keys/s of replay, plus start-up
        reader = Reader(self.bootstrap, deployment.topic(OUTPUT), deployment.partitions(OUTPUT))
        extra: dict[str, Any] = {
            "keys": keys,
            "memory_bytes_per_key": MEMORY_BYTES,
            "partitions": partitions,
            "session_timeout_s": deployment.settings.session_timeout_s,
        }
        await reader.start()
        try:
            extra.update(
                await self.fill(deployment, reader, all_keys, changelog, work / "vol-kept", timeout_s)
            )
            for case, data_dir in (("kept", work / "vol-kept"), ("lost", work / "vol-lost")):
                extra.update(
                    await self.restart(deployment, reader, all_keys, case, data_dir, changelog, timeout_s)
                )
            # B's standby copies of A's 3 partitions have caught up well within one full replay.
            extra["settle_s"] = max(5.0, extra.get("volume_lost_replay_s") or extra["volume_lost_ready_s"])
            for standby, full_volume in ((0, work / "vol-kept"), (1, work / "vol-lost")):
                extra.update(
                    await self.failover(
                        deployment,
                        reader,
                        all_keys,
                        standby,
                        full_volume,
                        changelog,
                        timeout_s,
                        extra["settle_s"],
                    )
                )
        finally:
            await reader.stop()
            await self.stop_all()
        replay_s, replayed = extra.get("volume_lost_replay_s"), extra.get("volume_lost_replayed_records")
        rate = replayed / replay_s if replay_s and replayed else None
        self.recorder.add(Result(name=name, unit="s", rate=rate, extra=extra))

    async def fill(
        self,
        deployment: Deployment,
        reader: Reader,
        all_keys: list[bytes],
        changelog: str,
        data_dir: Path,
        timeout_s: float,
    ) -> dict[str, Any]:
        """Step 1: every key's 10 KiB through a worker, which then stops cleanly."""
        name, keys = result_name(len(all_keys)), len(all_keys)
        progress(f"{name}: filling {keys} keys x {MEMORY_BYTES // 1024} KiB through a worker")
        fill = encode(AgentEnvelope(payload="fill"))
        await produce_all(self.bootstrap, deployment.topic(EVENTS), [(k, fill) for k in all_keys])
        worker = self.recovery_worker(deployment, "fill", data_dir)
        started = time.monotonic()
        await self.launch_ready(worker, timeout_s)
        outputs: list[OutRecord] = await reader.take(
            keys, timeout_s=120 + keys / 20, watch=[worker], match=lambda r: r.value == b"filled"
        )
        fill_s = time.monotonic() - started
        stopped = await self.retire(worker)
        if stopped != 0:
            raise BenchFailure(f"{name}: the fill worker did not stop cleanly (exit {stopped})")
        ends = await end_offsets(self.bootstrap, changelog, deployment.partitions(EVENTS))
        size = await changelog_bytes(self.bootstrap, changelog)
        progress(
            f"{name}: filled in {fill_s:.1f} s ({rate_of(outputs):.0f} keys/s); changelog "
            f"{sum(ends.values())} records, {size} bytes"
        )
        return {
            "fill_s": fill_s,
            "fill_rate": rate_of(outputs),
            "changelog_records": sum(ends.values()),
            "changelog_bytes": size,
            "changelog_bytes_source": "DescribeLogDirs partition_size, summed over partitions"
            if size is not None
            else None,
        }

    async def restart(
        self,
        deployment: Deployment,
        reader: Reader,
        all_keys: list[bytes],
        case: str,
        data_dir: Path,
        changelog: str,
        timeout_s: float,
    ) -> dict[str, Any]:
        """Step 2: one worker on ``data_dir`` (``case`` kept: the fill's volume; lost: a fresh
        one), timed to ready and to the middle key's probe."""
        name = result_name(len(all_keys))
        middle = all_keys[len(all_keys) // 2]
        worker = self.recovery_worker(deployment, case, data_dir)
        await self.send_probes(deployment, [middle], case)  # waiting before the launch
        launched, ready_s = await self.launch_ready(worker, timeout_s)
        probe = (await self.await_probes(reader, case, 1, timeout_s=timeout_s, watch=[worker]))[middle]
        self.check_no_stall(worker, 0, f"{name}: volume {case}")
        if not probe.intact:
            raise BenchFailure(f"{name}: volume {case}: the middle key's 10 KiB did not come back intact")
        await self.wait_logged(worker, TIMERS_LINE, 0, 30 + len(all_keys) / 1000)
        await self.retire(worker)
        logged = worker.log_since_start()
        replays = takeover_replays(logged, changelog)
        began, ended = first_logged(logged, REPLAY_LINE), first_logged(logged, REPLAYED_LINE)
        figures = {
            f"volume_{case}_ready_s": ready_s,
            f"volume_{case}_first_event_s": probe.at_s - launched,
            f"volume_{case}_replayed_records": replays[-1].total() if replays else None,
            f"volume_{case}_replay_s": ended - began if began is not None and ended is not None else None,
            f"volume_{case}_restored_s": _since(first_logged(logged, RESTORED_LINE), launched),
            f"volume_{case}_timer_index_s": _since(first_logged(logged, TIMERS_LINE), launched),
        }
        progress(
            f"{name}: volume {case}: ready {ready_s:.2f} s, first event {probe.at_s - launched:.2f} s; "
            f"replayed {figures[f'volume_{case}_replayed_records']} records "
            f"in {_seconds(figures[f'volume_{case}_replay_s'])}"
        )
        return figures

    async def failover(
        self,
        deployment: Deployment,
        reader: Reader,
        all_keys: list[bytes],
        standby: int,
        full_volume: Path,
        changelog: str,
        timeout_s: float,
        settle_s: float,
    ) -> dict[str, Any]:
        """Step 3 with ``table_standby_replicas`` = ``standby``."""
        name = result_name(len(all_keys))
        partitions = deployment.partitions(EVENTS)
        progress(f"{name}: failover, standby replicas {standby}: A on a full volume, B joins empty")
        a_label, b_label = f"s{standby}-A", f"s{standby}-B"
        a = self.recovery_worker(deployment, a_label, full_volume, standby=standby)
        b_dir = deployment.work_dir / f"vol-s{standby}-B"
        b = self.recovery_worker(deployment, b_label, b_dir, standby=standby)
        await self.launch_ready(a, timeout_s)
        _, join_ready_s = await self.launch_ready(b, timeout_s)
        await self.wait_logged(b, TIMERS_LINE, 0, 30 + len(all_keys) / 1000)  # the join's own scan
        if standby:
            await asyncio.sleep(settle_s)  # B's standby copies of A's partitions catch up
        # One "who" probe per partition, on the first key from the middle of the range on.
        firsts: dict[int, bytes] = {}
        for key in all_keys[len(all_keys) // 2 :] + all_keys:
            firsts.setdefault(expected_partition(key, partitions), key)
            if len(firsts) == partitions:
                break
        who = await self.probe(
            deployment, reader, list(firsts.values()), f"who-s{standby}", timeout_s=60, watch=[a, b]
        )
        owners = {p: who[k].worker for p, k in firsts.items()}
        a_partitions = sorted(p for p, w in owners.items() if w == a_label)
        if not a_partitions or len(a_partitions) == partitions:
            raise BenchFailure(f"{name}: standby {standby}: A owns partitions {a_partitions} of {owners}")
        victim = min(
            (k for p, k in firsts.items() if p in a_partitions),
            key=lambda k: abs(all_keys.index(k) - len(all_keys) // 2),
        )
        joined_log = b.log_since_start()
        tag = f"failover-s{standby}"
        killed = time.time()
        await asyncio.to_thread(a.kill9)
        await self.send_probes(deployment, [victim], tag)
        probe = (await self.await_probes(reader, tag, 1, timeout_s=timeout_s + 60, watch=[b]))[victim]
        self.check_no_stall(b, len(joined_log), f"{name}: standby {standby}: failover")
        if probe.worker != b_label or not probe.intact:
            raise BenchFailure(f"{name}: standby {standby}: the failover probe was answered by {probe}")
        failover_s = probe.at_s - killed
        await self.wait_logged(b, TIMERS_LINE, len(joined_log), 30 + len(all_keys) / 1000)
        await self.retire(b)
        self.processes.remove(a)  # killed above
        after_kill = b.log_since_start()[len(joined_log) :]
        replays = takeover_replays(after_kill, changelog)
        joined = takeover_replays(joined_log, changelog)
        rebalance_s = _since(first_logged(after_kill, REBALANCE_LINE), killed)
        restored_s = _since(first_logged(after_kill, RESTORED_LINE), killed)
        figures = {
            f"standby{standby}_failover_s": failover_s,
            f"standby{standby}_rebalance_s": rebalance_s,
            f"standby{standby}_restored_s": restored_s,
            f"standby{standby}_timer_index_s": _since(first_logged(after_kill, TIMERS_LINE), killed),
            f"standby{standby}_failover_replayed_records": replays[-1].total(a_partitions)
            if replays
            else None,
            f"standby{standby}_join_ready_s": join_ready_s,
            f"standby{standby}_join_replayed_records": joined[-1].total() if joined else None,
            f"standby{standby}_a_partitions": a_partitions,
        }
        shutil.rmtree(b_dir, ignore_errors=True)
        progress(
            f"{name}: standby {standby}: B joined in {join_ready_s:.2f} s; failover {failover_s:.2f} s after "
            f"kill -9 (rebalance began at {_seconds(rebalance_s)}, tables restored at "
            f"{_seconds(restored_s)}); B replayed "
            f"{figures[f'standby{standby}_failover_replayed_records']} records of A's partitions "
            f"{a_partitions}"
        )
        return figures


def sizes_for(size: Size) -> tuple[int, ...]:
    override = os.environ.get(FULL_KEYS_ENV) if size == "full" else None
    if override:
        return tuple(int(k) for k in override.split(",") if k.strip())
    return KEYS[size]


async def run_recovery_benchmarks(
    recorder: Recorder, *, size: Size, bootstrap: str, keys: Sequence[int] = (), keep_logs: bool = False
) -> None:
    """Every recovery size (``keys``, default :func:`sizes_for` ``size``), each a Result in
    ``recorder``. A size that fails does not stop the next; the first failure is raised
    after all ran. Processes are stopped and the run's topics deleted either way."""
    bench = RecoveryBench(recorder, bootstrap)
    progress(f"recovery benchmarks on {bootstrap}; topics {bench.run_id}-*; logs in {bench.work_dir}")
    sizes = [(result_name(n), functools.partial(bench.size, n)) for n in keys or sizes_for(size)]
    with quiet_client_logs():  # fresh topics: NotLeaderForPartition retries for a moment
        try:
            await run_steps("recovery size(s)", sizes, after_each=bench.stop_all, logs=bench.work_dir)
        finally:
            await bench.stop_all()
            if not keep_logs:
                await bench.delete_topics()
    if keep_logs:
        progress(f"logs kept in {bench.work_dir}")
    else:
        shutil.rmtree(bench.work_dir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.recovery --keys N [--keys M]``: the recovery benchmarks alone, against
    KAFKA_BOOTSTRAP_SERVERS; writes <out>/results.json and prints the report's table."""
    from bench.report import recovery_table

    parser = argparse.ArgumentParser(prog="python -m bench.recovery", description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, action="append", required=True, help="a size; repeatable")
    parser.add_argument(
        "--out", type=Path, default=Path("bench/out/recovery"), help="where results.json goes"
    )
    parser.add_argument("--keep-logs", action="store_true", help="keep the workers' logs, volumes and topics")
    args = parser.parse_args(argv)
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if not bootstrap:
        print("python -m bench.recovery needs KAFKA_BOOTSTRAP_SERVERS", file=sys.stderr)
        return 2
    recorder = Recorder(args.out, size="full")
    asyncio.run(
        run_recovery_benchmarks(
            recorder, size="full", bootstrap=bootstrap, keys=args.keys, keep_logs=args.keep_logs
        )
    )
    print("\n".join(recovery_table(recorder.results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
