"""A rebalance never re-runs a tool: a second effector joins while a 14 s tool runs in every
partition (longer than the worker's 10 s revocation grace). The first effector lets them
finish, records Done and publishes before it hands any partition over; nothing runs twice.

Before the effector's grace covered its tool timeout, the first effector cancelled the tools
after 10 s, nothing recorded Done, and the partitions' owners re-ran every one of them once
the 90 s lease had run out."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from keylane import tool
from keylane.catalog import INTENTS, RESULTS, Catalog
from keylane.config import Settings
from keylane.kafka.topic_reader import read_to_end
from keylane.wire import ToolIntent, ToolResult, decode, encode
from tests.agents.flow import append_ledger
from tests.integration.stream_checks import tool_runs, wait_until
from tests.kafka_io import one_key_per_partition, produce
from tests.processes import KeylaneProcess, process_env, running

pytestmark = pytest.mark.kafka

SLOW_S = 14.0


@tool("slow_ship", side_effect=True)
async def slow_ship(args: dict[str, Any]) -> dict[str, Any]:
    """The effect happens first (one TOOL_LEDGER line), then the tool waits for a confirmation."""
    append_ledger("TOOL_LEDGER", {"order": args["order"], "pid": os.getpid()})
    await asyncio.sleep(SLOW_S)
    return {"shipped": args["order"]}


def fresh_intent(intent_id: str, key: str, tool: str, args: dict[str, Any]) -> ToolIntent:
    """An intent created now, expiring in 10 minutes: the first step of its key's activation."""
    now = time.time_ns() // 1_000_000
    return ToolIntent(
        intent_id=intent_id,
        entity_key=key,
        seq=0,
        step_index=0,
        tool=tool,
        args_json=json.dumps(args),
        created_at_ms=now,
        expires_at_ms=now + 600_000,
    )


def ship(key: bytes) -> ToolIntent:
    return fresh_intent(f"ship-{key.decode()}", key.decode(), "slow_ship", {"order": key.decode()})


@pytest.mark.timeout(300)
async def test_an_effector_joining_while_tools_run_makes_no_tool_run_twice(
    settings: Settings, catalog: Catalog, tmp_path: Path
) -> None:
    ledger = tmp_path / "tools.jsonl"
    env = process_env(settings, TOOL_LEDGER=str(ledger))
    args = ["effector", "--tools", "tests.integration.test_effector_rebalance"]
    first = KeylaneProcess(args, {**env, "KEYLANE_DATA_DIR": str(tmp_path / "e1")}, tmp_path / "e1.log")
    second = KeylaneProcess(args, {**env, "KEYLANE_DATA_DIR": str(tmp_path / "e2")}, tmp_path / "e2.log")
    keys = one_key_per_partition(catalog[INTENTS].partitions, "order-{}#0")
    intents = {ship(key).intent_id for key in keys}
    orders = sorted(key.decode() for key in keys)

    with running(first):
        await produce(settings, catalog.name(INTENTS), [(key, encode(ship(key))) for key in keys])
        await wait_until(lambda: tool_runs(ledger) == len(keys), timeout_s=60, what="every tool under way")
        began = time.monotonic()
        with running(second):  # the group rebalances while every partition runs its tool
            results = await wait_results(settings, catalog, intents, timeout_s=90)
            answered_after_s = time.monotonic() - began

    runs = [json.loads(line) for line in ledger.read_text().splitlines()]
    assert sorted(r["order"] for r in runs) == orders, "each tool ran exactly once"
    assert {r["pid"] for r in runs} == {first.proc.pid if first.proc else None}
    assert all(decode(v, ToolResult).status == "OK" for v in results.values())
    assert answered_after_s < SLOW_S + 30, "answered when the tools finished, not after a lease"
    assert "revoked: cancelled" not in first.log(), first.tail()
    assert "Setting newly assigned partitions" in second.log(), "the second effector took partitions over"


async def wait_results(
    settings: Settings, catalog: Catalog, intents: set[str], *, timeout_s: float
) -> dict[str, bytes]:
    """The first result of every intent, once each has one."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        results: dict[str, bytes] = {}
        for record in await read_to_end(settings, catalog.name(RESULTS)):
            if record.value is not None:
                results.setdefault(record.record_id, record.value)
        if set(results) >= intents:
            return results
        assert asyncio.get_running_loop().time() < deadline, f"only {len(results)} of {len(intents)} answered"
        await asyncio.sleep(0.5)
