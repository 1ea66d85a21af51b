"""A worker keeps its local table stores across a restart only if its last run stopped cleanly:
every changelog record it wrote was confirmed by Kafka.

A table write reaches the local RocksDB store at once and the changelog a moment later. A
process killed between the two (kill -9, OOM, a lost node with its volume kept) leaves writes
in the store that the changelog never got. Each partition's restore then reads the changelog
again from an offset behind those writes (service/keylane/kafka/restore_start.py) and lays
older records over some of them and not others. A key's state is one record, so it is either
back where the changelog has it (its input runs again) or ahead of it (its input, run again,
is a redelivery that writes the record again): either is whole. A key whose memory is paged
is a record and its pages (service/keylane/core/key_states.py), and the mix can pair a record
only this store holds with pages the restore took back: memory no activation left.

So a worker writes a marker (``.clean-stop`` in its data dir) once it stopped with nothing
unconfirmed and no produce failed, and removes it when it starts. A start that finds no
marker beside existing stores deletes them, and every partition restores from its
changelog alone: what Kafka Streams does with its stores after an unclean shutdown under
exactly-once. The cost is a full restore after a crash; a stop by signal keeps the stores.

The effector does not do this (service/keylane/stages/worker.py): its claims are one record
each, and a Done its store holds is written to the changelog again before its result is
republished, so what a crash left in its store saves a tool a second run.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import faust

from keylane.kafka.delivery import delivery_guard
from keylane.kafka.restore_start import owner_record_path

log = logging.getLogger(__name__)

CLEAN_STOP_MARKER = ".clean-stop"


def discard_stores_after_unclean_stop(app: faust.App, data_dir: Path) -> bool:
    """Before ``app`` starts: delete its table stores unless its last run stopped cleanly, and
    remove the marker, so that a crash of this run is seen by the next. Returns whether the
    stores were deleted."""
    marker = data_dir / CLEAN_STOP_MARKER
    stores = partition_stores(Path(app.conf.tabledir))
    unclean = not marker.exists() and bool(stores)
    if unclean:
        log.warning(
            "the last run with data dir %s did not stop cleanly (killed, or a produce failed): "
            "its table stores may hold writes their changelogs never got; deleting them, "
            "every partition restores from its changelog",
            data_dir,
        )
        for store in stores:
            shutil.rmtree(store)
            owner_record_path(store).unlink(missing_ok=True)  # what restore_start knew of it
    marker.unlink(missing_ok=True)
    return unclean


def partition_stores(tabledir: Path) -> list[Path]:
    """The RocksDB stores of the table partitions this data dir held (``<table>-<n>.db``).
    Not the rest: Faust makes an empty ``<table>-backups`` directory as it builds a table, so
    a fresh data dir has that before the first run ever wrote anything."""
    if not tabledir.is_dir():
        return []
    return sorted(path for path in tabledir.iterdir() if path.is_dir() and path.suffix == ".db")


def mark_clean_stop(app: faust.App, data_dir: Path) -> bool:
    """After ``app`` stopped: write the marker if every record it handed to the producer was
    confirmed and none failed. Returns whether it did."""
    guard = delivery_guard(app)
    if guard.failure is not None or guard.unconfirmed:
        log.warning(
            "stopping with %s records unconfirmed%s: the next start restores every table from its changelog",
            guard.unconfirmed,
            " after a produce failure" if guard.failure is not None else "",
        )
        return False
    (data_dir / CLEAN_STOP_MARKER).touch()
    return True
