"""Scale 1 -> 2 -> 1 workers while a stream with suspensions flows: the end state is the
same as without any rebalance (one output per event, exact memory, each intent run once).

This lost 1-3 of 96 events before the offset ledger (service/keylane/core/offsets.py): a record
fetched before a rebalance was dropped from Faust's buffers, the partition (with nothing
committed yet) was not sought back, and Faust committed past it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from keylane.catalog import EVENTS, Catalog
from keylane.config import Settings
from keylane.wire import AgentEnvelope, encode
from tests.integration.stream_checks import (
    assert_exactly_once_in_effect,
    outputs_by_id,
    tool_runs,
    wait_until,
)
from tests.kafka_io import produce
from tests.processes import KeylaneProcess, process_env, running

pytestmark = pytest.mark.kafka

KEYS = [f"acct-{i}".encode() for i in range(12)]
EVENTS_PER_KEY = 8


async def trickle(settings: Settings, catalog: Catalog, payloads: dict[bytes, list[str]]) -> None:
    """Produce one round of events (one per key) every 0.4 s, so work flows through every change."""
    for i in range(EVENTS_PER_KEY):
        await produce(
            settings, catalog.name(EVENTS), [(k, encode(AgentEnvelope(payload=payloads[k][i]))) for k in KEYS]
        )
        await asyncio.sleep(0.4)


@pytest.mark.timeout(300)
async def test_scaling_1_2_1_keeps_every_guarantee(
    settings: Settings, catalog: Catalog, tmp_path: Path
) -> None:
    ledger = tmp_path / "tools.jsonl"
    env = process_env(
        settings, TOOL_LEDGER=str(ledger), LLM_LEDGER=str(tmp_path / "llm.jsonl"), FAKE_LLM_LATENCY_MS="30"
    )
    agent = ["worker", "--agent", "tests.agents.flow:act_then_complete"]
    first = KeylaneProcess(
        agent, {**env, "KEYLANE_DATA_DIR": str(tmp_path / "first")}, tmp_path / "first.log"
    )
    second = KeylaneProcess(
        agent, {**env, "KEYLANE_DATA_DIR": str(tmp_path / "second")}, tmp_path / "second.log"
    )
    payloads = {key: [f"{key.decode()}-e{i}" for i in range(EVENTS_PER_KEY)] for key in KEYS}
    total = len(KEYS) * EVENTS_PER_KEY

    with running(
        KeylaneProcess(["effector", "--tools", "tests.agents.flow"], env, tmp_path / "effector.log")
    ):
        first.start()
        producing = asyncio.create_task(trickle(settings, catalog, payloads))
        await wait_until(lambda: tool_runs(ledger) >= 10, timeout_s=60, what="10 tool runs")
        second.start()  # 1 -> 2: half the partitions move, with suspensions in flight
        await wait_until(lambda: tool_runs(ledger) >= total // 2, timeout_s=120, what="half the tool runs")
        assert first.stop() == 0  # 2 -> 1: they all move to the second worker
        await producing
        outputs = await outputs_by_id(settings, catalog, total, timeout_s=150)
        second.stop()

    assert (
        "Revoking previously assigned partitions" in second.log() or "Setting newly assigned" in second.log()
    )
    assert_exactly_once_in_effect(outputs, payloads, ledger)


@pytest.mark.timeout(300)
async def test_activations_past_the_grace_period_are_abandoned_to_the_next_owner(
    settings: Settings, catalog: Catalog, tmp_path: Path
) -> None:
    """Every activation takes 20 s; the grace period is 1 s. When a second worker joins, the
    first cancels what is still running instead of holding the rebalance for 20 s, commits
    none of it, and the events run to one output each anyway. (With 6 s, a second worker
    that took longer than that to start on a busy machine found nothing left to cancel.)"""
    ledger = tmp_path / "tools.jsonl"
    llm_ledger = tmp_path / "llm.jsonl"
    env = process_env(
        settings, TOOL_LEDGER=str(ledger), LLM_LEDGER=str(llm_ledger), FAKE_LLM_LATENCY_MS="20000"
    )
    agent = [
        "worker",
        "--agent",
        "tests.agents.flow:act_then_complete",
        "--config",
        "tests.agents.flow:impatient",
    ]
    first = KeylaneProcess(
        agent, {**env, "KEYLANE_DATA_DIR": str(tmp_path / "first")}, tmp_path / "first.log"
    )
    second = KeylaneProcess(
        agent, {**env, "KEYLANE_DATA_DIR": str(tmp_path / "second")}, tmp_path / "second.log"
    )
    payloads = {key: [f"{key.decode()}-e0"] for key in KEYS}

    with (
        running(KeylaneProcess(["effector", "--tools", "tests.agents.flow"], env, tmp_path / "effector.log")),
        running(first),
    ):
        await produce(
            settings, catalog.name(EVENTS), [(k, encode(AgentEnvelope(payload=payloads[k][0]))) for k in KEYS]
        )
        await wait_until(
            lambda: llm_ledger.exists() and llm_ledger.read_text().count("\n") >= len(KEYS),
            timeout_s=60,
            what="every event's model call under way",
        )
        with running(second):
            outputs = await outputs_by_id(settings, catalog, len(KEYS), timeout_s=120)

    assert "revoked: cancelled" in first.log(), first.tail()
    assert_exactly_once_in_effect(outputs, payloads, ledger)
