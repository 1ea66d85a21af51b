"""A table restore that loses the records it fetched is read again, and the worker comes up
with every key's memory (service/keylane/kafka/restore_watch.py).

A worker counts events per key in memory and is killed (kill -9). A second worker, on an empty volume,
restores the table from the changelog, and the records of each partition's first fetch
never reach its restore (tests/agents/restore_drop.py: what Faust's fetch loop does to a
batch that returns while its flow is stopped). Without the re-read the second worker waits
in its restore for good, as a CI run once saw after a kill -9 with no standby copies; with
it, every key's next event counts 2.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from keylane.catalog import EVENTS, OUTPUT, Catalog
from keylane.config import Settings
from keylane.kafka.topic_reader import read_to_end
from keylane.wire import AgentEnvelope, encode
from tests.agents.restore_drop import RESTORE_DROP_LINE
from tests.kafka_io import produce
from tests.processes import KeylaneProcess, process_env, running

pytestmark = pytest.mark.kafka

KEYS = [f"restored-{i}".encode() for i in range(24)]
AGENT = "tests.agents.restore_drop:agent"
RESTORE_REREAD_LINE = "the table restore applied nothing"


async def counts_by_key(
    settings: Settings, catalog: Catalog, total: int, timeout_s: float
) -> dict[bytes, set[bytes]]:
    """Every output value per key, once ``total`` outputs are there."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        records = await read_to_end(settings, catalog.name(OUTPUT))
        if len(records) >= total:
            found: dict[bytes, set[bytes]] = {}
            for record in records:
                assert record.key is not None and record.value is not None
                found.setdefault(record.key, set()).add(record.value)
            return found
        assert asyncio.get_running_loop().time() < deadline, f"only {len(records)} of {total} outputs"
        await asyncio.sleep(0.5)


@pytest.mark.timeout(240)
async def test_a_restore_that_lost_its_fetched_records_reads_them_again(
    settings: Settings, catalog: Catalog, tmp_path: Path
) -> None:
    event = encode(AgentEnvelope(payload="count"))
    first = KeylaneProcess(
        ["worker", "--agent", AGENT],
        process_env(settings, KEYLANE_DATA_DIR=str(tmp_path / "first")),
        tmp_path / "first.log",
    )
    with running(first):
        await produce(settings, catalog.name(EVENTS), [(key, event) for key in KEYS])
        counted = await counts_by_key(settings, catalog, len(KEYS), timeout_s=90)
        first.kill9()
    assert counted == {key: {b"1"} for key in KEYS}

    second = KeylaneProcess(
        ["worker", "--agent", AGENT],
        process_env(settings, KEYLANE_DATA_DIR=str(tmp_path / "second")),
        tmp_path / "second.log",
    )
    with running(second):
        await produce(settings, catalog.name(EVENTS), [(key, event) for key in KEYS])
        counted = await counts_by_key(settings, catalog, 2 * len(KEYS), timeout_s=150)
        second.stop()
    log_text = (tmp_path / "second.log").read_text()
    assert RESTORE_DROP_LINE in log_text, "the fault never happened: the test proves nothing"
    assert RESTORE_REREAD_LINE in log_text
    assert counted == {key: {b"1", b"2"} for key in KEYS}, "a key's memory went missing in the restore"
