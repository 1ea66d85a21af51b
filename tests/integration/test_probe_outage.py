"""The offset guard's probe starting while the broker is down costs one check, not the worker.

The guard's gap and stall checks read the log with a probe consumer of their own
(service/keylane/kafka/offset_guard.py). A probe whose start failed (the broker restarting,
unreachable) used to be kept anyway: that check raised out of the stall timer, which crashes
the worker, and every later check raised again on the never-started consumer. Here the worker
loses the one record of each event partition (tests/integration/drop_fetch_probe.py), so only
its stall check can find them, and the test's own broker is killed -9 before that check
probes the log. The failed probe is logged, the broker comes back, and a later check reads
the records again: each is processed once and the worker never stopped.

The lane feed's gap check (``OffsetGuard.resolve_gap``) is driven directly too, with the
broker down: the gap counts as unresolved and the record is read again from the expected
offset; once the broker is back, the next check probes the log.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.admin import NewTopic, RecordsToDelete
from aiokafka.errors import KafkaError
from faust.types import TP
from yarl import URL

from keylane.catalog import EVENTS, OUTPUT, load_catalog
from keylane.config import Settings
from keylane.kafka import offset_guard
from keylane.kafka.offset_guard import STALL_CHECK_S, STALL_REREAD_AFTER_S, OffsetGuard
from keylane.kafka.topic_admin import admin_client, apply_catalog
from keylane.testing.processes import free_port
from keylane.wire import AgentEnvelope, encode
from tests.broker import local_kafka
from tests.integration.test_redelivery import by_id, metric
from tests.integration.test_resume_position import commits_reach_the_end
from tests.kafka_io import one_key_per_partition, produce, wait_for_records
from tests.processes import KeylaneProcess, process_env, running

pytestmark = pytest.mark.kafka

NODE = 1
PROBE_FAILED = "could not be read to check it"
"""What the stall check logs when its probe cannot reach the broker."""
STALL_PROBE_WITHIN_S = STALL_REREAD_AFTER_S + 2 * STALL_CHECK_S + 30
"""From a partition going quiet to its stall check probing the log, on a busy machine."""


@pytest.fixture
def own_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A 1-node broker of this test's own (the shared one is never stopped); its state dir."""
    launcher = local_kafka()
    state = tmp_path_factory.mktemp("kafka-probe-outage")
    launcher.start(state, nodes=1, quiet=True)
    try:
        yield state
    finally:
        launcher.stop(state, quiet=True)


async def wait_for_log(worker: KeylaneProcess, text: str, *, after: int, timeout_s: float) -> int:
    """Poll the worker's log until ``text`` appears past character ``after``; returns where.
    Fails at once when the worker exits (ProcessFailed with its log)."""
    deadline = time.monotonic() + timeout_s
    while (at := worker.log().find(text, after)) < 0:
        worker.check()
        assert time.monotonic() < deadline, f"{text!r} not logged within {timeout_s:.0f}s:\n{worker.tail()}"
        await asyncio.sleep(0.5)
    return at


