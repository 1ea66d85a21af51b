"""A keylane table's RocksDB store (service/keylane/kafka/rocksdb_store.py) writes a partition's
persisted changelog offset at most once per interval (a second in a worker): readers see the
newest offset at once, the database gets it when the interval ends, in one write, and before a
revocation or a stop lets go of the databases. A worker's store writes no write-ahead log and
flushes its memtables at a stop and a revocation instead; the effector's keeps the log. Real
rocksdict databases, no broker."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import faust
import pytest
from faust.stores.memory import Store as MemoryStore
from faust.types import TP
from rocksdict import AccessType, Options, Rdict

from keylane.catalog import load_catalog
from keylane.config import Settings
from keylane.kafka.app import build_app
from keylane.kafka.rocksdb_store import RocksDBStore

CHANGELOG = "w-states-changelog"
INTERVAL_S = 0.05  # the tests' write interval (a worker's is OFFSET_WRITE_INTERVAL_S)


async def interval_passes() -> None:
    await asyncio.sleep(INTERVAL_S * 3)


@pytest.fixture
def app(tmp_path: Path) -> faust.App:
    settings = Settings.from_env({}, data_dir=tmp_path, app_id="w")
    return build_app(settings, load_catalog(prefix="w."), offset_write_interval_s=INTERVAL_S)


@pytest.fixture
def store(app: faust.App) -> RocksDBStore:
    table = app.Table("states", default=None, partitions=4, key_type=bytes, value_type=bytes)
    assert isinstance(table.data, RocksDBStore), "a keylane app's tables run on keylane's store"
    return table.data


def in_database(store: RocksDBStore, partition: int) -> int | None:
    """The offset the partition's database holds (not what the store answers)."""
    raw = store._db_for_partition(partition).get(store.offset_key)
    return None if raw is None else int(raw)


class CountedPuts:
    """A partition database whose puts are counted."""

    def __init__(self, db: Any) -> None:
        self.db = db
        self.puts = 0

    def put(self, key: bytes, value: bytes) -> None:
        self.puts += 1
        self.db.put(key, value)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.db, name)


async def test_the_acks_of_one_interval_reach_the_database_in_one_write(store: RocksDBStore) -> None:
    tp = TP(CHANGELOG, 1)
    counted = CountedPuts(store._db_for_partition(1))
    store._dbs[1] = counted
    for offset in range(10, 15):
        store.set_persisted_offset(tp, offset)
        await asyncio.sleep(0)  # acks of several loop turns
    for offset in range(15, 20):
        store.set_persisted_offset(tp, offset)
    assert store.persisted_offset(tp) == 19, "readers see the newest offset at once"
    assert (in_database(store, 1), counted.puts) == (None, 0)
    await interval_passes()
    assert (in_database(store, 1), counted.puts) == (19, 1)
    assert store.persisted_offset(tp) == 19
    store.set_persisted_offset(tp, 25)
    await interval_passes()
    assert (in_database(store, 1), counted.puts) == (25, 2), "a later interval writes again"


async def test_each_partition_keeps_its_own_offset(store: RocksDBStore) -> None:
    store.set_persisted_offset(TP(CHANGELOG, 0), 7)
    store.set_persisted_offset(TP(CHANGELOG, 3), 70)
    await interval_passes()
    assert [in_database(store, p) for p in range(4)] == [7, None, None, 70]


async def test_a_revocation_writes_the_kept_offsets_before_faust_lets_go(
    store: RocksDBStore, app: faust.App
) -> None:
    store.set_persisted_offset(TP(CHANGELOG, 2), 42)
    db = store._db_for_partition(2)
    store.revoke_partitions(store.table, {TP(CHANGELOG, 2)})
    assert 2 not in store._dbs, "Faust let go of the revoked partition's database"
    assert db.get(store.offset_key) == b"42"


async def test_a_stop_writes_the_kept_offsets(store: RocksDBStore) -> None:
    store.set_persisted_offset(TP(CHANGELOG, 0), 5)
    db = store._db_for_partition(0)
    await store.stop()
    assert db.get(store.offset_key) == b"5"


async def test_clearing_drops_the_kept_offset_and_the_written_one(store: RocksDBStore) -> None:
    tp = TP(CHANGELOG, 1)
    store.set_persisted_offset(tp, 3)
    await interval_passes()
    store.set_persisted_offset(tp, 4)  # kept, not written yet
    store.clear_persisted_offset(tp)
    assert store.persisted_offset(tp) is None
    await interval_passes()
    assert in_database(store, 1) is None, "no kept offset comes back after the clear"


