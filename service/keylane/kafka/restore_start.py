"""Where a table partition's restore starts: at the local store's offset only when this worker
held the partition without a break, otherwise at the last offset it knows it had read
everything up to.

Faust restores a table partition, active or standby, from the offset its local RocksDB store
last persisted, and that offset advances on the acks of the worker's own changelog writes as
well as on the records a restore reads. A worker that stood still past its session timeout
(GC, a stopped VM, ``kill -STOP``) keeps its producer: when it resumes, writes it had on their
way land after its successor's records, and their acks move its persisted offset past records
it never read. When the partition comes back to it (a rebalance, a restart on the same
volume), Faust reads from after those records, and the keys its successor wrote go back to
the zombie's values: the epoch fence (service/keylane/kafka/epochs.py) never sees the
successor's records to prefer them.

So beside each partition's store this worker keeps a small record (``<partition dir>.owner``):
the last consumer group generation in which it was assigned the partition (active or
standby) and the *base*, an offset up to which it read or wrote every record there is. The
base is the store's offset when an assignment begins (as chosen below), and moves up at each
offset commit the group coordinator accepts: the store's offsets are sampled as the commit
starts, and a commit accepted under the generation they were sampled in proves that this
worker was still the partition's owner after every write acked by then (Kafka Streams
checkpoints at commits too). At each assignment in generation G:

* held in G or G-1 (a static member back in the same generation, or a rebalance that kept
  the partition here): no one else held it since, so the store's offset stands;
* otherwise (it was away, or the store has no record: written before keylane kept one, or
  a fresh directory): the restore starts at the base, or at the log start without one, and
  reads again whatever was written since, in order; where owners disagree on a key, the
  epoch fence keeps the newest owner's value.

An ack advances the store's offset only while the partition is this worker's active
assignment: a write of its own acknowledged after a revocation is read back, in order, by its
next restore of the partition.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import faust
from faust.types import TP

from keylane.kafka.epochs import group_generation

log = logging.getLogger(__name__)


def owner_record_path(store: Path) -> Path:
    """The file beside a partition's store directory that says when this worker held it."""
    return store.with_name(f"{store.name}.owner")


@dataclass(frozen=True)
class Held:
    """When this worker last held a partition, and the offset its store had read up to then."""

    generation: int
    base: int | None


def start_offset(held: Held | None, persisted: int | None, generation: int) -> int | None:
    """The offset a restore in ``generation`` may trust the store to hold everything up to
    (None: read from the log start), given when the partition was last held here."""
    if held is not None and generation - 1 <= held.generation <= generation:
        return persisted
    return held.base if held is not None else None


