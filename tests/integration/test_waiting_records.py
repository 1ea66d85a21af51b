"""A record already waiting on its partition when a worker starts is processed, with no later
record behind it to reveal that it went missing.

A worker that restores its tables first (a fresh volume, or a takeover) reads its input
partitions while it restores; the offset guard then seeks each to its committed offset. A
record fetched from there and delivered before the guard had recorded the partition's start
was dropped as "not assigned" and never read again: the partition stalled until some later
record exposed the gap (seen in bench/recovery.py: 170 s without an answer). The worker here
runs with every seek returning a second late (tests/integration/slow_seek_probe.py), as on a
busy machine, so the fetch always wins that race.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from keylane.catalog import EVENTS, OUTPUT, Catalog
from keylane.config import Settings
from keylane.kafka.partitioner import expected_partition
from keylane.wire import AgentEnvelope, encode
from tests.integration.test_redelivery import by_id
from tests.integration.test_resume_position import commits_reach_the_end
from tests.kafka_io import kcat_produce, produce, wait_for_records
from tests.processes import KeylaneProcess, process_env, running

pytestmark = pytest.mark.kafka

KEYS = [f"wait-{i}".encode() for i in range(12)]


def envelope(key: bytes, n: int) -> bytes:
    return encode(AgentEnvelope(payload=f"{key.decode()}-e{n}"))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("producer", ["murmur2", "kcat"])
async def test_records_waiting_at_start_are_processed_without_later_traffic(
    settings: Settings, catalog: Catalog, tmp_path: Path, producer: str
) -> None:
    env = process_env(settings, LLM_LEDGER=str(tmp_path / "llm.jsonl"))
    args = ["worker", "--agent", "tests.agents.flow:remember"]
    volume = tmp_path / "volume"
    first = KeylaneProcess(args, {**env, "KEYLANE_DATA_DIR": str(volume)}, tmp_path / "first.log")
    with running(first):  # the state changelog gets a record per key: a restart restores them
        await produce(settings, catalog.name(EVENTS), [(key, envelope(key, 0)) for key in KEYS])
        await wait_for_records(settings, catalog.name(OUTPUT), lambda rs: len(by_id(rs)) == len(KEYS))
        await commits_reach_the_end(settings, catalog)

    shutil.rmtree(volume)  # the volume is lost: the next worker restores every partition
    waiting = [(key, envelope(key, 1)) for key in KEYS]
    if producer == "kcat":  # librdkafka's partitioner: some keys land off their murmur2 partition
        kcat_produce(settings, catalog.name(EVENTS), b"".join(k + b"|" + v + b"\n" for k, v in waiting))
    else:
        await produce(settings, catalog.name(EVENTS), waiting)
    partitions = {expected_partition(key, catalog[EVENTS].partitions) for key in KEYS}
    assert len(partitions) > 1, "the keys spread over several partitions"

    second = KeylaneProcess(
        args,
        {**env, "KEYLANE_DATA_DIR": str(volume)},
        tmp_path / "second.log",
        module="tests.integration.slow_seek_probe",
    )
    with running(second):
        await wait_for_records(
            settings, catalog.name(OUTPUT), lambda rs: len(by_id(rs)) == 2 * len(KEYS), timeout_s=90
        )
        await commits_reach_the_end(settings, catalog)
