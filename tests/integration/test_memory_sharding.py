"""Memory-free vs memory-carrying: the same four events for one logical key build one ring
without sharding, and two disjoint rings behind ShardKeys(2). Pinned as behaviour."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from keylane.catalog import EVENTS, OUTPUT, Catalog
from keylane.config import Settings
from keylane.keys import shard_index
from keylane.wire import AgentEnvelope, encode
from tests.kafka_io import produce, wait_for_records
from tests.processes import KeylaneProcess, process_env, running

pytestmark = pytest.mark.kafka

KEY = b"customer-7"
VALUES = [encode(AgentEnvelope(payload=f"message-{i}")) for i in range(4)]


def final_rings(records: list[object]) -> dict[str, list[str]]:
    """The last ring each physical key reported."""
    rings: dict[str, list[str]] = {}
    for record in records:
        output = json.loads(record.value)  # type: ignore[attr-defined]
        if len(output["ring"]) >= len(rings.get(output["key"], [])):
            rings[output["key"]] = output["ring"]
    return rings


@pytest.mark.parametrize(("config", "expected_rings"), [("config", 1), ("sharded2", 2)])
async def test_same_events_one_ring_unsharded_two_disjoint_rings_sharded(
    settings: Settings, catalog: Catalog, tmp_path: Path, config: str, expected_rings: int
) -> None:
    assert len({shard_index(v, 2) for v in VALUES}) == 2, "the four events must reach both shards"
    env = process_env(settings, LLM_LEDGER=str(tmp_path / "llm.jsonl"))
    worker = KeylaneProcess(
        ["worker", "--agent", "tests.agents.flow:remember", "--config", f"tests.agents.flow:{config}"],
        env,
        tmp_path / "worker.log",
    )
    with running(worker):
        await produce(settings, catalog.name(EVENTS), [(KEY, v) for v in VALUES])
        outputs = await wait_for_records(
            settings, catalog.name(OUTPUT), lambda rs: len(rs) >= 4, timeout_s=90
        )

    rings = final_rings(outputs)
    events = [f"message-{i}" for i in range(4)]
    assert len(rings) == expected_rings
    if expected_rings == 1:
        assert rings == {"customer-7": events}
    else:
        assert set(rings) == {"customer-7#0", "customer-7#1"}
        first, second = rings.values()
        assert not set(first) & set(second), "each shard remembers only its own events"
        assert sorted(first + second) == events
        for ring in rings.values():
            assert ring == [e for e in events if e in ring], "each ring keeps arrival order"
