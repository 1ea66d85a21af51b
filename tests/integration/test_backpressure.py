"""A lane window that stays full for more than a second pauses fetching for its partition
only; resumed, the partition is read again from the next expected offset, and nothing is
lost, duplicated or reordered. Every seek this takes runs in the consumer thread that drains
aiokafka's fetched records (tests/integration/seek_thread_probe.py watches them)."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

from keylane.catalog import EVENTS, OUTPUT, Catalog
from keylane.config import Settings
from keylane.testing.processes import free_port
from keylane.wire import AgentEnvelope, encode
from tests.integration.test_redelivery import by_id, metric
from tests.kafka_io import produce, wait_for_records
from tests.processes import KeylaneProcess, process_env, running

pytestmark = pytest.mark.kafka

KEYS = [f"hot-{i}".encode() for i in range(6)]
EVENTS_PER_KEY = 24


async def test_full_windows_pause_partitions_and_every_event_still_runs_in_order(
    settings: Settings, catalog: Catalog, tmp_path: Path
) -> None:
    port = free_port()
    env = process_env(
        settings,
        LLM_LEDGER=str(tmp_path / "llm.jsonl"),
        FAKE_LLM_LATENCY_MS="200",
        KEYLANE_METRICS_PORT=str(port),
        SEEK_PROBE_LOG=str(tmp_path / "seeks.log"),
    )
    worker = KeylaneProcess(
        ["worker", "--agent", "tests.agents.flow:remember", "--config", "tests.agents.flow:narrow"],
        env,
        tmp_path / "worker.log",
        module="tests.integration.seek_thread_probe",
    )
    events = [
        (key, encode(AgentEnvelope(payload=f"{key.decode()}-e{i}")))
        for i in range(EVENTS_PER_KEY)
        for key in KEYS
    ]
    total = len(events)

    with running(worker):
        await produce(settings, catalog.name(EVENTS), events)
        records = await wait_for_records(
            settings, catalog.name(OUTPUT), lambda rs: len(by_id(rs)) == total, timeout_s=120
        )
        pauses = await metric(port, "keylane_partition_pauses_total")

    assert pauses >= 1, "8 records at 200 ms each take longer to drain than the 1 s hold"
    seeks = (tmp_path / "seeks.log").read_text().splitlines()
    assert any("agent.events" in line for line in seeks), "a resumed partition is sought back"
    wrong = [line for line in seeks if not line.startswith("ok ")]
    assert not wrong, f"seeks from outside the consumer thread race aiokafka's fetcher: {wrong[:5]}"
    seen: dict[str, list[int]] = defaultdict(list)
    for values in by_id(records).values():
        assert len(values) == 1
        output = json.loads(next(iter(values)))
        index = int(output["event"].rsplit("-e", 1)[1])
        assert output["seq"] == index, f"events ran in offset order: {output}"
        assert output["ring"][-1] == output["event"]
        seen[output["key"]].append(index)
    assert {k: sorted(v) for k, v in seen.items()} == {k.decode(): list(range(EVENTS_PER_KEY)) for k in KEYS}
