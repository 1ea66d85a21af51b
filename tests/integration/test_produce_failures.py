"""Records keylane cannot produce, against a real broker: a record too large for its topic
becomes a dead letter that fits, and a record the broker refuses after the hand-off crashes
the worker with its input uncommitted, so a restart produces it after all."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import time
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from keylane import ActivationContext, AgentConfig, Complete
from keylane.catalog import ERRORS, EVENTS, OUTPUT, Catalog
from keylane.config import Settings
from keylane.kafka.partitioner import expected_partition
from keylane.kafka.topic_admin import admin_client
from keylane.stages.agent import STATE_TABLE
from keylane.wire import AgentEnvelope, ErrorRecord, decode, encode
from tests.kafka_io import produce, wait_for_records
from tests.processes import KeylaneProcess, process_env, running

pytestmark = pytest.mark.kafka

AGENT = ["--agent", f"{__name__}:sized", "--config", f"{__name__}:sized_config"]
sized_config = AgentConfig()


async def sized(ctx: ActivationContext) -> Complete:
    """The event is {"out": n, "mem": m}: an output of n bytes, after remembering m bytes."""
    asked = json.loads(ctx.event)
    if asked.get("mem"):
        ctx.memory.set("blob", "m" * asked["mem"])
    return Complete(output=b"o" * asked.get("out", 1))


def event(out: int = 1, mem: int = 0) -> bytes:
    return encode(AgentEnvelope(payload={"out": out, "mem": mem}))


async def produce_large(settings: Settings, topic: str, records: list[tuple[bytes, bytes]]) -> None:
    """Produce records up to the catalog's 2 MiB (aiokafka's default request limit is 1 MiB)."""
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.bootstrap_list, acks="all", max_request_size=3 * 1024 * 1024
    )
    await producer.start()
    try:
        for key, value in records:
            await producer.send_and_wait(topic, key=key, value=value)
    finally:
        await producer.stop()


async def test_oversize_dead_letters_fit_and_the_worker_goes_on(
    settings: Settings, catalog: Catalog, tmp_path: Path
) -> None:
    mid = b"\xff" * 760_000  # its error record (base64) is over Faust's default 1,000,000 bytes
    big = b"\xff" * 1_700_000  # its error record would be over the topic's 2 MiB
    worker = KeylaneProcess(["worker", *AGENT], process_env(settings), tmp_path / "worker.log")
    with running(worker):
        await produce_large(settings, catalog.name(EVENTS), [(b"mid", mid), (b"big", big)])
        await produce(settings, catalog.name(EVENTS), [(b"after", event(out=5))])
        outputs = await wait_for_records(settings, catalog.name(OUTPUT), lambda rs: len(rs) >= 1)
        errors = await wait_for_records(settings, catalog.name(ERRORS), lambda rs: len(rs) >= 2)

    assert [(r.key, r.value) for r in outputs] == [(b"after", b"o" * 5)], "the next event was processed"
    by_key = {r.key: decode(r.value, ErrorRecord) for r in errors}
    assert set(by_key) == {b"mid", b"big"} and len(errors) == 2
    whole = by_key[b"mid"]
    assert whole.reason == "malformed_record"
    assert whole.raw_value_b64 is not None and base64.b64decode(whole.raw_value_b64) == mid
    shrunk = by_key[b"big"]
    assert shrunk.reason == "malformed_record" and shrunk.raw_value_b64 is None
    assert shrunk.origin is not None and shrunk.origin.topic == catalog.name(EVENTS)
    assert shrunk.raw_value_digest is not None
    assert shrunk.raw_value_digest.size == len(big)
    assert shrunk.raw_value_digest.sha256 == hashlib.sha256(big).hexdigest()
    assert base64.b64decode(shrunk.raw_value_digest.prefix_b64) == big[:4096]
    assert shrunk.limit_bytes == catalog[ERRORS].max_message_bytes
    assert shrunk.record_bytes is not None and shrunk.record_bytes > shrunk.limit_bytes


async def set_max_message_bytes(settings: Settings, topic: str, value: int, *, cleanup: str) -> None:
    """Change one topic's max.message.bytes on the broker (a non-incremental alter: the other
    configs that matter here are passed again)."""
    configs = {"max.message.bytes": str(value), "cleanup.policy": cleanup}
    resource = ConfigResource(ConfigResourceType.TOPIC, topic, configs)
    async with admin_client(settings) as client:
        (response,) = await client.alter_configs([resource])
        assert all(code == 0 for code, *_ in response.resources), response.resources
        # The controller answers once the change is in its log; the broker applies it when it
        # replays that log, a moment later on a busy machine. A record produced in between
        # is still taken, and the worker then has nothing to crash on.
        deadline = time.monotonic() + 30
        while (await broker_config(client, topic)).get("max.message.bytes") != str(value):
            assert time.monotonic() < deadline, f"the broker still has the old max.message.bytes of {topic}"
            await asyncio.sleep(0.1)


async def broker_config(client: AIOKafkaAdminClient, topic: str) -> dict[str, str]:
    """The topic's configs as the broker serves them (from its own copy of the metadata)."""
    responses = await client.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
    return {entry[0]: entry[1] for r in responses for *_, entries in r.resources for entry in entries}


