"""Owner epochs on the effector's claims (service/keylane/stages/effector/claims.py), broker-free:
every claim and Done carries the epoch its job started under, never lower than the record it
replaces, and a restore of the claims changelog skips a former owner's late claim that lands
after its successor's Done, which the owner then writes again."""

from __future__ import annotations

from types import SimpleNamespace

import msgspec

from keylane.kafka.epochs import EpochFence
from keylane.stages.effector.claims import ClaimRecord, ClaimStore, Done, InDoubt, claim_epoch_of
from tests.unit.kafka.test_epochs import Table
from tests.unit.stages.test_effector_handler import TTL_MS, intent, make_rig

INTENT = b"i-1"


def stored(table: dict[bytes, bytes], key: bytes = INTENT) -> ClaimRecord:
    return msgspec.msgpack.decode(table[key], type=ClaimRecord)


def test_claims_and_done_carry_the_jobs_epoch_and_never_lower_it() -> None:
    table: dict[bytes, bytes] = {}
    claims = ClaimStore(table)
    claims.claim("i-1", now_ms=0, lease_ms=10, epoch=7)
    assert stored(table).epoch == 7 and claim_epoch_of(table[INTENT]) == 7
    assert isinstance(claims.claim("i-1", now_ms=20, lease_ms=10, epoch=3), InDoubt)  # a former owner's job
    assert stored(table).epoch == 7
    claims.complete("i-1", b"result", now_ms=30, epoch=2)
    assert (stored(table).state, stored(table).epoch) == ("done", 7)
    claims.complete("i-2", b"result", now_ms=30, epoch=9)
    assert stored(table, b"i-2").epoch == 9


def test_a_record_written_before_epochs_reads_as_epoch_zero() -> None:
    old = msgspec.msgpack.encode({"state": "done", "claimed_at_ms": 1, "lease_until_ms": 0, "result": b"r"})
    assert claim_epoch_of(old) == 0
    assert ClaimStore({INTENT: old}).claim("i-1", now_ms=5, lease_ms=1) == Done(b"r")
    assert claim_epoch_of(b"\xc1 not msgpack") is None


async def test_the_handler_writes_the_epoch_read_as_its_job_started() -> None:
    rig = make_rig()
    generation = [4]
    rig.handler.epoch = lambda: generation[0]
    await rig.deliver(intent())
    record = stored(rig.table)
    assert (record.state, record.epoch) == ("done", 4)
    assert rig.io.results()[0].status == "OK" and len(rig.calls) == 1
    generation[0] = 5
    await rig.deliver(intent(), offset=1)  # a copy, under the next generation: republished
    assert stored(rig.table).epoch == 5 and len(rig.calls) == 1


def change(offset: int, record: ClaimRecord, key: bytes = INTENT) -> SimpleNamespace:
    value = msgspec.msgpack.encode(record)
    return SimpleNamespace(message=SimpleNamespace(partition=0, key=key, value=value, offset=offset))


def test_a_restore_keeps_the_successors_done_over_a_late_claim_and_the_owner_writes_it_again() -> None:
    table = Table()
    owned: set[int] = set()
    fence = EpochFence(table, claim_epoch_of, owns=owned.__contains__)
    fence.install()
    claimed_by_zombie = ClaimRecord(state="claimed", claimed_at_ms=100, lease_until_ms=100 + TTL_MS, epoch=5)
    done_by_successor = ClaimRecord(state="done", claimed_at_ms=200, result=b"answer", epoch=6)
    # The successor's Done, then the former owner's claim that was on its way when it stood still.
    table.apply_changelog_batch([change(0, done_by_successor), change(1, claimed_by_zombie)])
    restored = ClaimStore(table.data._db_for_partition(0))
    assert restored.claim("i-1", now_ms=10**9, lease_ms=1) == Done(b"answer"), "not in doubt"
    assert fence.heal() == 0 and table.sent == []  # not this worker's partition
    owned.add(0)
    assert fence.heal() == 1
    ((partition, key, value),) = table.sent
    assert (partition, key) == (0, INTENT)
    assert msgspec.msgpack.decode(value, type=ClaimRecord) == done_by_successor
