"""A copy keylane makes again is a redelivery, not a new event.

kcat (librdkafka's default partitioner) puts most keys on another partition than Kafka's
murmur2, so the worker re-produces those events to their key's partition; with shards=4,
ShardKeys copies every event to agent.events.sharded. Rewinding the worker's group makes it
copy every event a second time, at new offsets, exactly as a crash or a rebalance between the
produce and the commit does. Each event must still run its side effect once and end in one
output, with no error. On the runtime that recognised repeats by offset, every second copy
ran as a new event (a new seq, a new intent id, a second tool run).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from keylane.catalog import ERRORS, EVENTS, EVENTS_SHARDED, OUTPUT, RESULTS, Catalog
from keylane.config import Settings
from keylane.kafka.partitioner import expected_partition
from keylane.kafka.topic_reader import read_to_end
from keylane.testing.processes import free_port
from keylane.wire import AgentEnvelope, encode
from tests.integration.stream_checks import tool_runs
from tests.integration.test_redelivery import by_id, metric, rewind_group
from tests.kafka_io import kcat_produce, wait_for_records
from tests.processes import KeylaneProcess, process_env, running

pytestmark = pytest.mark.kafka

KEYS = [f"lib-{i}".encode() for i in range(12)]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("shards", [None, 4], ids=["rerouted", "sharded"])
async def test_a_second_copy_of_every_event_runs_nothing(
    settings: Settings, catalog: Catalog, tmp_path: Path, shards: int | None
) -> None:
    ledger = tmp_path / "tools.jsonl"
    env = process_env(settings, LLM_LEDGER=str(tmp_path / "llm.jsonl"), TOOL_LEDGER=str(ledger))
    agent = ["worker", "--agent", "tests.agents.flow:act_then_complete"]
    if shards is not None:
        agent += ["--config", f"tests.agents.flow:sharded{shards}"]
    effector = KeylaneProcess(["effector", "--tools", "tests.agents.flow"], env, tmp_path / "effector.log")
    lines = b"".join(k + b"|" + encode(AgentEnvelope(payload=f"{k.decode()}-e0")) + b"\n" for k in KEYS)
    total = len(KEYS)

    with running(effector):
        with running(KeylaneProcess(agent, env, tmp_path / "w1.log")):
            kcat_produce(settings, catalog.name(EVENTS), lines)
            first = await wait_for_records(
                settings, catalog.name(OUTPUT), lambda rs: len(by_id(rs)) == total, timeout_s=90
            )
        originals = await read_to_end(settings, catalog.name(EVENTS))
        partitions = catalog[EVENTS].partitions
        misplaced = [r for r in originals if expected_partition(r.key or b"", partitions) != r.partition]
        if shards is None:
            assert len(misplaced) >= total // 2, "kcat's partitioner put most keys off their partition"

        rewound = [catalog.name(EVENTS)] + ([] if shards is None else [catalog.name(EVENTS_SHARDED)])
        await rewind_group(settings, [*rewound, catalog.name(RESULTS)])
        port = free_port()
        replay = KeylaneProcess(agent, {**env, "KEYLANE_METRICS_PORT": str(port)}, tmp_path / "w2.log")
        with running(replay):
            # Every input is read again: originals, the first run's copies, this run's new
            # copies, and the results. Each must be recognised; none may activate.
            copied = len(misplaced) if shards is None else total  # copies per run
            expected = (total - copied) + 2 * copied + total
            deadline = asyncio.get_running_loop().time() + 120
            while await metric(port, "keylane_redeliveries_total") < expected:
                assert asyncio.get_running_loop().time() < deadline, replay.tail()
                await asyncio.sleep(0.5)
            assert await metric(port, "keylane_activations_total") == 0, replay.tail()
        outputs = by_id(await read_to_end(settings, catalog.name(OUTPUT)))
        errors = await read_to_end(settings, catalog.name(ERRORS))

    assert tool_runs(ledger) == total, "each event's side effect ran once"
    assert set(outputs) == set(by_id(first)), "no new output ids"
    assert all(len(values) == 1 for values in outputs.values())
    events = sorted(json.loads(next(iter(v)))["event"] for v in outputs.values())
    assert events == sorted(f"{k.decode()}-e0" for k in KEYS)
    assert errors == [], [r.value for r in errors]
