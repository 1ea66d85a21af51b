"""When the restore watch reads a table restore again (service/keylane/kafka/restore_watch.py):
only an active partition with records to apply whose applied offset stood still for
REREAD_AFTER_S, from that offset. Faust's real Recovery holds the offsets; the consumer records
the seeks. tests/integration/test_restore_reread.py attacks it with a real worker and broker."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import faust
from faust.types import TP
from prometheus_client import REGISTRY

from keylane.kafka.restore_watch import REREAD_AFTER_S, RestoreWatch, restore_positions_after_seek

CHANGELOG = "app-keylane-state-changelog"
STALLED, MOVING, DONE = TP(CHANGELOG, 0), TP(CHANGELOG, 1), TP(CHANGELOG, 2)


class SeekingConsumer:
    def __init__(self) -> None:
        self.seeks: list[dict[TP, int]] = []

    async def seek_wait(self, offsets: dict[TP, int]) -> None:
        self.seeks.append(dict(offsets))


def rereads() -> float:
    return REGISTRY.get_sample_value("keylane_restore_rereads_total") or 0.0


def watched() -> tuple[RestoreWatch, Any, SeekingConsumer]:
    recovery = faust.App("restore-watch-test").tables.recovery
    recovery.in_recovery = True
    recovery.active_highwaters.update({STALLED: 9, MOVING: 40, DONE: 3})
    recovery.active_offsets.update({STALLED: -1, MOVING: 10, DONE: 3})
    consumer = SeekingConsumer()
    app = SimpleNamespace(tables=SimpleNamespace(recovery=recovery), consumer=consumer, should_stop=False)
    return RestoreWatch(app), recovery, consumer


async def test_a_restore_that_applied_nothing_for_the_wait_is_read_again_from_its_offset() -> None:
    watch, recovery, consumer = watched()
    before = rereads()
    await watch.check(now=100.0)
    recovery.active_offsets[MOVING] = 20  # applied more: its clock starts over
    await watch.check(now=100.0 + REREAD_AFTER_S - 1)
    assert consumer.seeks == []
    recovery.active_offsets[MOVING] = 30
    await watch.check(now=100.0 + REREAD_AFTER_S)
    assert consumer.seeks == [{STALLED: 0}]  # -1: nothing applied yet, so from the log start
    assert rereads() == before + 1


async def test_a_reread_waits_again_before_the_next_and_starts_where_the_restore_stands() -> None:
    watch, recovery, consumer = watched()
    recovery.active_offsets[STALLED] = 4
    recovery.active_offsets[MOVING] = 40
    await watch.check(now=0.0)
    await watch.check(now=REREAD_AFTER_S)
    await watch.check(now=REREAD_AFTER_S + 1)
    assert consumer.seeks == [{STALLED: 4}]
    await watch.check(now=2 * REREAD_AFTER_S)
    assert consumer.seeks == [{STALLED: 4}, {STALLED: 4}]


async def test_nothing_is_read_again_outside_a_restore() -> None:
    watch, recovery, consumer = watched()
    await watch.check(now=0.0)
    recovery.in_recovery = False
    await watch.check(now=REREAD_AFTER_S)
    recovery.in_recovery = True
    await watch.check(now=REREAD_AFTER_S + 1)  # a new restore: its clock starts now
    assert consumer.seeks == []


STANDBY, STANDBY_DONE, NOT_OURS = TP(CHANGELOG, 3), TP(CHANGELOG, 4), TP(CHANGELOG, 5)


class AssignedConsumer(SeekingConsumer):
    def __init__(self, app: Any, assigned: set[TP]) -> None:
        super().__init__()
        self.app = app
        self.assigned = assigned

    def assignment(self) -> set[TP]:
        return self.assigned


async def test_after_a_seek_to_committed_each_restoring_partition_goes_back_to_what_it_applied() -> None:
    tables = faust.App("restore-positions-test").tables
    recovery = tables.recovery
    recovery.active_tps.update({STALLED, MOVING, DONE, NOT_OURS})
    recovery.active_highwaters.update({STALLED: 9, MOVING: 40, DONE: 3, NOT_OURS: 5})
    recovery.active_offsets.update({STALLED: -1, MOVING: 10, DONE: 3, NOT_OURS: 0})
    recovery.standby_tps.update({STANDBY, STANDBY_DONE})
    recovery.standby_highwaters.update({STANDBY: 7, STANDBY_DONE: 2})
    recovery.standby_offsets.update({STANDBY: 3, STANDBY_DONE: 2})
    tables.data[CHANGELOG] = object()  # an app with a table (a TableManager is a dict of them)
    consumer = AssignedConsumer(
        SimpleNamespace(tables=tables), {STALLED, MOVING, DONE, STANDBY, STANDBY_DONE}
    )
    await restore_positions_after_seek(consumer)
    # Done partitions stay where they are, and a partition no longer assigned is not sought.
    assert consumer.seeks == [{STALLED: 0, MOVING: 10, STANDBY: 3}]


async def test_an_app_without_tables_seeks_nothing_after_a_seek_to_committed() -> None:
    consumer = AssignedConsumer(SimpleNamespace(tables=faust.App("no-tables-test").tables), {STALLED})
    await restore_positions_after_seek(consumer)
    assert consumer.seeks == []


class FailingConsumer(AssignedConsumer):
    async def seek_wait(self, offsets: dict[TP, int]) -> None:
        raise RuntimeError("IllegalStateError: the partition is no longer assigned")


async def test_a_seek_back_that_fails_does_not_fail_fausts_seek_to_committed() -> None:
    tables = faust.App("failing-seek-test").tables
    recovery = tables.recovery
    recovery.active_tps.add(STALLED)
    recovery.active_highwaters[STALLED] = 9
    recovery.active_offsets[STALLED] = 2
    tables.data[CHANGELOG] = object()
    await restore_positions_after_seek(FailingConsumer(SimpleNamespace(tables=tables), {STALLED}))
