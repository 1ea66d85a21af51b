"""A record Faust fetched and then dropped is read again, with no later record to reveal the gap.

Faust drops fetched records on paths of its own (a fetch batch cut short by a rebalance, a
stream queue cleared on revocation) after the consumer's position has passed them. The
offset guard's gap check sees that only when a later record of the partition arrives; a key
with no further traffic would wait for good. Here the worker loses the first record fetched
from each event partition (tests/integration/drop_fetch_probe.py) and each partition gets
exactly one: the guard's stall check must notice the waiting records and read them again.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from keylane.catalog import EVENTS, OUTPUT, Catalog
from keylane.config import Settings
from keylane.kafka.offset_guard import STALL_CHECK_S, STALL_REREAD_AFTER_S
from keylane.testing.processes import free_port
from keylane.wire import AgentEnvelope, encode
from tests.integration.test_redelivery import by_id, metric
from tests.integration.test_resume_position import commits_reach_the_end
from tests.kafka_io import one_key_per_partition, produce, wait_for_records
from tests.processes import KeylaneProcess, process_env, running

pytestmark = pytest.mark.kafka


@pytest.mark.timeout(240)
async def test_a_dropped_record_is_read_again_when_nothing_follows_it(
    settings: Settings, catalog: Catalog, tmp_path: Path
) -> None:
    port = free_port()
    dropped = tmp_path / "dropped.log"
    env = process_env(
        settings,
        LLM_LEDGER=str(tmp_path / "llm.jsonl"),
        KEYLANE_METRICS_PORT=str(port),
        DROP_FETCHED_TOPIC=catalog.name(EVENTS),
        DROP_FETCHED_LOG=str(dropped),
    )
    worker = KeylaneProcess(
        ["worker", "--agent", "tests.agents.flow:remember"],
        env,
        tmp_path / "worker.log",
        module="tests.integration.drop_fetch_probe",
    )
    keys = one_key_per_partition(catalog[EVENTS].partitions, "quiet-{}")
    with running(worker):
        await produce(
            settings, catalog.name(EVENTS), [(k, encode(AgentEnvelope(payload=k.decode()))) for k in keys]
        )
        records = await wait_for_records(
            settings,
            catalog.name(OUTPUT),
            lambda rs: len(by_id(rs)) == len(keys),
            timeout_s=STALL_REREAD_AFTER_S + 2 * STALL_CHECK_S + 60,
        )
        await commits_reach_the_end(settings, catalog)
        rereads = await metric(port, "keylane_stall_rereads_total")

    lost = dropped.read_text().splitlines()
    assert len(lost) == len(keys), f"the probe dropped each partition's one record: {lost}"
    assert all(len(values) == 1 for values in by_id(records).values()), "each event ran once"
    assert rereads >= len(keys), f"each partition was read again after its stall: {rereads}"
    assert "re-reading from there" in worker.log()