@pytest.mark.timeout(420)
async def test_a_probe_that_cannot_start_is_retried_once_the_broker_is_back(
    own_broker: Path, tmp_path: Path
) -> None:
    launcher = local_kafka()
    cluster = launcher.running_cluster(own_broker)
    assert cluster is not None
    unique = uuid.uuid4().hex[:10]
    settings = Settings.from_env(
        launcher.keylane_env(cluster),
        topic_prefix=f"t{unique}.",
        app_id=f"keylane-test-{unique}",
        data_dir=tmp_path,
    )
    catalog = load_catalog(prefix=settings.topic_prefix)
    async with admin_client(settings) as client:
        await apply_catalog(client, catalog)

    port = free_port()
    dropped = tmp_path / "dropped.log"
    env = process_env(
        settings,
        LLM_LEDGER=str(tmp_path / "llm.jsonl"),
        KEYLANE_METRICS_PORT=str(port),
        # The outage outlasts the tests' usual 6 s: the worker keeps its partitions through it,
        # so only the stall check (not a rebalance) can read the lost records again.
        KEYLANE_SESSION_TIMEOUT_S="60",
        DROP_FETCHED_TOPIC=catalog.name(EVENTS),
        DROP_FETCHED_LOG=str(dropped),
    )
    worker = KeylaneProcess(
        ["worker", "--agent", "tests.agents.flow:remember"],
        env,
        tmp_path / "worker.log",
        module="tests.integration.drop_fetch_probe",
    )
    keys = one_key_per_partition(catalog[EVENTS].partitions, "outage-{}")
    with running(worker):
        await produce(
            settings, catalog.name(EVENTS), [(k, encode(AgentEnvelope(payload=k.decode()))) for k in keys]
        )
        deadline = time.monotonic() + 60
        while len(dropped.read_text().splitlines() if dropped.exists() else []) < len(keys):
            worker.check()
            assert time.monotonic() < deadline, f"the worker never fetched every partition:\n{worker.tail()}"
            await asyncio.sleep(0.2)

        launcher.kill_node(own_broker, NODE)  # before any stall check probes the lost records
        down = len(worker.log())
        failed_at = await wait_for_log(worker, PROBE_FAILED, after=down, timeout_s=STALL_PROBE_WITHIN_S)
        await asyncio.to_thread(launcher.restart_node, own_broker, NODE)

        await wait_for_log(worker, "re-reading from there", after=failed_at, timeout_s=STALL_PROBE_WITHIN_S)
        records = await wait_for_records(
            settings, catalog.name(OUTPUT), lambda rs: len(by_id(rs)) == len(keys), timeout_s=60
        )
        await commits_reach_the_end(settings, catalog)
        rereads = await metric(port, "keylane_stall_rereads_total")
        worker.check()

    assert all(len(values) == 1 for values in by_id(records).values()), "each event ran once"
    assert rereads >= 1, "a stall check read the lost records again after the outage"


async def delete_before(
    settings: Settings, tp: TopicPartition, offset: int, *, timeout_s: float = 60
) -> None:
    """Delete ``tp``'s records before ``offset``, retried while the restarted broker has no
    leader for it yet."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            async with admin_client(settings) as client:
                await client.delete_records({tp: RecordsToDelete(offset)})
        except KafkaError:
            assert time.monotonic() < deadline, f"could not delete {tp}'s records within {timeout_s:.0f}s"
            await asyncio.sleep(0.5)
        else:
            return


class SeekingConsumer:
    """The part of Faust's consumer the guard's gap check uses: one assigned partition, and
    the seeks asked of it."""

    def __init__(self, tp: TP) -> None:
        self.tp = tp
        self.seeks: list[dict[TP, int]] = []

    def assignment(self) -> set[TP]:
        return {self.tp}

    async def seek_wait(self, offsets: dict[TP, int]) -> None:
        self.seeks.append(dict(offsets))


@pytest.mark.timeout(180)
async def test_a_gap_check_with_the_broker_down_is_retried_later(
    own_broker: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(offset_guard, "RESEEK_AFTER_S", 0.0)  # each call checks the log again
    launcher = local_kafka()
    cluster = launcher.running_cluster(own_broker)
    assert cluster is not None
    topic = f"probe-gap-{uuid.uuid4().hex[:10]}"
    settings = Settings.from_env(launcher.keylane_env(cluster))
    async with admin_client(settings) as client:
        await client.create_topics([NewTopic(topic, 1, 1)])
    producer = AIOKafkaProducer(bootstrap_servers=settings.bootstrap_list)
    await producer.start()
    try:
        for n in range(3):
            await producer.send_and_wait(topic, f"r{n}".encode(), partition=0)
    finally:
        await producer.stop()

    tp = (topic, 0)
    consumer = SeekingConsumer(TP(topic, 0))
    app: Any = SimpleNamespace(
        conf=SimpleNamespace(
            broker=[URL(f"kafka://{cluster.bootstrap}")], processing_guarantee="at_least_once"
        ),
        consumer=consumer,
    )
    guard = OffsetGuard(app)
    guard.ledger.assigned(tp, 0)
    try:
        launcher.kill_node(own_broker, NODE)
        assert await guard.resolve_gap(tp, 2) is False, "a gap the log could not confirm is not skipped"
        assert guard.ledger.expected(tp) == 0
        assert consumer.seeks == [{TP(topic, 0): 0}], "the record is read again from the expected offset"

        await asyncio.to_thread(launcher.restart_node, own_broker, NODE)
        await delete_before(settings, TopicPartition(topic, 0), 2)  # retention: offsets 0 and 1 are gone
        assert await guard.resolve_gap(tp, 2) is True, (
            "the next check probes the log: nothing is left before 2"
        )
        assert guard.ledger.expected(tp) == 2
        assert len(consumer.seeks) == 1
    finally:
        await guard.close()
