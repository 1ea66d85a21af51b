"""Consumer lag of an app's guarded input partitions, as gauges (docs/operations.md, "Lag").

For each input partition assigned to this process (the offset guard's topics,
service/keylane/kafka/offset_guard.py):

* ``keylane_consumer_committed_offset``: the group's committed offset. Set when the partition
  is assigned (what the group coordinator answered, or the offset reading starts from when
  nothing is committed yet), then after each commit Faust makes: a Faust Sensor's
  ``on_commit_completed`` (public API) hands the consumer to the guard, which reads the
  offsets the consumer now holds as committed;
* ``keylane_consumer_last_commit_timestamp_seconds``: the unix time a commit last advanced
  it; the time of the assignment until this process commits the partition (Kafka keeps no
  commit times the group could be asked for);
* ``keylane_consumer_lag``: the consumer's high watermark of the partition (the log end its
  fetches saw) minus the committed offset, recomputed on every commit and every
  ``LAG_REFRESH_S``. Absent until the first fetch of the partition told the consumer its end.

The series of a revoked partition are removed: a partition is exported by its owner only.
All of it runs on the app's event loop.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import faust

from keylane import metrics

LAG_REFRESH_S = 2.0
"""How often the lag gauges follow the log end between commits."""
STALLED_AFTER_S = 300.0
"""A partition with records behind its committed offset and no commit advancing it for this
long is stalled: the process stops being ready (/readyz), as the KeylanePartitionStalled
alert fires (deploy/prometheus/rules/keylane.rules.yml). Longer than any activation may run."""

TopicPartition = tuple[str, int]


class ConsumerLag:
    """The three ``keylane_consumer_*`` gauges of the partitions assigned now."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._committed: dict[TopicPartition, int] = {}
        self._lag: dict[TopicPartition, int] = {}
        self._advanced_at: dict[TopicPartition, float] = {}
        self._behind_since: dict[TopicPartition, float] = {}
        self._clock = clock

    def partitions(self) -> list[TopicPartition]:
        """The partitions exported now (assigned, not revoked since)."""
        return list(self._committed)

    def assigned(self, tp: TopicPartition, committed: int) -> None:
        """``tp`` is (again) ours, its committed offset (or starting offset) ``committed``."""
        self._committed[tp] = committed
        self._advanced_at[tp] = self._clock()
        labels = _labels(tp)
        metrics.CONSUMER_COMMITTED_OFFSET.labels(*labels).set(committed)
        metrics.CONSUMER_LAST_COMMIT.labels(*labels).set(self._advanced_at[tp])

    def committed(self, tp: TopicPartition, offset: int | None) -> None:
        """The consumer holds ``offset`` as ``tp``'s committed offset now; a commit that
        advanced it moves the gauges."""
        known = self._committed.get(tp)
        if known is None or offset is None or offset <= known:
            return
        self._committed[tp] = offset
        self._advanced_at[tp] = self._clock()
        labels = _labels(tp)
        metrics.CONSUMER_COMMITTED_OFFSET.labels(*labels).set(offset)
        metrics.CONSUMER_LAST_COMMIT.labels(*labels).set(self._advanced_at[tp])

    def refresh(self, log_end: Callable[[str, int], int | None]) -> None:
        """Recompute each partition's lag from its log end (``log_end(topic, partition)``,
        None when the consumer does not know it yet)."""
        for tp, committed in self._committed.items():
            end = log_end(*tp)
            if end is not None:
                self._lag[tp] = max(0, end - committed)
                metrics.CONSUMER_LAG.labels(*_labels(tp)).set(self._lag[tp])
                if self._lag[tp] == 0:
                    self._behind_since.pop(tp, None)
                else:
                    self._behind_since.setdefault(tp, self._clock())

    def stalled(self, after_s: float = STALLED_AFTER_S) -> str | None:
        """Why this process is stalled (the first partition that has been behind its log end,
        with no commit advancing it, for ``after_s``), or None. A partition idle for longer
        than that which just got a record is not stalled: it has been behind only since then.
        Read from the metrics server's thread: it copies before it iterates."""
        now = self._clock()
        for tp, lag in list(self._lag.items()):
            idle_s = now - self._advanced_at.get(tp, now)
            behind_s = now - self._behind_since.get(tp, now)
            if lag > 0 and min(idle_s, behind_s) > after_s:
                return f"{tp[0]}/{tp[1]} stalled: {lag} records behind, no commit for {idle_s:.0f}s"
        return None

    def revoked(self, tp: TopicPartition) -> None:
        """``tp`` is no longer ours: its series go (its next owner exports them)."""
        self._lag.pop(tp, None)
        self._advanced_at.pop(tp, None)
        self._behind_since.pop(tp, None)
        if self._committed.pop(tp, None) is None:
            return
        labels = _labels(tp)
        for gauge in (metrics.CONSUMER_LAG, metrics.CONSUMER_COMMITTED_OFFSET, metrics.CONSUMER_LAST_COMMIT):
            with contextlib.suppress(KeyError):  # the lag of a partition whose end was never known
                gauge.remove(*labels)


class CommitSensor(faust.Sensor):
    """A Faust sensor that calls ``on_commit(consumer)`` after each commit the consumer made."""

    def __init__(self, on_commit: Callable[[object], None]) -> None:
        super().__init__()
        self._on_commit = on_commit

    def on_commit_completed(self, consumer: object, state: object) -> None:
        self._on_commit(consumer)


def _labels(tp: TopicPartition) -> tuple[str, str]:
    return metrics.topic_label(tp[0]), str(tp[1])
