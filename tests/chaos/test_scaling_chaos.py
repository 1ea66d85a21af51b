"""Never stall, never lose while the worker group scales 1 -> 2 -> 3 -> 1 beside a CPU hog.

A paced kcat stream of suspending events (every event waits on a tool result from the
effector) flows while workers join and leave: each join and each leave is a rebalance with
activations, suspensions and results in flight. The leaves are seeded: a clean stop
(SIGTERM, what a scale-down does) or a kill -9. A `yes` process keeps one core busy all the
while, as on a loaded CI machine. Then every event has one output, each key's counter ran
1, 2, 3 ..., each tool ran once, agent.errors is empty, and every input partition's
committed offset reached its end (tests/chaos/harness.py checks all of it).

CI runs one short seed; `make chaos` the long one (CHAOS_EVENTS, CHAOS_SEED).
"""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import time
from pathlib import Path

import pytest

from keylane.catalog import EVENTS, Catalog
from keylane.config import Settings
from tests.chaos.harness import (
    PacedKcat,
    Plan,
    Supervisor,
    check,
    counter_processes,
    input_groups,
    read_end_state,
    wait_for_commits,
    wait_for_outputs,
)
from tests.processes import process_env

_EVENTS = int(os.environ.get("CHAOS_EVENTS", "300"))
TIMEOUT_S = 600 + _EVENTS // 10
WORKERS = ("worker-1", "worker-2", "worker-3")
# (what happens after the pause, the workers running afterwards)
STEPS = (("join", "worker-2"), ("join", "worker-3"), ("leave", "worker-2"), ("leave", "worker-3"))

pytestmark = [pytest.mark.kafka, pytest.mark.chaos]


@pytest.mark.timeout(TIMEOUT_S)
async def test_scaling_1_2_3_1_beside_a_cpu_hog_loses_nothing_and_stalls_nothing(
    settings: Settings, catalog: Catalog, tmp_path: Path
) -> None:
    seed = int(os.environ.get("CHAOS_SEED", "1"))
    plan = Plan.build(seed=seed, events=_EVENTS, keys=40, kills=len(STEPS), shards=None)
    rng = random.Random(f"scaling-{seed}")
    leaves = {name: rng.choice(("sigterm", "kill -9")) for kind, name in STEPS if kind == "leave"}
    header = (
        f"scaling chaos seed={seed} events={len(plan.events)} steps="
        + " ".join(
            f"{kind}:{name}({leaves.get(name, 'start') if kind == 'leave' else 'start'})"
            for kind, name in STEPS
        )
        + f"\nreplay: CHAOS_SEED={seed} CHAOS_EVENTS={len(plan.events)} pytest {__file__}\n"
        f"logs: {tmp_path}; topics: {settings.topic_prefix}agent.*; group: {settings.app_id}"
    )
    print(header, flush=True)
    tool_ledger, llm_ledger = tmp_path / "tools.jsonl", tmp_path / "llm.jsonl"
    env = process_env(settings, TOOL_LEDGER=str(tool_ledger), LLM_LEDGER=str(llm_ledger))
    processes = counter_processes(env, tmp_path, config_ref="tests.agents.counter:config", workers=WORKERS)
    supervisor = Supervisor(processes)
    meant_to_run = {"effector", "worker-1"}

    async def keep_alive() -> None:
        """Restart a process that should be running and exited by itself (and report it)."""
        for name in sorted(meant_to_run):
            process = processes[name]
            if process.proc is not None and process.proc.poll() is not None:
                supervisor.unplanned.append(f"{name} exited by itself: {supervisor.reason(name)}")
                await supervisor.start(name)

    hog = await asyncio.create_subprocess_exec("yes", stdout=subprocess.DEVNULL)
    started = time.monotonic()
    try:
        await supervisor.start("effector")
        await supervisor.start("worker-1")
        stream = PacedKcat(settings, catalog.name(EVENTS), None, tmp_path / "kcat.log")
        try:
            for chunk, kill, (kind, name) in zip(plan.chunks, plan.kills, STEPS, strict=False):
                pause = 2 * kill.pause_s
                stream.flow(chunk, over_s=pause * 1.5)
                await asyncio.sleep(pause)
                await keep_alive()
                if kind == "join":
                    meant_to_run.add(name)
                    await supervisor.start(name)
                elif leaves[name] == "sigterm":
                    meant_to_run.discard(name)
                    await asyncio.to_thread(processes[name].stop)
                else:
                    meant_to_run.discard(name)
                    processes[name].kill9()
                processes_running = [n for n, p in processes.items() if p.proc and p.proc.poll() is None]
                print(
                    f"{time.monotonic() - started:.1f}s {kind} {name}: running {processes_running}",
                    flush=True,
                )
            stream.flow(plan.chunks[-1], over_s=2.0)
            await asyncio.to_thread(stream.finish)
        except BaseException:
            stream.kill()
            raise
        streamed_s = time.monotonic() - started

        missing = await wait_for_outputs(
            settings, catalog, plan, timeout_s=180 + _EVENTS / 20, between=keep_alive
        )
        lags = await wait_for_commits(
            settings, input_groups(settings, catalog, sharded=False), timeout_s=120, between=keep_alive
        )
        await keep_alive()
    finally:
        hog.kill()
        await hog.wait()
        supervisor.stop()
    state = await read_end_state(settings, catalog, tool_ledger, llm_ledger, sharded=False)

    found = check(plan, state, lags, sharded=False)
    for line in supervisor.unplanned:
        found.add("process exited or hung without being stopped", line)
    found.figures["events_without_output_at_deadline"] = len(missing)
    found.figures["stream_and_scaling_s"] = round(streamed_s, 1)
    found.figures["total_s"] = round(time.monotonic() - started, 1)
    report = found.report(header)
    print(report, flush=True)
    assert not found, report
