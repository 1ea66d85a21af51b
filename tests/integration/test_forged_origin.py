"""A ``keylane.origin`` header set by some other producer is not believed: kcat's record that
claims to be a copy of a record it is not is dead-lettered as ``forged_origin`` (never dropped
in silence as a redelivery, never run under another record's identity), while a real copy, an
exact replay of a record under its own origin, and keylane's own re-routes of librdkafka's
partitions still count as copies of what they name."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import zlib
from pathlib import Path

import pytest

from keylane.catalog import ERRORS, EVENTS, OUTPUT, Catalog
from keylane.config import Settings
from keylane.kafka.partitioner import expected_partition
from keylane.kafka.topic_reader import TopicRecord, read_to_end
from keylane.wire import AgentEnvelope, ErrorRecord, decode, encode
from tests.integration.test_resume_position import commits_reach_the_end
from tests.kafka_io import kcat_produce, produce, wait_for_records
from tests.processes import KeylaneProcess, process_env, running

pytestmark = pytest.mark.kafka


def rerouted_key(partitions: int) -> bytes:
    """A key librdkafka's default partitioner (crc32) puts on another partition than murmur2."""
    n = 0
    while True:
        key = f"forged-{n}".encode()
        if zlib.crc32(key) % partitions != expected_partition(key, partitions):
            return key
        n += 1


def envelope(key: bytes, name: str) -> bytes:
    return encode(AgentEnvelope(payload=f"{key.decode()}-{name}"))


def kcat_with_origin(settings: Settings, topic: str, key: bytes, value: bytes, origin: str) -> None:
    kcat = shutil.which("kcat")
    assert kcat is not None, "kcat is not installed: run 'make install'"
    subprocess.run(
        [
            kcat,
            "-b",
            settings.bootstrap_servers,
            "-t",
            topic,
            "-P",
            "-K",
            "|",
            "-H",
            f"keylane.origin={origin}",
        ],
        input=key + b"|" + value + b"\n",
        check=True,
        timeout=30,
    )


def events_seen(records: list[TopicRecord], key: bytes) -> set[str]:
    return {json.loads(r.value or b"")["event"] for r in records if r.key == key}


def forged_letters(records: list[TopicRecord]) -> list[ErrorRecord]:
    return [e for e in (decode(r.value, ErrorRecord) for r in records) if e.reason == "forged_origin"]


@pytest.mark.timeout(300)
async def test_a_forged_origin_from_kcat_is_dead_lettered_and_real_copies_still_count_once(
    settings: Settings, catalog: Catalog, tmp_path: Path
) -> None:
    events = catalog.name(EVENTS)
    partitions = catalog[EVENTS].partitions
    key = rerouted_key(partitions)
    home = expected_partition(key, partitions)
    env = process_env(settings, LLM_LEDGER=str(tmp_path / "llm.jsonl"))
    worker = KeylaneProcess(["worker", "--agent", "tests.agents.flow:remember"], env, tmp_path / "worker.log")
    with running(worker):
        await produce(settings, events, [(key, envelope(key, "e0"))])
        await wait_for_records(
            settings, catalog.name(OUTPUT), lambda rs: events_seen(rs, key) == {f"{key.decode()}-e0"}
        )
        [e0] = [r for r in await read_to_end(settings, events) if r.key == key]
        assert e0.partition == home

        # Claims the key already applied (at or below its applied offset) and one past the log's end.
        below = f"{events}/{home}/{e0.offset}"
        kcat_with_origin(settings, events, key, envelope(key, "forged-below"), below)
        kcat_with_origin(
            settings, events, key, envelope(key, "forged-beyond"), f"{events}/{home}/{e0.offset + 10_000}"
        )
        # An exact replay of e0 under e0's own origin is a copy of e0: a redelivery, not an error.
        kcat_with_origin(settings, events, key, envelope(key, "e0"), below)
        # librdkafka's partitioner: keylane re-routes it, and the re-routed copy is believed.
        kcat_produce(settings, events, key + b"|" + envelope(key, "e1") + b"\n")

        errors = await wait_for_records(
            settings, catalog.name(ERRORS), lambda rs: len(forged_letters(rs)) >= 2
        )
        outputs = await wait_for_records(
            settings, catalog.name(OUTPUT), lambda rs: f"{key.decode()}-e1" in events_seen(rs, key)
        )
        await commits_reach_the_end(settings, catalog)
        errors = await read_to_end(settings, catalog.name(ERRORS))

    letters = forged_letters(errors)
    assert len(letters) == 2, [e.detail for e in letters]
    payloads = sorted(json.loads(base64.b64decode(e.raw_value_b64 or ""))["payload"] for e in letters)
    assert payloads == [f"{key.decode()}-forged-below", f"{key.decode()}-forged-beyond"]
    details = sorted(e.detail for e in letters)
    assert "its value differs from the record at" in details[0] or "its value differs" in details[1]
    assert any("no record at" in d for d in details)
    for letter in letters:  # filed under the record's own position, not the identity it claimed
        assert letter.origin is not None and letter.origin.offset != e0.offset
    assert [e.reason for e in (decode(r.value, ErrorRecord) for r in errors)] == ["forged_origin"] * 2
    assert events_seen(outputs, key) == {f"{key.decode()}-e0", f"{key.decode()}-e1"}
    assert len({r.record_id for r in outputs if r.key == key}) == 2, "e0's replay ran nothing new"
