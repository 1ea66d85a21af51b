"""The consumer lag gauges (service/keylane/kafka/consumer_lag.py): set on assignment, moved
by commits that advance the offset, recomputed from the log end, gone on revocation."""

from __future__ import annotations

from types import SimpleNamespace

from faust.types import TP
from prometheus_client import REGISTRY

from keylane.kafka.consumer_lag import ConsumerLag
from keylane.kafka.offset_guard import OffsetGuard

TOPIC = "lagtest.agent.events"


def gauge(name: str, partition: int, topic: str = TOPIC) -> float | None:
    labels = {"topic": topic, "partition": str(partition)}
    return REGISTRY.get_sample_value(f"keylane_consumer_{name}", labels)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_assignment_commits_log_end_and_revocation() -> None:
    clock = Clock()
    lag = ConsumerLag(clock=clock)
    ends = {(TOPIC, 0): 10, (TOPIC, 1): None}

    lag.assigned((TOPIC, 0), 4)
    lag.assigned((TOPIC, 1), 0)
    lag.refresh(lambda topic, partition: ends[(topic, partition)])

    assert gauge("committed_offset", 0) == 4
    assert gauge("last_commit_timestamp_seconds", 0) == 1000.0, "the assignment's time until a commit"
    assert gauge("lag", 0) == 6
    assert gauge("lag", 1) is None, "no lag before the consumer knows the log end"

    clock.now = 1005.0
    lag.committed((TOPIC, 0), 4)  # a commit that did not advance the offset
    assert gauge("last_commit_timestamp_seconds", 0) == 1000.0
    lag.committed((TOPIC, 0), 10)
    lag.refresh(lambda topic, partition: ends[(topic, partition)])
    assert gauge("committed_offset", 0) == 10
    assert gauge("last_commit_timestamp_seconds", 0) == 1005.0
    assert gauge("lag", 0) == 0

    lag.revoked((TOPIC, 0))
    lag.revoked((TOPIC, 1))
    for name in ("lag", "committed_offset", "last_commit_timestamp_seconds"):
        assert gauge(name, 0) is None and gauge(name, 1) is None, name
    lag.committed((TOPIC, 0), 20)  # a late commit of a revoked partition
    assert gauge("committed_offset", 0) is None


def test_the_guard_reads_the_consumers_committed_offsets_after_a_commit() -> None:
    consumer = SimpleNamespace(
        _committed_offset={TP(TOPIC, 2): 7}, highwater=lambda tp: 9 if tp.partition == 2 else 0
    )
    guard = OffsetGuard(SimpleNamespace(consumer=consumer))
    guard.lag.assigned((TOPIC, 2), 3)

    guard.on_commit(consumer)

    assert gauge("committed_offset", 2) == 7
    assert gauge("lag", 2) == 2
    guard.revoked((TOPIC, 2))
    assert gauge("lag", 2) is None


def test_a_partition_behind_with_no_commit_for_the_stall_time_is_a_reason_not_to_be_ready() -> None:
    clock = Clock()
    lag = ConsumerLag(clock=clock)
    ends = {(TOPIC, 2): 7, (TOPIC, 3): 3}
    lag.assigned((TOPIC, 2), 3)  # 4 records behind
    lag.assigned((TOPIC, 3), 3)  # caught up: idle is fine
    lag.refresh(lambda topic, partition: ends[(topic, partition)])

    clock.now += 299
    assert lag.stalled(after_s=300) is None, "busy, not stalled yet"
    clock.now += 2
    assert lag.stalled(after_s=300) == f"{TOPIC}/2 stalled: 4 records behind, no commit for 301s"

    lag.committed((TOPIC, 2), 5)  # progress, even if still behind
    assert lag.stalled(after_s=300) is None
    clock.now += 301
    lag.committed((TOPIC, 2), 7)
    lag.refresh(lambda topic, partition: ends[(topic, partition)])
    assert lag.stalled(after_s=300) is None, "caught up"
    lag.revoked((TOPIC, 2))
    lag.revoked((TOPIC, 3))


def test_an_idle_partition_that_just_got_a_record_is_not_stalled() -> None:
    clock = Clock()
    lag = ConsumerLag(clock=clock)
    ends = {(TOPIC, 4): 3}
    lag.assigned((TOPIC, 4), 3)  # caught up, and then idle for ten minutes
    lag.refresh(lambda topic, partition: ends[(topic, partition)])
    clock.now += 600

    ends[(TOPIC, 4)] = 4  # a record arrives; its activation takes a while
    lag.refresh(lambda topic, partition: ends[(topic, partition)])
    clock.now += 30
    assert lag.stalled(after_s=300) is None, "behind for 30 s only, however old the last commit"

    clock.now += 271  # still not committed 301 s after it arrived: stalled
    assert lag.stalled(after_s=300) == f"{TOPIC}/4 stalled: 1 records behind, no commit for 901s"
    lag.revoked((TOPIC, 4))
