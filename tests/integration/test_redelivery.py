"""Redelivery: rewinding the worker's consumer group replays every input, and nothing is
activated again: same intent ids, zero extra model calls, same seqs, no output lost."""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from keylane.catalog import ERRORS, EVENTS, INTENTS, OUTPUT, RESULTS, Catalog
from keylane.config import Settings
from keylane.kafka.topic_reader import TopicRecord, partition_ids, read_to_end
from keylane.testing.processes import free_port
from keylane.wire import AgentEnvelope, ErrorRecord, decode, encode
from tests.integration.test_worker import http_get
from tests.kafka_io import produce, wait_for_records
from tests.processes import KeylaneProcess, process_env, running

pytestmark = pytest.mark.kafka

KEYS = [b"acct-1", b"acct-2", b"acct-3"]
EVENTS_PER_KEY = 4


async def rewind_group(settings: Settings, topics: list[str]) -> None:
    """Commit offset 0 for every partition of ``topics`` in the worker's (idle) group."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.bootstrap_list, group_id=settings.app_id, enable_auto_commit=False
    )
    await consumer.start()
    try:
        partitions = [TopicPartition(t, p) for t in topics for p in await partition_ids(settings, t)]
        consumer.assign(partitions)
        await consumer.commit(dict.fromkeys(partitions, 0))
    finally:
        await consumer.stop()


def by_id(records: list[TopicRecord]) -> dict[str, set[bytes]]:
    values: dict[str, set[bytes]] = defaultdict(set)
    for record in records:
        assert record.value is not None
        values[record.record_id].add(record.value)
    return values


async def metric(port: int, name: str) -> float:
    _, body = await asyncio.to_thread(http_get, f"http://127.0.0.1:{port}/metrics")
    return sum(float(line.rsplit(" ", 1)[1]) for line in body.splitlines() if line.startswith(name))


async def test_rewound_group_replays_without_new_activations(
    settings: Settings, catalog: Catalog, tmp_path: Path
) -> None:
    ledgers = {"LLM_LEDGER": str(tmp_path / "llm.jsonl"), "TOOL_LEDGER": str(tmp_path / "tools.jsonl")}
    env = process_env(settings, **ledgers)
    agent = ["worker", "--agent", "tests.agents.flow:act_then_complete"]
    worker = KeylaneProcess(agent, env, tmp_path / "worker.log")
    effector = KeylaneProcess(["effector", "--tools", "tests.agents.flow"], env, tmp_path / "effector.log")
    events = [
        (k, encode(AgentEnvelope(payload=f"{k.decode()}-e{i}"))) for i in range(EVENTS_PER_KEY) for k in KEYS
    ]
    total = len(events)

    with running(effector):
        with running(worker):
            await produce(settings, catalog.name(EVENTS), events)
            first_outputs = await wait_for_records(
                settings, catalog.name(OUTPUT), lambda rs: len(by_id(rs)) == total, timeout_s=90
            )
        first_intents = await read_to_end(settings, catalog.name(INTENTS))
        llm_calls_before = Path(ledgers["LLM_LEDGER"]).read_text().count("\n")

        await rewind_group(settings, [catalog.name(EVENTS), catalog.name(RESULTS)])
        port = free_port()
        replay = KeylaneProcess(agent, {**env, "KEYLANE_METRICS_PORT": str(port)}, tmp_path / "replay.log")
        with running(replay):
            replayed_inputs = 2 * total  # every event and every result again
            deadline_checks = 0
            while await metric(port, "keylane_redeliveries_total") < replayed_inputs:
                deadline_checks += 1
                assert deadline_checks < 120, replay.tail()
                await asyncio.sleep(0.5)
            assert await metric(port, "keylane_activations_total") == 0
        outputs = await read_to_end(settings, catalog.name(OUTPUT))
        intents = await read_to_end(settings, catalog.name(INTENTS))

    assert Path(ledgers["LLM_LEDGER"]).read_text().count("\n") == llm_calls_before, "no extra model calls"
    assert set(by_id(intents)) == set(by_id(first_intents)), "identical intent ids, no new ones"
    assert all(len(values) == 1 for values in by_id(intents).values())
    first, after = by_id(first_outputs), by_id(outputs)
    assert set(after) == set(first), "no output lost, none added"
    assert all(len(values) == 1 for values in after.values()), "a republished output is byte-identical"
    seqs = sorted(json.loads(next(iter(v)))["seq"] for v in after.values())
    assert seqs == sorted(2 * i for i in range(EVENTS_PER_KEY) for _ in KEYS), (
        "seq unchanged: 0, 2, 4, 6 per key"
    )
    assert len(Path(ledgers["TOOL_LEDGER"]).read_text().splitlines()) == total, "each intent executed once"


async def test_rewound_effector_republishes_results_and_runs_no_tool_again(
    settings: Settings, catalog: Catalog, tmp_path: Path
) -> None:
    ledgers = {"LLM_LEDGER": str(tmp_path / "llm.jsonl"), "TOOL_LEDGER": str(tmp_path / "tools.jsonl")}
    env = process_env(settings, **ledgers)
    worker_port = free_port()
    worker = KeylaneProcess(
        ["worker", "--agent", "tests.agents.flow:act_then_complete"],
        {**env, "KEYLANE_METRICS_PORT": str(worker_port)},
        tmp_path / "w.log",
    )
    effector_args = ["effector", "--tools", "tests.agents.flow"]
    events = [(k, encode(AgentEnvelope(payload=f"{k.decode()}-e0"))) for k in KEYS]

    with running(worker):
        with running(KeylaneProcess(effector_args, env, tmp_path / "e1.log")):
            await produce(settings, catalog.name(EVENTS), events)
            await wait_for_records(
                settings, catalog.name(OUTPUT), lambda rs: len(rs) == len(KEYS), timeout_s=90
            )
        first_results = by_id(await read_to_end(settings, catalog.name(RESULTS)))

        effector_group = settings.with_overrides(app_id=f"{settings.app_id}-effector")
        await rewind_group(effector_group, [catalog.name(INTENTS)])
        with running(KeylaneProcess(effector_args, env, tmp_path / "e2.log")):
            results = await wait_for_records(
                settings, catalog.name(RESULTS), lambda rs: len(rs) == 2 * len(KEYS), timeout_s=90
            )
        # The worker sees the republished results: each answers an intent that already resumed
        # its key, so it is acknowledged and counted, not dead-lettered.
        for _ in range(120):
            if await metric(worker_port, "keylane_unawaited_results_total") >= len(KEYS):
                break
            await asyncio.sleep(0.5)
        assert await metric(worker_port, "keylane_unawaited_results_total") == len(KEYS), worker.tail()
        outputs = await read_to_end(settings, catalog.name(OUTPUT))
        errors = await read_to_end(settings, catalog.name(ERRORS))

    assert len(Path(ledgers["TOOL_LEDGER"]).read_text().splitlines()) == len(KEYS), "no tool ran twice"
    assert by_id(results) == first_results, "Done intents republish the stored result, byte for byte"
    assert len(outputs) == len(KEYS), "a republished result resumes nothing: no second output"
    assert [decode(r.value, ErrorRecord).reason for r in errors] == [], "a repeat is not an error"
