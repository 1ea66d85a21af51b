"""Faust seeks to committed a second time within one assignment when its fetcher finds flow
suspended (``Consumer.getmany``), while the lanes already run records admitted since the
first seek. make test's resume-position test caught the second start at the committed offset
on a busy CI machine: the worker admitted those records again and counted them as
redeliveries, and re-produced its rerouted records twice. A partition the ledger holds reads
on from the offset it expects next; only a new assignment starts at the committed offset."""

from __future__ import annotations

from types import SimpleNamespace

from faust.types import TP

from keylane.core.offsets import Admission
from keylane.kafka.offset_guard import OffsetGuard

TOPIC = "agent.events"
P0, P1 = TP(TOPIC, 0), TP(TOPIC, 1)


class PositioningConsumer:
    """What position() asks of Faust's consumer; it records the seeks."""

    def __init__(self) -> None:
        self.seeks: list[dict[TP, int]] = []

    def assignment(self) -> set[TP]:
        return {P0, P1, TP("other", 0)}

    async def earliest_offsets(self, *tps: TP) -> dict[TP, int]:
        return dict.fromkeys(tps, 0)

    async def seek_wait(self, offsets: dict[TP, int]) -> None:
        self.seeks.append(dict(offsets))

    def highwater(self, tp: TP) -> int:
        return 20


def guard_of(consumer: PositioningConsumer) -> OffsetGuard:
    guard = OffsetGuard(SimpleNamespace(consumer=consumer))
    guard.topics.add(TOPIC)
    return guard


async def test_a_second_seek_in_one_assignment_reads_on_from_the_expected_offsets() -> None:
    consumer = PositioningConsumer()
    guard = guard_of(consumer)
    await guard.position(consumer, {P0: 5, P1: 9})
    for offset in (5, 6, 7):  # the lanes run three records of partition 0
        assert guard.ledger.admit((TOPIC, 0), offset) is Admission.PROCESS
    guard.ledger.finished((TOPIC, 0), 5)

    await guard.position(consumer, {P0: 5, P1: 9})  # Faust's getmany found flow suspended

    assert consumer.seeks == [{P0: 5, P1: 9}, {P0: 8, P1: 9}]
    assert guard.ledger.admit((TOPIC, 0), 6) is Admission.DUPLICATE
    assert guard.ledger.admit((TOPIC, 0), 8) is Admission.PROCESS
    assert guard.ledger.committable((TOPIC, 0), 5) == 6  # the finished record still commits


async def test_a_new_assignment_starts_at_the_committed_offsets() -> None:
    consumer = PositioningConsumer()
    guard = guard_of(consumer)
    await guard.position(consumer, {P0: 5, P1: 9})
    assert guard.ledger.admit((TOPIC, 0), 5) is Admission.PROCESS
    for tp in (P0, P1):  # a rebalance revokes every partition first
        guard.revoked((tp.topic, tp.partition))

    await guard.position(consumer, {P0: 12, P1: None})  # another owner committed meanwhile

    assert consumer.seeks[-1] == {P0: 12, P1: 0}
    assert guard.ledger.expected((TOPIC, 0)) == 12
    assert guard.ledger.expected((TOPIC, 1)) == 0
