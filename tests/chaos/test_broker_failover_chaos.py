"""A broker kill -9'd and restarted mid-stream on a 3-node cluster, beside kill -9s of the
workers and the effector: nothing lost, nothing applied twice, every input committed to its end.

The cluster is the launcher's (deploy/kafka/local_kafka.py, as `make broker NODES=3` starts
it); keylane's topics get replication factor 3 and min.insync.replicas 2, and Faust creates
its changelogs the same way (checked at the end with the admin client). Two workers and an
effector run as real processes while the real `kcat` produces a paced stream (acks=all,
idempotent). A seeded schedule kill -9s one process at a time (tests/chaos/harness.py) and,
at one seeded slot of that schedule, one seeded broker too: it stays down for a seeded 3-10 s
while the stream and the process kills go on, then restarts on its data.

To replay a failure, set the CHAOS_SEED / CHAOS_EVENTS / CHAOS_KEYS / CHAOS_KILLS the
failure message prints.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from keylane.catalog import EVENTS, Catalog, load_catalog
from keylane.config import Settings
from keylane.kafka.topic_admin import admin_client, apply_catalog
from tests.broker import local_kafka
from tests.chaos.harness import (
    VARIANTS,
    PacedKcat,
    Plan,
    Supervisor,
    Violations,
    check,
    counter_processes,
    input_groups,
    read_end_state,
    wait_for_commits,
    wait_for_outputs,
)
from tests.processes import process_env, stop_leftovers

_EVENTS = int(os.environ.get("CHAOS_EVENTS", "300"))
_KILLS = int(os.environ.get("CHAOS_KILLS", "6"))
_KEYS = int(os.environ.get("CHAOS_KEYS", "40"))
_SEED = int(os.environ.get("CHAOS_SEED", "1"))
NODES = 3
REPLICAS = 3
MIN_INSYNC = 2
# Per kill: the pause (<= 4 s) and a restart that waits for readiness and a rebalance; the
# broker's outage and restart on top.
TIMEOUT_S = 720 + 40 * _KILLS + _EVENTS // 10
OUTPUTS_TIMEOUT_S = 240 + _EVENTS / 20
COMMITS_TIMEOUT_S = 120.0
TOOL_TIMEOUT_S = "5"  # the effector's claim lease is this + 30 s: a killed claim waits that long
VARIANT = VARIANTS[0]  # librdkafka's partitioner: re-routes to the key's partition are exercised too

pytestmark = [pytest.mark.kafka, pytest.mark.chaos]


@dataclass(frozen=True)
class BrokerKill:
    """Which broker goes down, during which slot of the process-kill schedule, for how long."""

    slot: int
    node_id: int
    down_s: float

    @classmethod
    def draw(cls, seed: int, slots: int) -> BrokerKill:
        # Its own generator: the plan's stream and process schedule stay what the seed names
        # in every other chaos test.
        rng = random.Random(f"broker-failover-{seed}")
        return cls(rng.randrange(max(slots, 1)), rng.randint(1, NODES), round(rng.uniform(3.0, 10.0), 2))


@pytest.fixture(scope="module")
def cluster_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A 3-node cluster of this module's own, stopped at the end."""
    launcher = local_kafka()
    state = tmp_path_factory.mktemp("kafka-3-nodes")
    launcher.start(state, nodes=NODES, quiet=True)
    try:
        yield state
    finally:
        launcher.stop(state, quiet=True)


async def replication_violations(settings: Settings, catalog: Catalog, found: Violations) -> None:
    """Every catalog topic and every changelog of the run's apps has replication factor 3 and
    min.insync.replicas 2 set on the topic itself (config source 1: a topic override)."""
    async with admin_client(settings) as client:
        changelogs = sorted(
            t
            for t in await client.list_topics()
            if t.startswith(settings.app_id) and t.endswith("-changelog")
        )
        names = [spec.name for spec in catalog] + changelogs
        topics = await client.describe_topics(names)
        responses = await client.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, n) for n in names]
        )
    configs: dict[str, dict[str, Any]] = {
        name: {entry[0]: (entry[1], entry[3]) for entry in entries}
        for response in responses
        for _code, _msg, _type, name, entries in response.resources
    }
    found.figures["changelogs"] = len(changelogs)
    if len(changelogs) < 2:
        found.add("changelog topics missing", f"worker and effector changelogs expected, found {changelogs}")
    for topic in topics:
        name = topic["topic"]
        replicas = sorted({len(p["replicas"]) for p in topic["partitions"]})
        if replicas != [REPLICAS]:
            found.add("topic not replicated 3 ways", f"{name}: replica counts {replicas}")
        min_insync = configs.get(name, {}).get("min.insync.replicas")
        if min_insync != (str(MIN_INSYNC), 1):
            found.add(
                "topic without min.insync.replicas=2 of its own", f"{name}: (value, source) {min_insync}"
            )


