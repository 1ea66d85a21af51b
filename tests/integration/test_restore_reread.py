"""A table restore that loses records it fetched is read again, and the worker comes up with
every key's memory (service/keylane/kafka/restore_watch.py).

A worker counts events per key in memory and stops (a clean stop: after a kill -9 the second
worker would run the inputs the first had not committed again, and their activations would
write back what a lossy restore lost). A second worker, on an empty volume, restores the
table from the changelog, and the records of each partition's first fetch never reach its
restore (tests/integration/drop_restore_probe.py):

* dropped the way Faust's fetch loop drops a batch that returns while its flow is stopped
  (then it seeks to committed), in fetches of 5 records: without the seek back of the restore's
  partitions, the restore applied the later records and completed without the keys whose
  last record was in the first batch, which counted from 1 again;
* dropped with no seek at all: without the stall check, the restore waited for good, as a CI
  run once saw after a kill -9 with no standby copies.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from keylane.catalog import EVENTS, OUTPUT, Catalog
from keylane.config import Settings
from keylane.kafka.topic_reader import read_to_end
from keylane.wire import AgentEnvelope, encode
from tests.integration.drop_restore_probe import RESTORE_DROP_LINE
from tests.kafka_io import produce
from tests.processes import KeylaneProcess, process_env, running

pytestmark = pytest.mark.kafka

KEYS = [f"restored-{i}".encode() for i in range(24)]
BUSY = KEYS[:6]
BUSY_EVENTS = 12
AGENT = "tests.agents.tally:agent"
RESTORE_REREAD_LINE = "the table restore applied nothing"
RESTORE_POSITIONED_LINE = "table restore partitions again, at the offsets they applied"


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


async def run_restore(
    settings: Settings, catalog: Catalog, tmp_path: Path, **fault: str
) -> tuple[dict[bytes, set[bytes]], str]:
    """Count every key once and the BUSY keys BUSY_EVENTS more times on a first worker, stop it,
    count every key once more on a second worker on an empty volume whose restore loses each
    partition's first fetch (``fault``: its environment); every key's counts, and the second
    worker's log."""
    event = encode(AgentEnvelope(payload="count"))
    first_events = [(key, event) for key in KEYS] + [(key, event) for _ in range(BUSY_EVENTS) for key in BUSY]
    first = KeylaneProcess(
        ["worker", "--agent", AGENT],
        process_env(settings, KEYLANE_DATA_DIR=str(tmp_path / "first")),
        tmp_path / "first.log",
    )
    with running(first):
        await produce(settings, catalog.name(EVENTS), first_events)
        await counts_by_key(settings, catalog, len(first_events), timeout_s=90)
        first.stop()

    second = KeylaneProcess(
        ["worker", "--agent", AGENT],
        process_env(settings, KEYLANE_DATA_DIR=str(tmp_path / "second"), **fault),
        tmp_path / "second.log",
        module="tests.integration.drop_restore_probe",
    )
    with running(second):
        await produce(settings, catalog.name(EVENTS), [(key, event) for key in KEYS])
        counted = await counts_by_key(settings, catalog, len(first_events) + len(KEYS), timeout_s=150)
        second.stop()
    log_text = (tmp_path / "second.log").read_text()
    assert RESTORE_DROP_LINE in log_text, "the fault never happened: the test proves nothing"
    return counted, log_text


def expected_counts() -> dict[bytes, set[bytes]]:
    last = {key: BUSY_EVENTS + 1 if key in BUSY else 1 for key in KEYS}
    return {key: {str(n).encode() for n in range(1, last[key] + 2)} for key in KEYS}


@pytest.mark.timeout(240)
async def test_a_restore_batch_dropped_as_faust_drops_one_is_read_again_at_once(
    settings: Settings, catalog: Catalog, tmp_path: Path
) -> None:
    counted, log_text = await run_restore(
        settings, catalog, tmp_path, RESTORE_DROP_SEEKS="1", BROKER_MAX_POLL_RECORDS="5"
    )
    assert counted == expected_counts(), "a key's memory went missing in the restore"
    assert RESTORE_POSITIONED_LINE in log_text
    assert RESTORE_REREAD_LINE not in log_text, "read again only by the stall check, 15 s late"


@pytest.mark.timeout(240)
async def test_a_restore_that_lost_its_fetched_records_reads_them_again(
    settings: Settings, catalog: Catalog, tmp_path: Path
) -> None:
    counted, log_text = await run_restore(settings, catalog, tmp_path)
    assert counted == expected_counts(), "a key's memory went missing in the restore"
    assert RESTORE_REREAD_LINE in log_text