class RestoreStart:
    """Chooses the restore start of one table's partitions (module docstring)."""

    def __init__(self, table: Any, app: Any) -> None:
        self.table = table
        self.app = app
        self.generation = -1
        """The generation of this worker's current assignment (-1 between assignments)."""
        self.assigned: set[int] = set()
        """The table's partitions assigned to this worker in it, active or standby."""
        self.active: set[int] = set()
        self._sampled: tuple[int, dict[int, int | None]] | None = None
        self._released: tuple[int, dict[int, int | None]] | None = None
        """The offsets of the partitions revoked last, sampled as they went (acks stop moving
        them then), and the generation: the next accepted commit in it seals them."""
        self._written: dict[int, Held] = {}

    def install(self) -> None:
        """Wrap the table instance's ``on_rebalance`` (called before Faust's recovery reads
        the stores' offsets) and the ack callback its changelog sends use, the app's table
        manager's ``on_partitions_revoked`` and ``on_commit`` (called after a commit the
        coordinator accepted), and sample the offsets as each commit starts (a sensor)."""
        on_rebalance = self.table.on_rebalance
        on_changelog_sent = self.table._on_changelog_sent
        tables = self.app.tables
        on_partitions_revoked = tables.on_partitions_revoked
        on_commit = tables.on_commit

        async def on_rebalance_held(
            assigned: Any, revoked: Any, newly_assigned: Any, generation_id: int = 0
        ) -> None:
            await on_rebalance(assigned, revoked, newly_assigned, generation_id)
            self.on_assigned(assigned, self.app.assignor.assigned_actives(), generation_id)

        def on_changelog_sent_while_active(fut: Any) -> None:
            if fut.result().topic_partition.partition in self.active:
                on_changelog_sent(fut)

        def on_partitions_revoked_released(revoked: Any) -> None:
            self.on_revoked(revoked)
            on_partitions_revoked(revoked)

        def on_commit_sealed(offsets: Any) -> None:
            on_commit(offsets)
            self.seal()

        self.table.on_rebalance = on_rebalance_held
        self.table._on_changelog_sent = on_changelog_sent_while_active
        tables.on_partitions_revoked = on_partitions_revoked_released
        tables.on_commit = on_commit_sealed
        self.app.sensors.add(_CommitSampler(self.sample, self.forget_sample))

    def on_assigned(self, tps: Iterable[TP], actives: Iterable[TP], generation: int) -> None:
        """Set the restore start of each of this table's partitions among ``tps``, assigned to
        this worker in ``generation`` (``actives``: the active ones), and remember that it
        holds them."""
        changelog = self._changelog()
        self.generation = generation
        self._released = None
        self.assigned = {tp.partition for tp in tps if tp.topic == changelog}
        self.active = {tp.partition for tp in actives if tp.topic == changelog}
        for partition in sorted(self.assigned):
            tp = TP(changelog, partition)
            held = self._held(partition)
            persisted = self.table.data.persisted_offset(tp)
            start = start_offset(held, persisted, generation)
            if start != persisted:
                self._set_persisted(tp, start)
                log.info(
                    "%s/%s: last held in generation %s, now %s: its restore reads from %s, not from "
                    "the store's offset %s (a former owner may have written since)",
                    tp.topic,
                    tp.partition,
                    held.generation if held is not None else "(no record)",
                    generation,
                    "the log start" if start is None else f"after offset {start}",
                    persisted,
                )
            self._remember(partition, Held(generation, start))

    def on_revoked(self, tps: Iterable[TP]) -> None:
        """The partitions among ``tps`` are no longer this worker's: acks stop moving their
        offsets, which are sampled now for the next commit to seal (Faust revokes every
        partition before its last commit when it stops, and keylane commits a rebalance's
        revoked partitions after Faust revoked them)."""
        changelog = self._changelog()
        gone = {tp.partition for tp in tps if tp.topic == changelog}
        self.active -= gone
        self.assigned -= gone
        self._released = (self.generation, self._offsets(gone)) if gone else None

    def sample(self) -> None:
        """As a commit starts: the store's offset of each partition held now."""
        self._sampled = (self.generation, self._offsets(self.assigned))

    def forget_sample(self) -> None:
        """As a commit ends, accepted (sealed by then) or not."""
        self._sampled = None

    def seal(self) -> None:
        """After the coordinator accepted a commit: the offsets sampled as it started, and
        those of the partitions revoked before it, all in the generation the commit was made
        in, become the partitions' bases."""
        sampled, self._sampled = self._sampled, None
        released, self._released = self._released, None
        now = group_generation(self.app)
        for taken in (released, sampled):
            if taken is None:
                continue
            generation, offsets = taken
            if generation < 0 or generation != now:
                continue
            for partition, offset in offsets.items():
                self._remember(partition, Held(generation, offset))

    def _offsets(self, partitions: Iterable[int]) -> dict[int, int | None]:
        """The store's persisted offset of each of ``partitions``."""
        changelog = self._changelog()
        return {p: self.table.data.persisted_offset(TP(changelog, p)) for p in partitions}

    def _changelog(self) -> str:
        name: str = self.table.changelog_topic.get_topic_name()
        return name

    def _record_path(self, partition: int) -> Path:
        directory: Path = self.table.data.partition_path(partition)
        return owner_record_path(directory)

    def _held(self, partition: int) -> Held | None:
        try:
            raw = json.loads(self._record_path(partition).read_text())
            base = raw["base"]
            return Held(int(raw["generation"]), None if base is None else int(base))
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError, OSError):
            path = self._record_path(partition)
            log.warning("unreadable %s: its partition restores from the log start", path)
            return None

    def _remember(self, partition: int, held: Held) -> None:
        if self._written.get(partition) == held:
            return  # most commits find the offsets where the last one left them
        path = self._record_path(partition)
        temporary = path.with_name(f"{path.name}.tmp")
        temporary.write_text(json.dumps({"generation": held.generation, "base": held.base}))
        os.replace(temporary, path)  # a kill -9 leaves the old record or the new one
        self._written[partition] = held

    def _set_persisted(self, tp: TP, offset: int | None) -> None:
        store = self.table.data
        if offset is not None:
            store.set_persisted_offset(tp, offset)
        else:
            store.clear_persisted_offset(tp)


class _CommitSampler(faust.Sensor):
    """A Faust sensor that calls ``started()`` as each commit of the consumer starts and
    ``ended()`` once it ended (after the table manager's ``on_commit`` if it was accepted)."""

    def __init__(self, started: Callable[[], None], ended: Callable[[], None]) -> None:
        super().__init__()
        self._commit_started = started
        self._commit_ended = ended

    def on_commit_initiated(self, consumer: object) -> None:
        self._commit_started()

    def on_commit_completed(self, consumer: object, state: object) -> None:
        self._commit_ended()
