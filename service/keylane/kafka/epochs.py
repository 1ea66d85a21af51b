"""Owner epochs: a state write from a partition's former owner never overwrites its successor's.

A worker paused past its session timeout (GC, a stopped VM, ``kill -STOP``) is evicted from
the group and its partitions move; when it resumes, its in-flight jobs still write their keys'
state to the changelog before it notices. So do jobs cancelled at a revocation whose writes
were already on their way. Such a late record can land after the new owner's records for the
same key, and a restore (the next owner, a standby, a lost volume) would take the last one:
the key's state would go back, and inputs the new owner applied would be forgotten.

Each state blob therefore carries the *epoch* of the owner that wrote it: the consumer
group's generation when the writing worker was assigned the partition (Kafka's own fencing
token for group membership: every rebalance increases it, and an evicted member keeps its
old one until it rejoins). A lane job reads the generation when it starts (a job that
outlives its partition's revocation keeps the epoch it started under), and the state it
commits carries max(that epoch, the epoch of the state it read), so the epoch of a key never
goes down, even if the group's generation were ever to start over. With Kafka's eager
rebalancing a member's partitions are revoked before it joins the next generation, so no job
of a partition's former owner starts under the epoch its successor holds it in.

Restoring a state changelog (``EpochFence``) applies a record only if its epoch is at least
the epoch of what is stored for its key: a late write from a smaller epoch is skipped.
Because compaction keeps a key's *last* record, a skipped record is also remembered while it
is its key's last one, and once this worker owns the partition (its recovery done) it writes
the key's restored value again (``heal``), so the log's last record for the key is the
owner's once more; each such key is counted in ``keylane_stale_state_writes_total`` and
logged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from faust.types import TP

from keylane import metrics

log = logging.getLogger(__name__)

EpochOf = Callable[[bytes], int | None]
"""The epoch a stored value carries; None when the value does not say (unreadable)."""


def group_generation(app: Any) -> int:
    """The consumer group generation the app's consumer is in now (-1 while it is not a
    member: evicted, or rejoining). Read from the aiokafka consumer in Faust's consumer
    thread (service/keylane/kafka/patches.py lists this internal)."""
    thread = getattr(app.consumer, "_thread", None)
    consumer = getattr(thread, "_consumer", None) if thread is not None else None
    coordinator = getattr(consumer, "_coordinator", None) if consumer is not None else None
    generation = getattr(coordinator, "generation", -1) if coordinator is not None else -1
    return int(generation)


def request_rejoin(app: Any) -> None:
    """Make the app's consumer rejoin its group now (from any thread): the rebalance revokes
    and reassigns every partition. Runs aiokafka's ``request_rejoin`` on the consumer thread's
    loop (service/keylane/kafka/patches.py lists this internal)."""
    thread = app.consumer._thread
    coordinator = thread._consumer._coordinator
    thread.thread_loop.call_soon_threadsafe(coordinator.request_rejoin)


class EpochFence:
    """Restores of one table keep each key's newest-epoch value (module docstring)."""

    def __init__(self, table: Any, epoch_of: EpochOf, *, owns: Callable[[int], bool]) -> None:
        self.table = table
        self.epoch_of = epoch_of
        self.owns = owns
        self.stale: dict[tuple[int, bytes], int] = {}
        """(partition, key) whose last changelog record is a skipped late write -> its epoch."""

    def install(self) -> None:
        """Wrap the table's public ``apply_changelog_batch`` (used by recovery and standbys)."""
        apply = self.table.apply_changelog_batch

        def apply_newest(batch: Iterable[Any]) -> None:
            apply(self.newest(batch))

        self.table.apply_changelog_batch = apply_newest

    def newest(self, batch: Iterable[Any]) -> list[Any]:
        """The events of ``batch`` that do not go back in epoch for their key."""
        kept: list[Any] = []
        latest: dict[tuple[int, bytes], int | None] = {}
        for event in batch:
            message = event.message
            where = (message.partition, message.key)
            if message.value is None:
                latest[where] = None
                self.stale.pop(where, None)
                kept.append(event)
                continue
            epoch = self.epoch_of(message.value)
            current = latest[where] if where in latest else self._stored_epoch(*where)
            if epoch is not None and current is not None and epoch < current:
                # Counted and logged only if it stays the key's last record (``heal``): a
                # restore that starts before values the store holds already (a rewound one,
                # service/keylane/kafka/restore_start.py) meets their older records first.
                self.stale[where] = epoch
                log.debug(
                    "skipped a state write for %r (changelog partition %s, offset %s): its epoch %s "
                    "is older than the stored %s",
                    message.key,
                    message.partition,
                    message.offset,
                    epoch,
                    current,
                )
                continue
            latest[where] = epoch if epoch is not None else current
            self.stale.pop(where, None)
            kept.append(event)
        return kept

    def heal(self) -> int:
        """Write again the stored value of every key whose last changelog record is a
        skipped late write, on the partitions this worker owns (each counted in
        ``keylane_stale_state_writes_total`` and logged); returns how many."""
        healed = 0
        for (partition, key), epoch in list(self.stale.items()):
            if not self.owns(partition):
                continue
            del self.stale[(partition, key)]
            value = self._stored(partition, key)
            if value is None:
                continue
            self.table.send_changelog(partition, key, value, key_serializer="raw", value_serializer="raw")
            healed += 1
            metrics.STALE_STATE_WRITES.inc()
            log.warning(
                "the last changelog record of %r (partition %s) is a former owner's late write, epoch %s "
                "older than the stored %s: the restore skipped it, and the owner wrote the key again",
                key,
                partition,
                epoch,
                self.epoch_of(value),
            )
        return healed

    def _stored(self, partition: int, key: bytes) -> bytes | None:
        value: bytes | None = self.table.data._db_for_partition(partition).get(key)
        return value

    def _stored_epoch(self, partition: int, key: bytes) -> int | None:
        value = self._stored(partition, key)
        return None if value is None else self.epoch_of(value)


def owns_partition(app: Any, topic: str) -> Callable[[int], bool]:
    """Whether the app's consumer is assigned ``partition`` of ``topic`` (an active one)."""

    def owns(partition: int) -> bool:
        return TP(topic, partition) in app.consumer.assignment()

    return owns
