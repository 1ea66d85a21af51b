"""kill -9 of the worker in the middle of a stream, several times, then let it finish.

Every event ends with exactly one output when outputs are deduplicated by their
deterministic id; each output shows the key's memory ring holding exactly that key's
events up to it, in order (no activation half-applied, lost or applied twice); the
effector ran each intent once (the tool's own ledger).
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections import defaultdict
from pathlib import Path

import pytest

from service.catalog import EVENTS, OUTPUT, Catalog
from service.config import Settings
from service.wire import AgentEnvelope, encode
from tests.kafka_io import produce, read_all
from tests.processes import KeylaneProcess, process_env, running

pytestmark = pytest.mark.kafka

KEYS = [f"cust-{i}".encode() for i in range(6)]
EVENTS_PER_KEY = 8
KILL_AFTER_TOOL_RUNS = (8, 20, 32)  # the last restart also loses its local RocksDB


def tool_runs(ledger: Path) -> int:
    return len(ledger.read_text().splitlines()) if ledger.exists() else 0


async def wait_until(condition: object, *, timeout_s: float, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


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
                shutil.rmtree(
                    settings.data_dir / "keylane", ignore_errors=True
                )  # recover from changelog only
                shutil.rmtree(settings.data_dir / "keylane-state", ignore_errors=True)
            worker.start()
        total = len(events)
        await wait_until(lambda: tool_runs(tool_ledger) >= total, timeout_s=120, what="all tool runs")
        outputs: dict[str, set[bytes]] = defaultdict(set)
        deadline = asyncio.get_running_loop().time() + 120
        while len(outputs) < total:
            assert asyncio.get_running_loop().time() < deadline, worker.tail()
            for record in await read_all(settings, catalog.name(OUTPUT)):
                assert record.value is not None
                outputs[record.record_id].add(record.value)
            await asyncio.sleep(0.5)
        worker.stop()

    assert len(outputs) == total, "exactly one output per event, deduplicated by id"
    assert all(len(values) == 1 for values in outputs.values()), "duplicates of an output are identical"
    seen: dict[str, list[str]] = defaultdict(list)
    for values in outputs.values():
        output = json.loads(next(iter(values)))
        key_events = payloads[output["key"].encode()]
        index = key_events.index(output["event"])
        assert output["ring"] == key_events[: index + 1], f"memory is exactly the events so far: {output}"
        assert output["seq"] == 2 * index, "two committed activations (start, resume) per event"
        assert output["status"] == "OK"
        seen[output["key"]].append(output["event"])
    assert {k: sorted(v) for k, v in seen.items()} == {k.decode(): sorted(v) for k, v in payloads.items()}
    ledger_lines = tool_ledger.read_text().splitlines()
    assert len(ledger_lines) == total and len(set(ledger_lines)) == total, "each intent executed once"