@pytest.mark.timeout(TIMEOUT_S)
async def test_broker_kill_9_mid_stream_loses_nothing_and_applies_nothing_twice(
    cluster_dir: Path, tmp_path: Path
) -> None:
    launcher = local_kafka()
    cluster = launcher.running_cluster(cluster_dir)
    assert cluster is not None, f"the 3-node cluster in {cluster_dir} is not running"
    unique = uuid.uuid4().hex[:10]
    settings = Settings.from_env(
        launcher.keylane_env(cluster),
        topic_prefix=f"f{unique}.",
        app_id=f"keylane-failover-{unique}",
        data_dir=tmp_path,
    )
    catalog = load_catalog(prefix=settings.topic_prefix, replication_factor=settings.replication_factor)
    async with admin_client(settings) as client:
        await apply_catalog(client, catalog)

    plan = Plan.build(seed=_SEED, events=_EVENTS, keys=_KEYS, kills=_KILLS, shards=VARIANT.shards)
    outage = BrokerKill.draw(plan.seed, len(plan.kills))
    header = (
        f"broker failover chaos variant={VARIANT.name} {plan.describe()}; broker kill: node "
        f"{outage.node_id} down {outage.down_s}s from slot {outage.slot}\n"
        f"replay: CHAOS_SEED={plan.seed} CHAOS_EVENTS={len(plan.events)} CHAOS_KEYS={_KEYS} "
        f"CHAOS_KILLS={len(plan.kills)} pytest tests/chaos/test_broker_failover_chaos.py\n"
        f"logs: {tmp_path}; broker logs: {cluster_dir}/node-*/server.log; topics: "
        f"{settings.topic_prefix}agent.*; group: {settings.app_id}"
    )
    print(header, flush=True)
    tool_ledger, llm_ledger = tmp_path / "tools.jsonl", tmp_path / "llm.jsonl"
    env = process_env(
        settings,
        TOOL_LEDGER=str(tool_ledger),
        LLM_LEDGER=str(llm_ledger),
        KEYLANE_REPLICATION_FACTOR=str(REPLICAS),
    )
    processes = counter_processes(env, tmp_path, config_ref=VARIANT.config_ref, tool_timeout_s=TOOL_TIMEOUT_S)
    supervisor = Supervisor(processes)
    broker_task: asyncio.Task[float] | None = None

    async def broker_outage() -> float:
        """kill -9 the broker, keep it down, restart it; returns how long it was unreachable."""
        down_at = time.monotonic()
        launcher.kill_node(cluster_dir, outage.node_id)
        await asyncio.sleep(outage.down_s)
        await asyncio.to_thread(launcher.restart_node, cluster_dir, outage.node_id)
        return time.monotonic() - down_at

    started = time.monotonic()
    try:
        for name in processes:
            await supervisor.start(name)
        stream = PacedKcat(settings, catalog.name(EVENTS), VARIANT.partitioner, tmp_path / "kcat.log")
        try:
            for slot, (chunk, kill) in enumerate(zip(plan.chunks, plan.kills, strict=False)):
                stream.flow(chunk, over_s=kill.pause_s * 1.5)  # still flowing when the kill lands
                await asyncio.sleep(kill.pause_s)  # the schedule's pause, not a wait for a result
                if slot == outage.slot:
                    broker_task = asyncio.create_task(broker_outage())
                await supervisor.check_alive(restart=True)
                await supervisor.kill9_and_restart(kill.victim)
            stream.flow(plan.chunks[-1], over_s=2.0)
            await asyncio.to_thread(stream.finish)
        except BaseException:
            stream.kill()
            raise
        assert broker_task is not None
        broker_down_s = await broker_task
        streamed_s = time.monotonic() - started

        keep_alive = supervisor.keep_alive  # a process that dies while the rest drains is restarted
        missing = await wait_for_outputs(
            settings, catalog, plan, timeout_s=OUTPUTS_TIMEOUT_S, between=keep_alive
        )
        lags = await wait_for_commits(
            settings,
            input_groups(settings, catalog, sharded=False),
            timeout_s=COMMITS_TIMEOUT_S,
            between=keep_alive,
        )
        await supervisor.check_alive(restart=False)
        supervisor.stop()
        state = await read_end_state(settings, catalog, tool_ledger, llm_ledger, sharded=False)
    finally:
        if broker_task is not None and not broker_task.done():
            broker_task.cancel()
            with contextlib.suppress(BaseException):
                await broker_task
        stop_leftovers()
        if launcher.running_cluster(cluster_dir) is None:  # a failed run must not leave a node down
            with contextlib.suppress(launcher.LauncherError):
                await asyncio.to_thread(launcher.restart_node, cluster_dir, outage.node_id)

    found = check(plan, state, lags, sharded=False)
    await replication_violations(settings, catalog, found)
    for line in supervisor.unplanned:
        found.add("process exited or hung without being killed", line)
    found.figures["broker_kills"] = 1
    found.figures["broker_down_s"] = round(broker_down_s, 1)
    found.figures["events_without_output_at_deadline"] = len(missing)
    found.figures["stream_and_kills_s"] = round(streamed_s, 1)
    found.figures["total_s"] = round(time.monotonic() - started, 1)
    report = found.report(header)
    print(report, flush=True)
    assert not found, report
