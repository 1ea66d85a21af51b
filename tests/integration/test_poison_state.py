"""A key whose stored state does not read (a blob from a newer keylane, after a rollback) is
quarantined: its inputs are dead-lettered as ``poison_state``, every other key of its partition
goes on, and no worker crash-loops, through a restore and a partition move.

The newer blob is written the way a newer keylane would leave it: as the key's last record on
the state changelog, which the next worker restores from (its volume lost).
"""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path

import msgspec
import pytest

from bench.lanes import keys_on_partition
from keylane.catalog import ERRORS, EVENTS, OUTPUT, Catalog
from keylane.config import Settings
from keylane.kafka.topic_reader import TopicRecord, read_to_end
from keylane.stages.agent import STATE_TABLE
from keylane.testing.processes import free_port
from keylane.wire import AgentEnvelope, ErrorRecord, decode, encode
from tests.integration.test_redelivery import by_id, metric
from tests.integration.test_resume_position import commits_reach_the_end
from tests.kafka_io import produce, wait_for_records
from tests.processes import KeylaneProcess, process_env, running

pytestmark = pytest.mark.kafka

AGENT = ["worker", "--agent", "tests.agents.flow:remember"]


def event(key: bytes, n: int) -> tuple[bytes, bytes]:
    return key, encode(AgentEnvelope(payload=f"{key.decode()}-e{n}"))


def outputs_of(records: list[TopicRecord], key: bytes) -> set[str]:
    return {json.loads(r.value or b"")["event"] for r in records if r.key == key}


def poison_letters(records: list[TopicRecord]) -> list[ErrorRecord]:
    errors = [decode(r.value, ErrorRecord) for r in records]
    return [e for e in errors if e.reason == "poison_state"]


@pytest.mark.timeout(420)
async def test_a_newer_keylanes_blob_quarantines_its_key_and_the_partition_goes_on(
    settings: Settings, catalog: Catalog, tmp_path: Path
) -> None:
    partitions = catalog[EVENTS].partitions
    poisoned, *good = keys_on_partition(0, partitions, 3)  # one lane feed and one restore
    env = process_env(settings, LLM_LEDGER=str(tmp_path / "llm.jsonl"))
    volume = tmp_path / "volume"
    first = KeylaneProcess(AGENT, {**env, "KEYLANE_DATA_DIR": str(volume)}, tmp_path / "first.log")
    with running(first):  # every key gets a state record on the changelog
        await produce(settings, catalog.name(EVENTS), [event(k, 0) for k in (poisoned, *good)])
        await wait_for_records(settings, catalog.name(OUTPUT), lambda rs: len(by_id(rs)) == 3)
        await commits_reach_the_end(settings, catalog)

    # A newer keylane (schema version 99) wrote the poisoned key's last state, as the owner of
    # its partition then (an owner epoch past the last one); then it was rolled back, and
    # this keylane's worker restores that partition from the changelog.
    changelog = f"{settings.app_id}-{STATE_TABLE}-changelog"
    [last] = [r for r in await read_to_end(settings, changelog) if r.key == poisoned]
    epoch = msgspec.msgpack.decode(last.value or b"")["epoch"] + 1
    future = msgspec.msgpack.encode(
        {"state_schema_version": 99, "seq": 7, "epoch": epoch, "fields_we_do_not_know": [1]}
    )
    await produce(settings, changelog, [(poisoned, future)])
    shutil.rmtree(volume)

    port_a, port_b = free_port(), free_port()
    worker_a = KeylaneProcess(
        AGENT,
        {**env, "KEYLANE_DATA_DIR": str(volume), "KEYLANE_METRICS_PORT": str(port_a)},
        tmp_path / "a.log",
    )
    worker_b = KeylaneProcess(
        AGENT,
        {**env, "KEYLANE_DATA_DIR": str(tmp_path / "volume-b"), "KEYLANE_METRICS_PORT": str(port_b)},
        tmp_path / "b.log",
    )
    with running(worker_a):
        await produce(settings, catalog.name(EVENTS), [event(k, 1) for k in (poisoned, *good)])
        outputs = await wait_for_records(
            settings,
            catalog.name(OUTPUT),
            lambda rs: all(f"{k.decode()}-e1" in outputs_of(rs, k) for k in good),
        )
        errors = await wait_for_records(
            settings, catalog.name(ERRORS), lambda rs: len(poison_letters(rs)) == 1
        )
        assert await metric(port_a, "keylane_quarantined_keys") == 1

        # The partition moves to a worker that restores it from the changelog: the same key
        # is quarantined there too, and nobody crashes on the rebuild.
        with running(worker_b):
            worker_a.stop()
            await produce(settings, catalog.name(EVENTS), [event(k, 2) for k in (poisoned, *good)])
            outputs = await wait_for_records(
                settings,
                catalog.name(OUTPUT),
                lambda rs: all(f"{k.decode()}-e2" in outputs_of(rs, k) for k in good),
                timeout_s=120,
            )
            errors = await wait_for_records(
                settings, catalog.name(ERRORS), lambda rs: len(poison_letters(rs)) == 2, timeout_s=60
            )
            assert await metric(port_b, "keylane_quarantined_keys") == 1
            await commits_reach_the_end(settings, catalog)
            assert worker_b.running

    letters = poison_letters(errors)
    assert {e.entity_key for e in letters} == {poisoned.decode()}
    assert all("schema version 99" in e.detail and "quarantined" in e.detail for e in letters)
    raw = sorted(json.loads(base64.b64decode(e.raw_value_b64 or ""))["payload"] for e in letters)
    assert raw == [f"{poisoned.decode()}-e1", f"{poisoned.decode()}-e2"], "each input kept with its bytes"
    assert outputs_of(outputs, poisoned) == {f"{poisoned.decode()}-e0"}, "no output past the poisoned state"
    for log in (tmp_path / "a.log", tmp_path / "b.log"):
        text = log.read_text()
        assert "is quarantined" in text
        assert "Traceback" not in text, f"{log.name} logged a crash"
