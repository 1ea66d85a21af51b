"""kill -9 of the worker in the middle of a stream, several times, then let it finish.

Every event ends with exactly one output when outputs are deduplicated by their
deterministic id; each output shows the key's memory ring holding exactly that key's
events up to it, in order (no activation half-applied, lost or applied twice); the
effector ran each intent once (the tool's own ledger).
"""

from __future__ import annotations

import shutil
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

KEYS = [f"cust-{i}".encode() for i in range(16)]  # several keys per partition: many lanes in flight
EVENTS_PER_KEY = 6
KILL_AFTER_TOOL_RUNS = (15, 40, 65)  # the last restart also loses its local RocksDB


@pytest.mark.timeout(300)
async def test_kill_9_mid_stream_loses_and_duplicates_nothing(
    settings: Settings, catalog: Catalog, tmp_path: Path
) -> None:
    tool_ledger = tmp_path / "tools.jsonl"
    env = process_env(
        settings,
        LLM_LEDGER=str(tmp_path / "llm.jsonl"),
        TOOL_LEDGER=str(tool_ledger),
        FAKE_LLM_LATENCY_MS="20",
    )
    effector = KeylaneProcess(["effector", "--tools", "tests.agents.flow"], env, tmp_path / "effector.log")
    worker = KeylaneProcess(
        ["worker", "--agent", "tests.agents.flow:act_then_complete"], env, tmp_path / "worker.log"
    )
    payloads = {key: [f"{key.decode()}-e{i}" for i in range(EVENTS_PER_KEY)] for key in KEYS}
    events = [
        (key, encode(AgentEnvelope(payload=p)))
        for i in range(EVENTS_PER_KEY)
        for key in KEYS
        for p in [payloads[key][i]]
    ]

    with running(effector):
        worker.start()
        await produce(settings, catalog.name(EVENTS), events)
        for number, threshold in enumerate(KILL_AFTER_TOOL_RUNS, start=1):
            await wait_until(
                lambda t=threshold: tool_runs(tool_ledger) >= t, timeout_s=90, what=f"{threshold} runs"
            )
            worker.kill9()
            if number == len(KILL_AFTER_TOOL_RUNS):
                # Faust keeps tables in <data dir>/v1/tables: without them it restores from the changelog.
                tables = settings.data_dir / "v1" / "tables"
                assert any(tables.iterdir()), "the worker kept local tables to lose"
                shutil.rmtree(settings.data_dir / "v1")
            worker.start()
        total = len(events)
        await wait_until(lambda: tool_runs(tool_ledger) >= total, timeout_s=120, what="all tool runs")
        outputs = await outputs_by_id(settings, catalog, total, timeout_s=120)
        worker.stop()

    assert_exactly_once_in_effect(outputs, payloads, tool_ledger)
