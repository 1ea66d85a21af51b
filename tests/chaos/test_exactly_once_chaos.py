"""Exactly once in effect under kill -9: a seeded chaos run against a real broker.

Two workers and an effector run as real processes while the real `kcat` produces a paced
stream; a seeded schedule kill -9s one of the three at a time and restarts it. Then every
user-visible outcome is checked (see tests/chaos/harness.py) and every violation reported.

CI runs one short seed per variant. `make chaos` runs the long version:
CHAOS_EVENTS=10000 CHAOS_KILLS=30 over several CHAOS_SEEDs. To replay a failure, set the
CHAOS_SEED / CHAOS_EVENTS / CHAOS_KEYS / CHAOS_KILLS the failure message prints.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import pytest

from keylane.catalog import EVENTS, Catalog
from keylane.config import Settings
from tests.agents.counter import PAGED_BALLAST_BYTES
from tests.chaos.harness import (
    VARIANTS,
    PacedKcat,
    Plan,
    Supervisor,
    Variant,
    check,
    counter_processes,
    input_groups,
    read_end_state,
    wait_for_commits,
    wait_for_outputs,
)
from tests.processes import process_env

_EVENTS = int(os.environ.get("CHAOS_EVENTS", "300"))
_KILLS = int(os.environ.get("CHAOS_KILLS", "10"))
# Per kill: the pause (<= 4 s) and a restart that waits for readiness and a rebalance.
TIMEOUT_S = 600 + 40 * _KILLS + _EVENTS // 10
OUTPUTS_TIMEOUT_S = 180 + _EVENTS / 20
COMMITS_TIMEOUT_S = 120.0
TOOL_TIMEOUT_S = "5"  # the effector's claim lease is this + 30 s: a killed claim waits that long

pytestmark = [pytest.mark.kafka, pytest.mark.chaos]


def _variant(variant: Variant) -> Any:
    """The variant as a parameter. `make test` leaves the plain librdkafka one to `make chaos`
    (``chaos_long``): the default run's broker failover chaos uses that partitioner, with
    kill -9s of both workers and the effector, and the sharded variant routes with it too."""
    marks = [pytest.mark.chaos_long] if variant.name == "librdkafka" else []
    return pytest.param(variant, id=variant.name, marks=marks)


@pytest.mark.timeout(TIMEOUT_S)
@pytest.mark.parametrize("variant", [_variant(v) for v in VARIANTS])
async def test_kill_9_chaos_keeps_exactly_once_in_effect(
    settings: Settings, catalog: Catalog, tmp_path: Path, variant: Variant
) -> None:
    plan = Plan.from_env(variant)
    header = (
        f"chaos variant={variant.name} {plan.describe()}\n"
        f"replay: CHAOS_SEED={plan.seed} CHAOS_EVENTS={len(plan.events)} "
        f"CHAOS_KEYS={os.environ.get('CHAOS_KEYS', '40')} CHAOS_KILLS={len(plan.kills)} "
        f"pytest 'tests/chaos/test_exactly_once_chaos.py::"
        f"test_kill_9_chaos_keeps_exactly_once_in_effect[{variant.name}]'\n"
        f"logs: {tmp_path}; topics: {settings.topic_prefix}agent.*; group: {settings.app_id}"
    )
    print(header, flush=True)
    tool_ledger, llm_ledger = tmp_path / "tools.jsonl", tmp_path / "llm.jsonl"
    env = process_env(
        settings,
        TOOL_LEDGER=str(tool_ledger),
        LLM_LEDGER=str(llm_ledger),
        COUNTER_BALLAST_BYTES=str(PAGED_BALLAST_BYTES),  # every other key's memory is paged
    )
    processes = counter_processes(env, tmp_path, config_ref=variant.config_ref, tool_timeout_s=TOOL_TIMEOUT_S)
    supervisor = Supervisor(processes)
    started = time.monotonic()
    for name in processes:
        await supervisor.start(name)
    stream = PacedKcat(settings, catalog.name(EVENTS), variant.partitioner, tmp_path / "kcat.log")
    try:
        for chunk, kill in zip(plan.chunks, plan.kills, strict=False):
            stream.flow(chunk, over_s=kill.pause_s * 1.5)  # still flowing when the kill lands
            await asyncio.sleep(kill.pause_s)  # the schedule's pause, not a wait for a result
            await supervisor.check_alive(restart=True)
            await supervisor.kill9_and_restart(kill.victim)
        stream.flow(plan.chunks[-1], over_s=2.0)
        await asyncio.to_thread(stream.finish)
    except BaseException:
        stream.kill()
        raise
    streamed_s = time.monotonic() - started

    keep_alive = supervisor.keep_alive  # a process that dies while the rest drains is restarted
    missing = await wait_for_outputs(settings, catalog, plan, timeout_s=OUTPUTS_TIMEOUT_S, between=keep_alive)
    groups = input_groups(settings, catalog, sharded=variant.shards is not None)
    lags = await wait_for_commits(settings, groups, timeout_s=COMMITS_TIMEOUT_S, between=keep_alive)
    await supervisor.check_alive(restart=False)
    supervisor.stop()
    state = await read_end_state(
        settings, catalog, tool_ledger, llm_ledger, sharded=variant.shards is not None
    )

    found = check(plan, state, lags, sharded=variant.shards is not None)
    for line in supervisor.unplanned:
        found.add("process exited or hung without being killed", line)
    found.figures["events_without_output_at_deadline"] = len(missing)
    found.figures["stream_and_kills_s"] = round(streamed_s, 1)
    found.figures["total_s"] = round(time.monotonic() - started, 1)
    report = found.report(header)
    print(report, flush=True)
    assert not found, report
