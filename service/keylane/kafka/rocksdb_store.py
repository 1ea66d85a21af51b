"""A table's RocksDB store that writes each partition's persisted changelog offset in batches,
not once per acknowledged changelog record, and, for a worker, without RocksDB's write-ahead log.

Faust's RocksDB store puts the partition's changelog offset into its database at every ack of
the table's changelog records (``set_persisted_offset``): one more RocksDB write per state
write, and two more for a paged key's write (a page and a record,
service/keylane/core/key_states.py). Only the newest offset is ever read, and only the
running process reads it before a clean stop. So this store keeps the newest offset of each
partition and writes what it keeps once its ``offset_write_interval_s`` passed (0: in the
loop's next turn). A worker waits ``OFFSET_WRITE_INTERVAL_S``, one write a second per
partition at any rate: once per loop turn, the write still cost a RocksDB put for nearly
every record at full load. The effector writes in the next turn: its stores outlive a crash
(below).

``persisted_offset`` answers from what it keeps first, so every reader (Faust's recovery, the
samples of service/keylane/kafka/restore_start.py) sees what it saw before. Only the database
lags, by the interval at most, and only while the process runs:

* revoking a partition and stopping the store write what they keep first (Faust lets go of
  the databases then);
* a worker killed before a write loses its stores anyway: the stores of a worker that did
  not stop cleanly are deleted, and restored from the changelogs alone
  (service/keylane/kafka/clean_stop.py);
* the effector keeps its stores after a crash, for a Done its store holds that the changelog
  never got. A restore from an offset further back could lay that key's older claim over
  it, so its lag stays one loop turn, as before.

A worker's stores also skip RocksDB's write-ahead log (``write_ahead_log=False``). The log is
what lets a store reopened after a crash find the writes its memtable held; a worker never
reopens a store after a crash (clean_stop.py deletes them), so the log only cost every state
write an append to a file: about 4 µs a put, and a paged key's activation is two puts. What a
clean stop keeps must then be on disk without the log: revoking a partition and stopping the
store flush the memtables of the databases Faust lets go of, after writing the kept offsets,
so a reopened store holds every write and the offset that says how far they go. The
effector's stores outlive a crash and keep the log.
"""

from __future__ import annotations

import asyncio
from typing import Any

import rocksdict
from faust.stores.rocksdb import Store as FaustRocksDBStore
from faust.types import TP

OFFSET_WRITE_INTERVAL_S = 1.0
"""How long a worker's stores keep a set offset in memory before its database gets it."""


class RocksDBStore(FaustRocksDBStore):
    """Faust's RocksDB store, its persisted offsets written once per ``offset_write_interval_s``,
    its writes logged ahead only with ``write_ahead_log`` (module docstring)."""

    def __init__(
        self, offset_write_interval_s: float, *args: Any, write_ahead_log: bool = True, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.offset_write_interval_s = offset_write_interval_s
        self.write_ahead_log = write_ahead_log
        self._unwritten_offsets: dict[int, int] = {}
        """partition: the newest offset set, not in its database yet."""
        self._write_timer: asyncio.Handle | None = None

    def persisted_offset(self, tp: TP) -> int | None:
        unwritten = self._unwritten_offsets.get(tp.partition)
        if unwritten is not None:
            return unwritten
        offset: int | None = super().persisted_offset(tp)
        return offset

    def set_persisted_offset(self, tp: TP, offset: int) -> None:
        self._unwritten_offsets[tp.partition] = offset
        if self._write_timer is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop to wait on
            self.write_persisted_offsets()
            return
        interval = self.offset_write_interval_s
        self._write_timer = (
            loop.call_later(interval, self.write_persisted_offsets)
            if interval > 0
            else loop.call_soon(self.write_persisted_offsets)
        )

    def clear_persisted_offset(self, tp: TP) -> None:
        """Delete ``tp``'s persisted offset: its restore reads its changelog from the start."""
        self._unwritten_offsets.pop(tp.partition, None)
        self._db_for_partition(tp.partition).delete(self.offset_key)

    def write_persisted_offsets(self) -> None:
        """Write every kept offset to its partition's database."""
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None
        unwritten, self._unwritten_offsets = self._unwritten_offsets, {}
        for partition, offset in unwritten.items():
            self._db_for_partition(partition).put(self.offset_key, str(offset).encode())

    def _open_for_partition(self, partition: int) -> Any:
        db = super()._open_for_partition(partition)
        if not self.write_ahead_log:
            unlogged = rocksdict.WriteOptions()
            # A property at run time; rocksdict's stub declares it a method.
            unlogged.disable_wal = True  # type: ignore[method-assign,assignment]
            db.set_write_options(unlogged)
        return db

    def revoke_partitions(self, table: Any, tps: Any) -> None:
        self.write_persisted_offsets()
        if not self.write_ahead_log:
            revoked = {tp.partition for tp in tps if tp.topic in table.changelog_topic.topics}
            self._flush(db for partition, db in self._dbs.items() if partition in revoked)
        super().revoke_partitions(table, tps)

    async def stop(self) -> None:
        self.write_persisted_offsets()
        if not self.write_ahead_log:
            self._flush(self._dbs.values())
        await super().stop()

    @staticmethod
    def _flush(dbs: Any) -> None:
        """Write the memtables of ``dbs`` to disk: without the log, what a reopened store finds."""
        for db in list(dbs):
            db.flush(True)
