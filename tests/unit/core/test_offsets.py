"""OffsetLedger: strict admission from the start offset, commits only over finished records."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from keylane.core.offsets import Admission, OffsetLedger

TP = ("agent.events", 3)


def test_records_are_admitted_in_strict_offset_order_from_the_start() -> None:
    ledger = OffsetLedger()
    ledger.assigned(TP, 5)
    assert ledger.admit(TP, 5) is Admission.PROCESS
    assert ledger.admit(TP, 5) is Admission.DUPLICATE
    assert ledger.admit(TP, 4) is Admission.DUPLICATE
    assert ledger.admit(TP, 7) is Admission.GAP, "offset 6 was never delivered"
    assert ledger.expected(TP) == 6
    assert ledger.admit(TP, 6) is Admission.PROCESS


def test_an_unassigned_partition_admits_and_commits_nothing() -> None:
    ledger = OffsetLedger()
    assert ledger.admit(TP, 0) is Admission.UNASSIGNED
    ledger.assigned(TP, 0)
    ledger.admit(TP, 0)
    ledger.revoked(TP)
    ledger.finished(TP, 0)
    assert ledger.committable(TP, None) is None


def test_the_commit_mark_follows_finished_records_only() -> None:
    ledger = OffsetLedger()
    ledger.assigned(TP, 10)
    for offset in (10, 11, 12):
        ledger.admit(TP, offset)
    assert ledger.committable(TP, 10) is None, "nothing finished yet"
    ledger.finished(TP, 10)
    ledger.finished(TP, 11)
    assert ledger.committable(TP, 10) == 12
    assert ledger.committable(TP, 12) is None, "already committed"


def test_a_late_report_from_before_a_reassignment_does_not_move_the_mark() -> None:
    ledger = OffsetLedger()
    ledger.assigned(TP, 8)
    ledger.admit(TP, 8)
    ledger.finished(TP, 10)  # the old owner's lane finishing record 10 after we restarted at 8
    assert ledger.committable(TP, None) == 8
    ledger.finished(TP, 8)
    assert ledger.committable(TP, None) == 9


def test_a_skipped_gap_is_committed_past_once_everything_before_it_finished() -> None:
    ledger = OffsetLedger()
    ledger.assigned(TP, 0)
    ledger.admit(TP, 0)
    ledger.admit(TP, 1)
    ledger.skip_to(TP, 5)  # offsets 2-4 hold no records (transaction markers)
    assert ledger.admit(TP, 5) is Admission.PROCESS
    ledger.finished(TP, 0)
    assert ledger.committable(TP, None) == 1
    ledger.finished(TP, 1)
    assert ledger.committable(TP, None) == 5, "the gap is passed with the record before it"
    ledger.finished(TP, 5)
    assert ledger.committable(TP, None) == 6


def test_a_skip_with_nothing_in_flight_moves_the_mark_at_once() -> None:
    ledger = OffsetLedger()
    ledger.assigned(TP, 3)
    ledger.skip_to(TP, 9)
    assert ledger.committable(TP, None) == 9
    assert ledger.admit(TP, 9) is Admission.PROCESS


@given(
    delivered=st.lists(st.integers(min_value=0, max_value=30), max_size=80),
    start=st.integers(min_value=0, max_value=5),
)
def test_the_mark_never_passes_an_offset_that_was_not_processed(delivered: list[int], start: int) -> None:
    """Whatever order, duplicates and holes the consumer delivers, and whichever admitted records
    have finished, the commit mark covers only processed offsets (no skip_to: no real gaps)."""
    ledger = OffsetLedger()
    ledger.assigned(TP, start)
    processed: list[int] = []
    for offset in delivered:
        if ledger.admit(TP, offset) is Admission.PROCESS:
            processed.append(offset)
            ledger.finished(TP, offset)
    mark = ledger.committable(TP, None)
    assert mark is None or set(range(start, mark)) <= set(processed)
    assert processed == list(range(start, start + len(processed))), "admitted strictly in order"


def test_faust_s_fetch_loop_sees_no_read_offset_on_governed_topics_and_changelogs() -> None:
    """Faust drops fetched records below its read offset, which its fetcher advances ahead of
    processing; after a seek back that dropped the re-read and stalled the partition. The
    ledger admits in order itself, so governed topics read as having no read offset."""
    from types import SimpleNamespace

    from faust.types import TP

    from keylane.kafka.offset_guard import OffsetGuard
    from keylane.kafka.patches import _UnfilteredReadOffsets

    guard = OffsetGuard(SimpleNamespace())
    guard.topics.add("t.agent.results")
    tables = SimpleNamespace(changelog_topics={"app-keylane-state-changelog"})
    offsets = _UnfilteredReadOffsets(
        guard,
        tables,
        {TP("t.agent.results", 0): 7, TP("other", 0): 7, TP("app-keylane-state-changelog", 0): 7},
    )
    offsets[TP("t.agent.results", 1)] = 9  # Faust's set_read_offset still works

    assert offsets[TP("t.agent.results", 0)] is None
    assert offsets[TP("t.agent.results", 1)] is None
    assert offsets[TP("other", 0)] == 7
    assert offsets[TP("other", 1)] is None  # still a defaultdict for Faust's own topics
    # A table changelog too: a standby's restore that seeks back re-reads what it fetched
    # before a rebalance threw it away (service/keylane/kafka/patches.py).
    assert offsets[TP("app-keylane-state-changelog", 0)] is None
    assert (
        _UnfilteredReadOffsets(None, tables, {TP("app-keylane-state-changelog", 1): 3})[
            TP("app-keylane-state-changelog", 1)
        ]
        is None
    )
