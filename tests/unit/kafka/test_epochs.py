"""Owner epochs, broker-free: a committed state carries the epoch its input was processed
under (never lower than before), and a changelog restore skips a late write of a smaller epoch
and remembers it for the owner to write over."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from msgspec.structs import replace

from keylane.authoring.api import AgentConfig, Complete
from keylane.authoring.context import ActivationContext
from keylane.core.state import KeyState, decode_state, encode_state, epoch_of
from keylane.kafka.epochs import EpochFence
from keylane.testing import AgentHarness, ManualClock

KEY = b"k"


async def counts(ctx: ActivationContext) -> Complete:
    n = ctx.memory.get("n", 0) + 1
    ctx.memory.set("n", n)
    return Complete(str(n).encode())


async def test_a_commit_carries_its_records_epoch_and_never_lowers_it() -> None:
    harness = AgentHarness(counts, AgentConfig(), clock=ManualClock())
    await harness.send_event(KEY, "a")
    assert harness.state(KEY).epoch == 0

    record = replace(harness.records[-1], offset=1, epoch=7)
    await harness.redeliver(record)
    assert harness.state(KEY).epoch == 7

    await harness.redeliver(replace(record, offset=2, epoch=3))  # a former owner's job
    assert harness.state(KEY).epoch == 7
    assert harness.state(KEY).memory.entries["n"].value == 3


class Store:
    """RocksDB partitions as Faust's store exposes them to the fence: ``_db_for_partition``."""

    def __init__(self) -> None:
        self.dbs: dict[int, dict[bytes, bytes]] = {}

    def _db_for_partition(self, partition: int) -> dict[bytes, bytes]:
        return self.dbs.setdefault(partition, {})


class Table:
    """The two table methods the fence uses, applying batches the way Faust's store does."""

    def __init__(self) -> None:
        self.data = Store()
        self.sent: list[tuple[int, bytes, bytes]] = []

    def apply_changelog_batch(self, batch: Any) -> None:
        for event in batch:
            db = self.data._db_for_partition(event.message.partition)
            if event.message.value is None:
                db.pop(event.message.key, None)
            else:
                db[event.message.key] = event.message.value

    def send_changelog(self, partition: int, key: bytes, value: bytes, **_: Any) -> None:
        self.sent.append((partition, key, value))


def record(offset: int, epoch: int, seq: int, key: bytes = KEY) -> SimpleNamespace:
    blob = encode_state(KeyState(seq=seq, epoch=epoch))
    return SimpleNamespace(message=SimpleNamespace(partition=0, key=key, value=blob, offset=offset))


def test_a_restore_skips_a_late_write_of_a_smaller_epoch_and_the_owner_writes_over_it() -> None:
    table = Table()
    owned: set[int] = set()
    fence = EpochFence(table, epoch_of, owns=owned.__contains__)
    fence.install()

    table.apply_changelog_batch([record(0, 5, 1), record(1, 6, 2)])
    table.apply_changelog_batch([record(2, 5, 9), record(3, 6, 3, key=b"other")])  # 2: the former owner's

    assert decode_state(table.data.dbs[0][KEY]).seq == 2
    assert fence.stale == {(0, KEY): 5}
    assert fence.heal() == 0, "only the partition's owner writes over it"
    owned.add(0)
    assert fence.heal() == 1
    assert [(p, k, decode_state(v).seq) for p, k, v in table.sent] == [(0, KEY, 2)]
    assert fence.stale == {}


def test_an_equal_epoch_applies_in_log_order_and_a_newer_record_clears_the_stale_mark() -> None:
    table = Table()
    fence = EpochFence(table, epoch_of, owns=lambda _: True)
    fence.install()

    table.apply_changelog_batch([record(0, 6, 1), record(1, 4, 7), record(2, 6, 2)])

    assert decode_state(table.data.dbs[0][KEY]).seq == 2
    assert fence.stale == {}
    assert fence.heal() == 0


def test_an_unreadable_value_is_applied_as_it_is() -> None:
    table = Table()
    fence = EpochFence(table, epoch_of, owns=lambda _: True)
    fence.install()
    garbage = SimpleNamespace(message=SimpleNamespace(partition=0, key=KEY, value=b"\xc1", offset=1))

    table.apply_changelog_batch([record(0, 6, 1), garbage])

    assert table.data.dbs[0][KEY] == b"\xc1", "left for the poison-state quarantine to report"
