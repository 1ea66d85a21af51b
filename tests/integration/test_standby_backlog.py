"""A standby that starts with a backlog keeps every record of it, and the worker that takes
its partitions over runs their keys on the state their last owner left.

Worker B runs alone and writes a backlog of state records for 40 keys. Worker A joins: its
recovery (tests/integration/slow_changelog_probe.py) reads each changelog record slowly, as a
busy worker does, so when it has restored its active partitions and starts reading its
standby partitions (B's), their records wait in Faust's changelog queue while Faust ends the
recovery, resumes its flow and empties its queues. Half the keys then get one more event, so
the standby's store applies records after that backlog. B stops: A takes its partitions over
from its standby store (it held them in the previous generation, so it trusts that store's
offset). Every key then gets a last event, whose output must show every event of the key in
its memory: a backlog the standby dropped would show as keys that start over.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from keylane.catalog import EVENTS, OUTPUT, Catalog
from keylane.config import Settings
from keylane.kafka.topic_reader import TopicRecord
from keylane.wire import AgentEnvelope, encode
from tests.kafka_io import produce, wait_for_records
from tests.processes import KeylaneProcess, process_env, running

pytestmark = pytest.mark.kafka

KEYS = [f"standby-{i:02d}" for i in range(40)]
BACKLOG = 3  # events per key before the standby starts
AGENT = ["worker", "--agent", "tests.agents.flow:remember"]


def rings(records: list[TopicRecord]) -> dict[str, list[str]]:
    """Each event's ring of its key's events, as its output showed it."""
    return {output["event"]: output["ring"] for output in (json.loads(r.value or b"") for r in records)}


async def send(settings: Settings, catalog: Catalog, events: list[tuple[str, str]]) -> None:
    await produce(
        settings, catalog.name(EVENTS), [(k.encode(), encode(AgentEnvelope(payload=e))) for k, e in events]
    )


async def logged_in_turn(process: KeylaneProcess, *texts: str, timeout_s: float = 120) -> None:
    """Until ``process`` logged each of ``texts``, in this order."""
    deadline = time.monotonic() + timeout_s
    while True:
        log, at = process.log_since_start(), 0
        for text in texts:
            at = log.find(text, at)
            if at < 0:
                break
        else:
            return
        assert time.monotonic() < deadline, f"{texts} not logged in turn within {timeout_s}s"
        await asyncio.sleep(0.2)


@pytest.mark.timeout(360)
async def test_a_standby_started_with_a_backlog_hands_over_every_keys_state(
    settings: Settings, catalog: Catalog, tmp_path: Path
) -> None:
    env = process_env(settings, LLM_LEDGER=str(tmp_path / "llm.jsonl"), SLOW_CHANGELOG_S="0.05")
    outputs = catalog.name(OUTPUT)
    a = KeylaneProcess(
        AGENT,
        {**env, "KEYLANE_DATA_DIR": str(tmp_path / "volume-a")},
        tmp_path / "a.log",
        module="tests.integration.slow_changelog_probe",
    )
    b = KeylaneProcess(AGENT, {**env, "KEYLANE_DATA_DIR": str(tmp_path / "volume-b")}, tmp_path / "b.log")
    backlog = [(key, f"{key}/e{n}") for n in range(BACKLOG) for key in KEYS]
    more = [(key, f"{key}/e{BACKLOG}") for key in KEYS[::2]]
    last = [(key, f"{key}/last") for key in KEYS]
    with running(b):
        await send(settings, catalog, backlog)
        await wait_for_records(settings, outputs, lambda rs: len(rings(rs)) == len(backlog), timeout_s=120)
        with running(a):
            # A's recovery: its actives, then its standbys, whose backlog waits in the queue.
            await logged_in_turn(a, "Starting standby partitions", "Worker ready")
            await send(settings, catalog, more)
            await wait_for_records(
                settings, outputs, lambda rs: len(rings(rs)) == len(backlog) + len(more), timeout_s=120
            )
            assert b.stop() == 0
            await send(settings, catalog, last)
            seen = rings(
                await wait_for_records(
                    settings, outputs, lambda rs: all(e in rings(rs) for _, e in last), timeout_s=180
                )
            )
    started_over = {
        key: seen[f"{key}/last"]
        for key in KEYS
        if seen[f"{key}/last"][:BACKLOG] != [f"{key}/e{n}" for n in range(BACKLOG)]
    }
    assert not started_over, f"keys whose state the standby lost: {started_over}"
