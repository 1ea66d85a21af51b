"""Records the offset guard still expects, deleted by retention, do not stall their partition.

The guard's stall check probes the log from the offset it expects next
(service/keylane/kafka/offset_guard.py). When retention deleted that offset, the probe's seek
lands below the log start; a probe that reset to the log end then found nothing, so the
partition waited for new traffic, with records still waiting behind the deleted ones. Here
the worker drops everything it fetches from the event topic until the test releases it
(tests/integration/hold_fetch_probe.py), so the guard still expects each partition's first
record when the test deletes the first records of every partition. With no further traffic,
each partition must go on from the first record that still exists: those are processed once,
the deleted ones never, and the commits reach the log end.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from aiokafka import TopicPartition
from aiokafka.admin import RecordsToDelete

from keylane.catalog import EVENTS, OUTPUT, Catalog
from keylane.config import Settings
from keylane.kafka.offset_guard import STALL_CHECK_S, STALL_REREAD_AFTER_S
from keylane.kafka.topic_admin import admin_client
from keylane.wire import AgentEnvelope, encode
from tests.integration.test_redelivery import by_id
from tests.integration.test_resume_position import commits_reach_the_end
from tests.kafka_io import one_key_per_partition, produce, wait_for_records
from tests.processes import KeylaneProcess, process_env, running

pytestmark = pytest.mark.kafka

PER_PARTITION = 4
DELETED = 2
"""Each partition's first DELETED records are deleted while the guard still expects the first."""


def held_offsets(log: Path) -> dict[int, set[int]]:
    """The offsets the worker fetched and dropped, by partition."""
    held: dict[int, set[int]] = {}
    for line in log.read_text().splitlines() if log.exists() else []:
        where, offset = line.split()
        held.setdefault(int(where.rsplit("/", 1)[1]), set()).add(int(offset))
    return held


@pytest.mark.timeout(300)
async def test_the_guard_goes_on_from_the_first_record_left_after_retention(
    settings: Settings, catalog: Catalog, tmp_path: Path
) -> None:
    held, release = tmp_path / "held.log", tmp_path / "release"
    env = process_env(
        settings,
        LLM_LEDGER=str(tmp_path / "llm.jsonl"),
        HOLD_FETCHED_TOPIC=catalog.name(EVENTS),
        HOLD_FETCHED_LOG=str(held),
        HOLD_RELEASE=str(release),
    )
    worker = KeylaneProcess(
        ["worker", "--agent", "tests.agents.flow:remember"],
        env,
        tmp_path / "worker.log",
        module="tests.integration.hold_fetch_probe",
    )
    partitions = catalog[EVENTS].partitions
    keys = one_key_per_partition(partitions, "gone-{}")
    topic = catalog.name(EVENTS)
    with running(worker):
        # One produce per round: each partition's n-th record is event n of its key.
        for n in range(PER_PARTITION):
            await produce(
                settings, topic, [(k, encode(AgentEnvelope(payload=f"{k.decode()}-{n}"))) for k in keys]
            )
        every = set(range(PER_PARTITION))
        deadline = time.monotonic() + 60
        while any(held_offsets(held).get(p, set()) != every for p in range(partitions)):
            worker.check()
            assert time.monotonic() < deadline, f"the worker never fetched every record: {held_offsets(held)}"
            await asyncio.sleep(0.2)

        async with admin_client(settings) as client:
            await client.delete_records(
                {TopicPartition(topic, p): RecordsToDelete(DELETED) for p in range(partitions)}
            )
        release.touch()
        records = await wait_for_records(
            settings,
            catalog.name(OUTPUT),
            lambda rs: len(by_id(rs)) >= len(keys) * (PER_PARTITION - DELETED),
            timeout_s=STALL_REREAD_AFTER_S + 2 * STALL_CHECK_S + 60,
        )
        await commits_reach_the_end(settings, catalog)
        worker.check()

    outputs = by_id(records)
    assert all(len(values) == 1 for values in outputs.values()), "each event ran once"
    events = sorted(json.loads(next(iter(values)))["event"] for values in outputs.values())
    survivors = sorted(f"{k.decode()}-{n}" for k in keys for n in range(DELETED, PER_PARTITION))
    assert events == survivors, "the records left after retention ran, the deleted ones never"
