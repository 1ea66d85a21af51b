"""Where a table partition's restore starts, broker-free: the store's own offset only after an
assignment without a break, otherwise the base sealed by the last accepted commit; an ack after
a revocation moves nothing."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from faust.types import TP

from keylane.kafka.restore_start import Held, RestoreStart, start_offset

CHANGELOG = "app-keylane-state-changelog"
SOURCE = "agent.events"
OFFSET_KEY = b"__faust\0offset__"


class Db(dict[bytes, bytes]):
    def delete(self, key: bytes) -> None:
        self.pop(key, None)


class Store:
    """The parts of Faust's RocksDB store RestoreStart uses, with partitions as dicts."""

    offset_key = OFFSET_KEY

    def __init__(self, path: Path) -> None:
        self.path = path
        self.dbs: dict[int, Db] = {}

    def _db_for_partition(self, partition: int) -> Db:
        return self.dbs.setdefault(partition, Db())

    def persisted_offset(self, tp: Any) -> int | None:
        raw = self._db_for_partition(tp.partition).get(OFFSET_KEY)
        return None if raw is None else int(raw)

    def set_persisted_offset(self, tp: Any, offset: int) -> None:
        self._db_for_partition(tp.partition)[OFFSET_KEY] = str(offset).encode()

    def clear_persisted_offset(self, tp: Any) -> None:
        self._db_for_partition(tp.partition).delete(OFFSET_KEY)

    def partition_path(self, partition: int) -> Path:
        return self.path / f"keylane-state-{partition}.db"


class Table:
    def __init__(self, store: Store) -> None:
        self.data = store
        self.changelog_topic = SimpleNamespace(get_topic_name=lambda: CHANGELOG)

    async def on_rebalance(
        self, assigned: Any, revoked: Any, newly_assigned: Any, generation_id: int = 0
    ) -> None:
        pass

    def _on_changelog_sent(self, fut: Any) -> None:  # Faust's: the ack moves the store's offset
        metadata = fut.result()
        self.data.set_persisted_offset(metadata.topic_partition, metadata.offset)


class Sensors(list[Any]):
    def add(self, sensor: Any) -> None:
        self.append(sensor)


class App:
    """The app parts RestoreStart reaches: its group coordinator's generation, the assignor's
    actives, the table manager and the sensors."""

    def __init__(self) -> None:
        self.actives: set[Any] = set()
        self.sensors = Sensors()
        self.tables = SimpleNamespace(on_partitions_revoked=lambda tps: None, on_commit=lambda offsets: None)
        self.assignor = SimpleNamespace(assigned_actives=lambda: self.actives)
        self.coordinator = SimpleNamespace(generation=-1)
        consumer = SimpleNamespace(_coordinator=self.coordinator)
        self.consumer = SimpleNamespace(_thread=SimpleNamespace(_consumer=consumer))


def tp(partition: int, topic: str = CHANGELOG) -> TP:
    return TP(topic, partition)


class Worker:
    """One worker's table, store and app around a RestoreStart, driven as Faust drives them."""

    def __init__(self, volume: Path) -> None:
        self.store = Store(volume)
        self.table = Table(self.store)
        self.app = App()
        self.restore = RestoreStart(self.table, self.app)
        self.restore.install()

    def assign(self, generation: int, *, active: set[int], standby: frozenset[int] = frozenset()) -> None:
        self.app.coordinator.generation = generation
        self.app.actives = {tp(p) for p in active} | {tp(p, SOURCE) for p in active}
        assigned = {tp(p) for p in active | standby} | {tp(p, SOURCE) for p in active}
        asyncio.run(self.table.on_rebalance(assigned, set(), assigned, generation))

    def revoke(self) -> None:
        self.app.tables.on_partitions_revoked({tp(p) for p in self.restore.assigned})

    def ack(self, partition: int, offset: int) -> None:
        metadata = SimpleNamespace(topic_partition=tp(partition), offset=offset)
        self.table._on_changelog_sent(SimpleNamespace(result=lambda: metadata))

    def commit(self, *, accepted: bool = True) -> None:
        for sensor in self.app.sensors:
            sensor.on_commit_initiated(None)
        if accepted:
            self.app.tables.on_commit({})
        for sensor in self.app.sensors:
            sensor.on_commit_completed(None, None)

    def start(self, partition: int) -> int | None:
        return self.store.persisted_offset(tp(partition))


def test_the_stores_offset_stands_only_after_the_same_or_the_previous_generation() -> None:
    assert start_offset(Held(4, 10), 30, 4) == 30
    assert start_offset(Held(4, 10), 30, 5) == 30
    assert start_offset(Held(4, 10), 30, 6) == 10
    assert start_offset(Held(7, 10), 30, 2) == 10  # a group that started over: not trusted
    assert start_offset(None, 30, 5) is None


