"""The effector's dedup is by intent id, whatever partition an intent arrives on: a copy on
another partition (a client with another partitioner, a dead-letter re-drive) is re-routed
to its key's partition, and the tool runs once."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from keylane import ids
from keylane.catalog import INTENTS, RESULTS, Catalog
from keylane.config import Settings
from keylane.kafka.partitioner import expected_partition
from keylane.kafka.topic_reader import read_to_end
from keylane.records import ORIGIN_HEADER
from keylane.wire import ToolIntent, ToolResult, decode, encode
from tests.kafka_io import wait_for_records
from tests.processes import KeylaneProcess, process_env, running

pytestmark = pytest.mark.kafka

KEY = b"acct-42#0"


async def produce_to(settings: Settings, topic: str, key: bytes, value: bytes, partitions: list[int]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=settings.bootstrap_list, acks="all")
    await producer.start()
    try:
        for partition in partitions:
            await producer.send_and_wait(topic, key=key, value=value, partition=partition)
    finally:
        await producer.stop()


async def test_one_intent_on_two_partitions_runs_once_and_both_answers_carry_its_result(
    settings: Settings, catalog: Catalog, tmp_path: Path
) -> None:
    ledger = tmp_path / "tools.jsonl"
    env = process_env(settings, TOOL_LEDGER=str(ledger))
    partitions = catalog[INTENTS].partitions
    home = expected_partition(KEY, partitions)
    elsewhere = (home + 1) % partitions
    now = time.time_ns() // 1_000_000
    intent = ToolIntent(
        intent_id=ids.intent_id(KEY, 0, 0),
        entity_key=KEY.decode(),
        seq=0,
        step_index=0,
        tool="record_event",
        args_json=json.dumps({"key": KEY.decode(), "event": "routed"}),
        created_at_ms=now,
        expires_at_ms=now + 600_000,
    )

    with running(KeylaneProcess(["effector", "--tools", "tests.agents.flow"], env, tmp_path / "e.log")):
        await produce_to(settings, catalog.name(INTENTS), KEY, encode(intent), [elsewhere, home])
        results = await wait_for_records(
            settings, catalog.name(RESULTS), lambda rs: len(rs) >= 2, timeout_s=60
        )
        intents = await read_to_end(settings, catalog.name(INTENTS))

    assert ledger.read_text().splitlines() == ['{"event": "routed", "key": "acct-42#0"}'], "ran once"
    assert [r.record_id for r in results] == [intent.intent_id] * 2
    first, second = (r.value for r in results)
    assert first == second, "the second answer is the stored result, byte for byte"
    assert first is not None and decode(first, ToolResult).status == "OK"
    [copy] = [r for r in intents if ORIGIN_HEADER in r.headers]
    assert copy.partition == home and copy.value == encode(intent)
    assert copy.headers[ORIGIN_HEADER] == f"{catalog.name(INTENTS)}/{elsewhere}/0".encode()
