"""kill -9 of the worker at seeded points while an agent changes memory values in place
without writing them (tests/agents/in_place.py), and some of its activations fail after the
change, on keys with inline and with paged memory.

Only a write changes memory (docs/runtime.md, *Memory*): every activation finds the value
its key last wrote, whether the worker that runs it is the one that ran the key's earlier
activations (with the key's state kept in memory) or one restarted since (reading it back
from its store or the changelog). Before values crossed as copies, an inline key committed
the change with its next activation and a paged key kept it in the worker only, so what a
key found depended on when the worker last restarted.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from keylane.catalog import ERRORS, EVENTS, Catalog
from keylane.config import Settings
from keylane.kafka.topic_reader import read_to_end
from keylane.wire import AgentEnvelope, ErrorRecord, decode, encode
from tests.integration.stream_checks import outputs_by_id
from tests.kafka_io import produce
from tests.processes import KeylaneProcess, process_env, running

pytestmark = pytest.mark.kafka

INLINE = [f"inline-{i}".encode() for i in range(4)]
PAGED = [f"paged-{i}".encode() for i in range(4)]
COMMANDS = ["change", "fail", "change", "change", "fail", "change"] * 3
SEED = 17


@pytest.mark.timeout(300)
async def test_a_value_changed_in_place_never_becomes_memory_through_kill_9_and_failures(
    settings: Settings, catalog: Catalog, tmp_path: Path
) -> None:
    rng = random.Random(SEED)
    fills = {**{key: "fill:1" for key in INLINE}, **{key: "fill:24" for key in PAGED}}
    events = [(key, fill) for key, fill in fills.items()] + [
        (key, command) for command in COMMANDS for key in fills
    ]
    records = [(key, encode(AgentEnvelope(payload=payload))) for key, payload in events]
    outputs_expected = sum(1 for _, payload in events if payload != "fail")
    kills = sorted(rng.sample(range(outputs_expected // 5, outputs_expected - outputs_expected // 5), 3))
    env = process_env(settings)
    worker = KeylaneProcess(
        ["worker", "--agent", "tests.agents.in_place:agent"], env, tmp_path / "worker.log"
    )

    with running(worker):
        await produce(settings, catalog.name(EVENTS), records)
        for after in kills:
            await outputs_by_id(settings, catalog, after, timeout_s=120, poll_s=0.2)
            worker.kill9()
            worker.start()
        outputs = await outputs_by_id(settings, catalog, outputs_expected, timeout_s=180)
        worker.stop()

    found = {value for values in outputs.values() for value in values}
    assert found == {b'["written"]'}, "an activation found a change that no write made"
    errors = [decode(r.value, ErrorRecord) for r in await read_to_end(settings, catalog.name(ERRORS))]
    failed = {(e.entity_key, e.reason) for e in errors}
    assert failed == {(key.decode(), "activation_error") for key in fills}
