"""A table's RocksDB store that writes each partition's persisted changelog offset once per
turn of the event loop, not once per acknowledged changelog record.

Faust's RocksDB store puts the partition's changelog offset into its database at every ack of
the table's changelog records (``set_persisted_offset``): one more RocksDB write per state
write, and two more for a paged key's write (a page and a record,
service/keylane/core/key_states.py). Only the newest offset is ever read, and the acks of one
produce response all run in one turn of the event loop. So this store keeps the newest offset
of each partition and writes it once, in the loop's next turn.

``persisted_offset`` answers from what it keeps first, so every reader (Faust's recovery, the
samples of service/keylane/kafka/restore_start.py) sees what it saw before. Only the database
lags, by one turn of the loop at most, and only while the worker runs:

* revoking a partition and stopping the store write what they keep first (Faust lets go of
  the databases then);
* a worker killed before a write loses its stores anyway: the stores of a worker that did
  not stop cleanly are deleted, and restored from the changelogs alone
  (service/keylane/kafka/clean_stop.py);
* were the database's offset behind anyway, a restore would read a few records again: the same
  values, in the same order.
"""

from __future__ import annotations

import asyncio
from typing import Any

from faust.stores.rocksdb import Store as FaustRocksDBStore
from faust.types import TP


class RocksDBStore(FaustRocksDBStore):
    """Faust's RocksDB store, its persisted offsets written once per loop turn (module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._unwritten_offsets: dict[int, int] = {}
        """partition: the newest offset set, not in its database yet."""
        self._write_scheduled = False

    def persisted_offset(self, tp: TP) -> int | None:
        unwritten = self._unwritten_offsets.get(tp.partition)
        if unwritten is not None:
            return unwritten
        offset: int | None = super().persisted_offset(tp)
        return offset

    def set_persisted_offset(self, tp: TP, offset: int) -> None:
        self._unwritten_offsets[tp.partition] = offset
        if self._write_scheduled:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop turn to wait for
            self.write_persisted_offsets()
            return
        self._write_scheduled = True
        loop.call_soon(self.write_persisted_offsets)

    def clear_persisted_offset(self, tp: TP) -> None:
        """Delete ``tp``'s persisted offset: its restore reads its changelog from the start."""
        self._unwritten_offsets.pop(tp.partition, None)
        self._db_for_partition(tp.partition).delete(self.offset_key)

    def write_persisted_offsets(self) -> None:
        """Write every kept offset to its partition's database."""
        self._write_scheduled = False
        unwritten, self._unwritten_offsets = self._unwritten_offsets, {}
        for partition, offset in unwritten.items():
            self._db_for_partition(partition).put(self.offset_key, str(offset).encode())

    def revoke_partitions(self, table: Any, tps: Any) -> None:
        self.write_persisted_offsets()
        super().revoke_partitions(table, tps)

    async def stop(self) -> None:
        self.write_persisted_offsets()
        await super().stop()