async def committed_offset(settings: Settings, topic: str, partition: int) -> int | None:
    async with admin_client(settings) as client:
        offsets = await client.list_consumer_group_offsets(settings.app_id)
    for tp, meta in offsets.items():
        if (tp.topic, tp.partition) == (topic, partition):
            return int(meta.offset)
    return None


def wait_exit(process: KeylaneProcess, timeout_s: float) -> int:
    assert process.proc is not None
    deadline = time.monotonic() + timeout_s
    while process.proc.poll() is None:
        if time.monotonic() > deadline:
            raise AssertionError(
                f"the worker is still running {timeout_s}s after Kafka refused its record:\n{process.tail()}"
            )
        time.sleep(0.2)
    return process.proc.returncode


@pytest.mark.parametrize("refusing", ["output", "changelog"])
async def test_a_record_the_broker_refuses_crashes_the_worker_and_its_input_is_not_committed(
    settings: Settings, catalog: Catalog, tmp_path: Path, refusing: str
) -> None:
    events = catalog.name(EVENTS)
    if refusing == "output":
        topic, cleanup = catalog.name(OUTPUT), catalog[OUTPUT].cleanup_policy
    else:
        topic, cleanup = f"{settings.app_id}-{STATE_TABLE}-changelog", "compact"
    worker = KeylaneProcess(["worker", *AGENT], process_env(settings), tmp_path / "worker.log")
    worker.start()
    await produce(settings, events, [(b"warm", event())])
    await wait_for_records(settings, catalog.name(OUTPUT), lambda rs: len(rs) >= 1, timeout_s=60)

    # The catalog still says 2 MiB, so keylane hands the 10 KB output and its 12 KB state
    # over; the broker itself refuses them (MESSAGE_TOO_LARGE, not retriable).
    await set_max_message_bytes(settings, topic, 4096, cleanup=cleanup)
    await produce(settings, events, [(b"big", event(out=10_000, mem=12_000))])
    code = await asyncio.to_thread(wait_exit, worker, 90)

    log = worker.log()
    assert code != 0, f"the worker must fail loudly, it exited {code}"
    critical = [line for line in log.splitlines() if "[CRITICAL]" in line and "was not produced" in line]
    assert len(critical) == 1, f"one clear line, got {critical}"
    assert "record" in critical[0] and f"{events}/" in critical[0], critical[0]
    partition = expected_partition(b"big", catalog[EVENTS].partitions)
    big_offset = 0 if partition != expected_partition(b"warm", catalog[EVENTS].partitions) else 1
    committed = await committed_offset(settings, events, partition)
    assert committed is None or committed <= big_offset, (
        f"{events}/{partition} committed at {committed}, past the refused record at {big_offset}"
    )

    # Once the topic takes the records again, a restarted worker produces them after all.
    await set_max_message_bytes(settings, topic, catalog[OUTPUT].max_message_bytes, cleanup=cleanup)
    with running(KeylaneProcess(["worker", *AGENT], process_env(settings), tmp_path / "worker.log")):
        outputs = await wait_for_records(
            settings, catalog.name(OUTPUT), lambda rs: any(r.key == b"big" for r in rs), timeout_s=90
        )
    assert [r.value for r in outputs if r.key == b"big"][:1] == [b"o" * 10_000]