def test_a_thawed_worker_restores_from_the_last_accepted_commit_not_from_its_late_acks(
    tmp_path: Path,
) -> None:
    a = Worker(tmp_path)
    a.assign(1, active={0})
    a.ack(0, 10)
    a.commit()  # accepted in generation 1: everything up to 10 was A's
    a.ack(0, 40)  # A was evicted meanwhile: its late write landed after its successor's
    a.revoke()
    a.assign(3, active={0})
    assert a.start(0) == 10


def test_a_kept_partition_and_a_restart_in_the_same_generation_keep_the_stores_offset(tmp_path: Path) -> None:
    a = Worker(tmp_path)
    a.assign(1, active={0})
    a.ack(0, 10)
    a.revoke()
    a.assign(2, active={0})
    assert a.start(0) == 10
    restarted = Worker(tmp_path)
    restarted.store.dbs = a.store.dbs  # the same volume
    restarted.assign(2, active={0})
    assert restarted.start(0) == 10


def test_a_restart_after_the_group_moved_on_restores_from_the_last_accepted_commit(tmp_path: Path) -> None:
    a = Worker(tmp_path)
    a.assign(1, active={0, 1})
    a.ack(0, 10)
    a.ack(1, 5)
    a.commit()
    restarted = Worker(tmp_path)
    restarted.store.dbs = a.store.dbs
    restarted.assign(3, active={0, 1})
    assert (restarted.start(0), restarted.start(1)) == (10, 5)  # nothing was written after the commit


def test_an_ack_after_a_revocation_moves_nothing_and_a_standby_never_acks(tmp_path: Path) -> None:
    a = Worker(tmp_path)
    a.assign(1, active={0}, standby=frozenset({1}))
    a.ack(0, 10)
    a.ack(1, 99)  # not A's active partition
    a.revoke()
    a.ack(0, 20)
    assert (a.start(0), a.start(1)) == (10, None)


def test_a_refused_commit_or_one_across_a_rebalance_seals_nothing(tmp_path: Path) -> None:
    a = Worker(tmp_path)
    a.assign(1, active={0})
    a.ack(0, 10)
    a.commit(accepted=False)
    a.ack(0, 20)
    a.app.tables.on_commit({})  # a later commit's acceptance does not seal the earlier sample
    a.assign(4, active={0})
    assert a.start(0) is None  # never sealed: from the log start

    b = Worker(tmp_path / "b")
    (tmp_path / "b").mkdir()
    b.assign(1, active={0})
    b.ack(0, 10)
    for sensor in b.app.sensors:
        sensor.on_commit_initiated(None)
    b.app.coordinator.generation = 2  # the group moved on meanwhile
    b.app.tables.on_commit({})
    b.assign(4, active={0})
    assert b.start(0) is None


def test_a_store_without_a_record_restores_from_the_log_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    a = Worker(tmp_path)
    a.store.set_persisted_offset(tp(0), 30)  # written before keylane kept records
    with caplog.at_level(logging.INFO, logger="keylane.kafka.restore_start"):
        a.assign(5, active={0})
    assert a.start(0) is None
    assert "its restore reads from the log start, not from the store's offset 30" in caplog.text


def test_an_unreadable_record_counts_as_none(tmp_path: Path) -> None:
    a = Worker(tmp_path)
    a.assign(1, active={0})
    a.ack(0, 10)
    (tmp_path / "keylane-state-0.db.owner").write_text("{not json")
    restarted = Worker(tmp_path)
    restarted.store.dbs = a.store.dbs
    restarted.assign(1, active={0})
    assert restarted.start(0) is None


def test_a_clean_stop_seals_the_offsets_its_partitions_had_when_revoked(tmp_path: Path) -> None:
    """Faust revokes every partition before its last commit when it stops (and keylane
    commits a rebalance's revoked partitions after Faust revoked them): that commit seals
    them, so a restart after the session timeout restores nothing it had."""
    a = Worker(tmp_path)
    a.assign(1, active={0})
    a.ack(0, 10)
    a.revoke()
    a.ack(0, 12)  # a write of its own acknowledged after the revocation: read back later
    a.commit()
    restarted = Worker(tmp_path)
    restarted.store.dbs = a.store.dbs
    restarted.assign(3, active={0})
    assert restarted.start(0) == 10


def test_a_revocation_no_commit_confirms_seals_nothing(tmp_path: Path) -> None:
    a = Worker(tmp_path)
    a.assign(1, active={0})
    a.ack(0, 10)
    a.revoke()
    a.commit(accepted=False)  # evicted: the coordinator refused it
    a.assign(3, active={0})
    assert a.start(0) is None
