"""Intent -> effector -> result -> resume across processes, behind ShardKeys(4): the physical
key rides on the intent, the result comes back under it and resumes that shard."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from keylane.catalog import EVENTS, EVENTS_SHARDED, INTENTS, OUTPUT, RESULTS, Catalog
from keylane.config import Settings
from keylane.kafka.topic_reader import read_to_end
from keylane.keys import shard_key, unshard_key
from keylane.wire import AgentEnvelope, ToolIntent, ToolResult, decode, encode
from tests.kafka_io import produce, wait_for_records
from tests.processes import KeylaneProcess, process_env, running

pytestmark = pytest.mark.kafka

HOT = b"hot-account"


async def test_results_return_to_the_shard_that_emitted_the_intent(
    settings: Settings, catalog: Catalog, tmp_path: Path
) -> None:
    env = process_env(
        settings, LLM_LEDGER=str(tmp_path / "llm.jsonl"), TOOL_LEDGER=str(tmp_path / "tools.jsonl")
    )
    worker = KeylaneProcess(
        [
            "worker",
            "--agent",
            "tests.agents.flow:act_then_complete",
            "--config",
            "tests.agents.flow:sharded4",
        ],
        env,
        tmp_path / "worker.log",
    )
    effector = KeylaneProcess(["effector", "--tools", "tests.agents.flow"], env, tmp_path / "effector.log")
    values = [encode(AgentEnvelope(payload=f"order-{i}")) for i in range(12)]

    with running(effector, worker):
        await produce(settings, catalog.name(EVENTS), [(HOT, v) for v in values])
        outputs = await wait_for_records(
            settings, catalog.name(OUTPUT), lambda rs: len(rs) >= 12, timeout_s=90
        )
    intents = [decode(r.value, ToolIntent) for r in await read_to_end(settings, catalog.name(INTENTS))]
    results = await read_to_end(settings, catalog.name(RESULTS))
    sharded = await read_to_end(settings, catalog.name(EVENTS_SHARDED))

    expected_key = {f"order-{i}": shard_key(HOT, 4, payload=v) for i, v in enumerate(values)}
    for record in sharded:
        envelope = decode(record.value, AgentEnvelope)
        assert envelope.entity_key is not None and envelope.entity_key.encode() == record.key
    intent_key = {json.loads(i.args_json)["event"]: i.entity_key.encode() for i in intents}
    assert intent_key == expected_key, "each intent carries the physical key of its event's shard"
    for record in results:
        result = decode(record.value, ToolResult)
        assert record.key == result.entity_key.encode() and result.status == "OK"
    assert {r.key for r in results} == set(expected_key.values())
    for record in outputs:
        output = json.loads(record.value or b"")
        assert record.key == expected_key[output["event"]] == output["key"].encode()
        assert unshard_key(record.key) == HOT
    assert len({r.key for r in outputs}) > 1, "the hot key really fanned out"
