"""A worker keeps its table stores across a stop by signal, and restores every partition from
its changelog alone after a kill -9 (service/keylane/kafka/clean_stop.py): a killed worker's
store can hold writes its changelog never got.

Paged memory is what such a store would tear (a record only the store holds, beside pages a
restore read took back), so the agent here pages its memory. The second test exits the worker
at the one point that leaves such writes; tests/integration/test_emptied_memory_crash.py
attacks the same with kills at seeded points.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from rocksdict import AccessType, Options, Rdict

from keylane.catalog import ERRORS, EVENTS, Catalog
from keylane.config import Settings
from keylane.core.state import state_changelog
from keylane.kafka.clean_stop import CLEAN_STOP_MARKER
from keylane.kafka.topic_reader import read_to_end
from keylane.wire import AgentEnvelope, encode
from tests.agents.pages import EXIT_AFTER_WRITING, digest, expected_found, filled, found_by_event
from tests.integration.stream_checks import outputs_by_id, wait_until
from tests.kafka_io import produce
from tests.processes import KeylaneProcess, process_env, running

pytestmark = pytest.mark.kafka

KEYS = [f"doc-{i}".encode() for i in range(6)]
UNCLEAN = "did not stop cleanly"
OFFSET_KEY = b"__faust\x00offset__"


def on_disk(stores: Path) -> dict[tuple[int, bytes], bytes]:
    """What a stopped worker's stores hold, opened as the next start opens them: each
    partition's (partition, key) -> value, its persisted changelog offset under OFFSET_KEY. A
    worker's stores keep no write-ahead log (service/keylane/kafka/rocksdb_store.py), so this
    is only what its stop wrote out."""
    held: dict[tuple[int, bytes], bytes] = {}
    for path in stores.glob("*.db"):
        partition = int(path.stem.rsplit("-", 1)[1])
        db = Rdict(str(path), options=Options(raw_mode=True), access_type=AccessType.read_only())
        try:
            held.update(((partition, key), value) for key, value in db.items())
        finally:
            db.close()
    return held


async def in_changelog(settings: Settings) -> dict[tuple[int, bytes], bytes]:
    """The state changelog as a restore reads it: each key's last value, and each partition's
    last offset under OFFSET_KEY (as Faust's store keeps it)."""
    last: dict[tuple[int, bytes], bytes] = {}
    for record in await read_to_end(settings, state_changelog(settings.app_id)):
        assert record.key is not None and record.value is not None
        last[(record.partition, record.key)] = record.value
        last[(record.partition, OFFSET_KEY)] = str(record.offset).encode()
    return last


def fills(round_: int) -> list[tuple[bytes, bytes]]:
    return [(key, encode(AgentEnvelope(payload=f"fill:{key.decode()}-{round_}"))) for key in KEYS]


@pytest.mark.timeout(240)
async def test_a_stop_keeps_the_stores_and_a_kill_9_restores_them_from_the_changelog(
    settings: Settings, catalog: Catalog, tmp_path: Path
) -> None:
    marker = settings.data_dir / CLEAN_STOP_MARKER
    stores = settings.data_dir / "v1" / "tables"
    worker = KeylaneProcess(
        ["worker", "--agent", "tests.agents.pages:agent"], process_env(settings), tmp_path / "worker.log"
    )
    with running(worker):
        await produce(settings, catalog.name(EVENTS), fills(0))
        await outputs_by_id(settings, catalog, len(KEYS), timeout_s=90)
        assert not marker.exists(), "a running worker has no clean-stop marker"
        assert worker.stop() == 0
        assert marker.exists(), "a stop by signal, everything confirmed, marks the stores clean"
        kept = {path.name: path.stat().st_ino for path in stores.glob("*.db")}
        assert kept
        assert on_disk(stores) == await in_changelog(settings), "the stores kept what the changelog has"

        worker.start()
        assert UNCLEAN not in worker.log_since_start()
        assert {path.name: path.stat().st_ino for path in stores.glob("*.db")} == kept, "the stores were kept"
        await produce(settings, catalog.name(EVENTS), fills(1))
        await outputs_by_id(settings, catalog, 2 * len(KEYS), timeout_s=90)
        worker.kill9()
        assert not marker.exists()

        worker.start()
        assert UNCLEAN in worker.log_since_start(), "a killed worker's stores are not kept"
        await produce(settings, catalog.name(EVENTS), fills(2))
        outputs = await outputs_by_id(settings, catalog, 3 * len(KEYS), timeout_s=90)
        worker.stop()

    found = found_by_event(outputs)
    for key in KEYS:  # each fill found the memory the one before it left, across both restarts
        name = key.decode()
        assert found[(name, f"fill:{name}-1")] == digest(filled(f"{name}-0"))
        assert found[(name, f"fill:{name}-2")] == digest(filled(f"{name}-1"))


@pytest.mark.timeout(240)
async def test_a_worker_gone_between_its_table_write_and_the_changelog_restores_each_key_whole(
    settings: Settings, catalog: Catalog, tmp_path: Path
) -> None:
    """The worker exits right after fill:doc-0-1's table write: its store holds that record and
    its pages, the changelog none of them. Started over that store, its restore could keep the
    record and take pages back, or keep both, and the input run again would find the record
    and commit it alone: either way the changelog would not hold the memory fill left. So the
    last start has no store at all, and clear:doc-0-1 must find what fill:doc-0-1 left."""
    key = b"doc-0"
    first, then = ["fill:doc-0-0", "clear:doc-0-0", "fill:doc-0-1"], ["clear:doc-0-1", "fill:doc-0-2"]
    exited = tmp_path / "exited"
    env = process_env(settings, **{EXIT_AFTER_WRITING: f"fill:doc-0-1,{exited}"})
    worker = KeylaneProcess(["worker", "--agent", "tests.agents.pages:agent"], env, tmp_path / "worker.log")

    def envelopes(events: list[str]) -> list[tuple[bytes, bytes]]:
        return [(key, encode(AgentEnvelope(payload=event))) for event in events]

    with running(worker):
        await produce(settings, catalog.name(EVENTS), envelopes(first))
        await wait_until(lambda: worker.returncode is not None, timeout_s=60, what="the worker's exit")
        assert worker.returncode == 137 and exited.exists(), worker.tail()
        worker.start()
        assert UNCLEAN in worker.log_since_start()
        await outputs_by_id(settings, catalog, len(first), timeout_s=90)
        assert worker.stop() == 0
        shutil.rmtree(settings.data_dir / "v1")  # the next start reads the changelog alone
        worker.start()
        await produce(settings, catalog.name(EVENTS), envelopes(then))
        outputs = await outputs_by_id(settings, catalog, len(first) + len(then), timeout_s=90)
        worker.stop()

    found = found_by_event(outputs)
    events = first + then
    assert [found[("doc-0", event)] for event in events] == expected_found(events)
    assert await read_to_end(settings, catalog.name(ERRORS)) == []