async def test_without_an_interval_the_next_loop_turn_writes(tmp_path: Path) -> None:
    """The effector's stores outlive a crash: their database lags one loop turn at most."""
    app = build_app(Settings.from_env({}, data_dir=tmp_path, app_id="w"), load_catalog(prefix="w."))
    table = app.Table("states", default=None, partitions=4, key_type=bytes, value_type=bytes)
    store = table.data
    assert isinstance(store, RocksDBStore)
    store.set_persisted_offset(TP(CHANGELOG, 2), 11)
    store.set_persisted_offset(TP(CHANGELOG, 2), 12)
    assert in_database(store, 2) is None
    await asyncio.sleep(0)
    assert in_database(store, 2) == 12


def test_without_a_running_loop_the_offset_is_written_at_once(tmp_path: Path) -> None:
    app = build_app(Settings.from_env({}, data_dir=tmp_path, app_id="w"), load_catalog(prefix="w."))
    table = app.Table("states", default=None, partitions=4, key_type=bytes, value_type=bytes)
    store = table.data
    assert isinstance(store, RocksDBStore)
    store.set_persisted_offset(TP(CHANGELOG, 0), 9)
    assert in_database(store, 0) == 9


def test_another_store_stays_fausts(tmp_path: Path) -> None:
    app = build_app(Settings.from_env({}, data_dir=tmp_path, app_id="w"), load_catalog(prefix="w."))
    app.conf.store = "memory://"  # type: ignore[assignment]  # Faust converts it to a URL
    table = app.Table("in-memory", default=None, partitions=4)
    assert type(table.data) is MemoryStore


# -- the write-ahead log: a worker's stores go without it, the effector's keep it --------------

WRITER = """
import asyncio, os, sys
from pathlib import Path
from faust.types import TP
from keylane.catalog import load_catalog
from keylane.config import Settings
from keylane.kafka.app import build_app

data_dir, logged, ending = Path(sys.argv[1]), sys.argv[2] == "logged", sys.argv[3]
app = build_app(
    Settings.from_env({}, data_dir=data_dir, app_id="w"), load_catalog(prefix="w."), write_ahead_log=logged
)
store = app.Table("states", default=None, partitions=4, key_type=bytes, value_type=bytes).data
# Held here, the databases are not closed when Faust lets go of them: closing one writes its
# memtable out, and nothing but the store's own flush may be what keeps the writes.
held = [store._db_for_partition(partition) for partition in (1, 3)]
for partition in (1, 3):
    store._db_for_partition(partition).put(b"key-%d" % partition, b"value-%d" % partition)
    store.set_persisted_offset(TP("w-states-changelog", partition), 40 + partition)
print(store.partition_path(1), store.partition_path(3), flush=True)
if ending == "revoke":
    store.revoke_partitions(store.table, {TP("w-states-changelog", 1), TP("w-states-changelog", 3)})
elif ending == "stop":
    asyncio.run(store.stop())
os._exit(0)  # no destructor runs: the databases are not closed, as when a process dies
"""


Found = dict[int, tuple[bytes | None, bytes | None]]


def written_then_exit(tmp_path: Path, *, logged: bool, ending: str) -> Found:
    """Run WRITER in a process of its own, which puts a key into partitions 1 and 3 and keeps
    their offsets (41, 43), ends as ``ending`` says (``exit``: at once), and exits without
    closing anything; then open what it left on disk: each partition's (key, offset)."""
    done = subprocess.run(
        [sys.executable, "-c", WRITER, str(tmp_path), "logged" if logged else "unlogged", ending],
        capture_output=True,
        check=True,
        timeout=60,
    )
    paths = done.stdout.decode().split()
    found = {}
    for partition, path in zip((1, 3), paths, strict=True):
        db = Rdict(path, options=Options(raw_mode=True), access_type=AccessType.read_only())
        found[partition] = (db.get(b"key-%d" % partition), db.get(b"__faust\x00offset__"))
        db.close()
    return found


def test_a_workers_store_writes_no_log_and_the_effectors_does(tmp_path: Path) -> None:
    """A process gone without closing its stores: the effector's (logged) writes are found
    again, a worker's are not, which is what the log cost it; its stores are deleted after
    such an end anyway (service/keylane/kafka/clean_stop.py)."""
    assert written_then_exit(tmp_path / "effector", logged=True, ending="exit") == {
        1: (b"value-1", b"41"),
        3: (b"value-3", b"43"),
    }
    gone = written_then_exit(tmp_path / "worker", logged=False, ending="exit")
    assert gone == {1: (None, None), 3: (None, None)}


@pytest.mark.parametrize("ending", ["stop", "revoke"])
def test_a_stop_or_a_revocation_leaves_a_workers_writes_on_disk(tmp_path: Path, ending: str) -> None:
    """Without the log, the flush at a stop and at a revocation is what keeps the writes and
    the offset that says how far they go, for the store reopened after a clean stop."""
    assert written_then_exit(tmp_path, logged=False, ending=ending) == {
        1: (b"value-1", b"41"),
        3: (b"value-3", b"43"),
    }
