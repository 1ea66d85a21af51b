"""Which input offsets keylane has processed, and so which offsets it may commit.

Faust decides commit offsets from its own ack bookkeeping, and around a rebalance that
bookkeeping can pass records keylane never saw: a record fetched before the rebalance is
dropped from the stream buffers, and a partition without a committed offset is not sought
back, so the stream resumes after it; Faust's head-gap check does not apply before the first
commit, and records skipped during a rebalance are acked even on ``noack`` streams. The
ledger replaces that bookkeeping for keylane's input topics:

* on assignment every topic-partition gets its start: the committed offset, or the log start
  when nothing is committed (the consumer is sought there explicitly);
* records are admitted strictly in offset order from the start. A record behind the
  expected offset is a duplicate (a re-read after a seek); a record ahead of it is a gap,
  resolved by the caller: sought back to, or accepted when the log really has no records
  there (transaction markers, compaction);
* the commit mark advances only as the lanes finish admitted records, which they report in
  offset order, so a commit never passes a record keylane did not finish.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]


class Admission(enum.Enum):
    """What to do with a record the consumer delivered."""

    PROCESS = "process"
    DUPLICATE = "duplicate"
    GAP = "gap"
    UNASSIGNED = "unassigned"


@dataclass
class _Position:
    expected: int
    """The next offset to admit."""
    mark: int
    """The next offset to commit: every admitted offset below it has finished."""
    skips: dict[int, int] = field(default_factory=dict)
    """Offset ranges the log has no records in, [start, end) by start, not yet committed past."""


class OffsetLedger:
    """Per topic-partition admission and commit marks for the partitions this worker owns."""

    def __init__(self) -> None:
        self._positions: dict[TopicPartition, _Position] = {}

    def assigned(self, tp: TopicPartition, start: int) -> None:
        """``tp`` is (again) ours; reading starts at ``start`` (committed offset or log start)."""
        self._positions[tp] = _Position(expected=start, mark=start)

    def revoked(self, tp: TopicPartition) -> None:
        """``tp`` is no longer ours: nothing of it is admitted or committed until re-assigned."""
        self._positions.pop(tp, None)

    def partitions(self) -> list[TopicPartition]:
        """The topic-partitions assigned now."""
        return list(self._positions)

    def expected(self, tp: TopicPartition) -> int | None:
        """The next offset ``tp`` admits (None when unassigned)."""
        position = self._positions.get(tp)
        return None if position is None else position.expected

    def admit(self, tp: TopicPartition, offset: int) -> Admission:
        """Classify a delivered record; PROCESS also advances the expected offset."""
        position = self._positions.get(tp)
        if position is None:
            return Admission.UNASSIGNED
        if offset < position.expected:
            return Admission.DUPLICATE
        if offset > position.expected:
            return Admission.GAP
        position.expected += 1
        return Admission.PROCESS

    def skip_to(self, tp: TopicPartition, offset: int) -> None:
        """The log holds no record between the expected offset and ``offset``: jump over them.

        Nothing was admitted there, so when every admitted record has finished the commit mark
        jumps too.
        """
        position = self._positions.get(tp)
        if position is None or offset <= position.expected:
            return
        log.info("%s/%s has no records in [%s, %s); skipping the gap", *tp, position.expected, offset)
        if position.mark == position.expected:
            position.mark = offset
        else:
            position.skips[position.expected] = offset
        position.expected = offset

    def finished(self, tp: TopicPartition, offset: int) -> None:
        """The lanes finished ``offset``; they report a topic-partition's records in offset order."""
        position = self._positions.get(tp)
        if position is None or offset != position.mark:
            return  # revoked meanwhile, or a late report from before the last assignment
        position.mark = offset + 1
        while position.mark in position.skips:
            position.mark = position.skips.pop(position.mark)

    def committable(self, tp: TopicPartition, committed: int | None) -> int | None:
        """The offset to commit for ``tp`` now, or None when nothing new has finished."""
        position = self._positions.get(tp)
        if position is None:
            return None
        if committed is not None and position.mark <= committed:
            return None
        return position.mark
