"""The effector's dedup store: one claim record per intent id, in its own RocksDB table.

``claim`` answers one of five, checked in this order:

* ``Done`` — the intent was answered before: republish the stored (signed) result, never
  run it again. Checked first, so a Done intent gets its one answer even after its expiry;
* ``InFlight`` — another attempt holds a live lease: wait for it, never run in parallel.
  Checked before expiry: the holder may still answer OK, and its answer is the answer;
* ``Expired`` — nobody ever claimed it and ``expires_at_ms`` is at or before now: answer
  EXPIRED. Nothing is written;
* ``InDoubt`` — an earlier attempt claimed it and never recorded Done, and its lease is
  over: it may have taken effect. The intent is claimed again (a fresh lease) for the
  caller to settle (reconcile hook or in_doubt policy, see service/keylane/authoring/tools.py);
* ``Claimed`` — nobody held it: it is ours now, with a fresh lease.

A lease is the longest an attempt can take plus a margin, so it runs out only after any
earlier attempt has finished or died. The margin also absorbs clock skew between effector
hosts: a lease is written with one host's clock and read with another's.

The table is a Faust table, read and written in the partition of the record being handled,
so a claim is global by intent id only if every copy of an intent is handled in one
partition: the effector re-routes each intent to its key's partition first (service.py).

Every record carries the owner epoch of the effector that wrote it (its consumer group
generation when the job started, as the agent's state does: service/keylane/kafka/epochs.py),
and never a smaller one than the record it replaces. A restore skips a late claim from a
former owner (an effector that stood still past its session timeout with the claim on its
way) that lands after its successor's Done: without that, the claim would come back, and a
copy of the intent would find it in doubt instead of answered.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Literal

import msgspec

from keylane.core.state import epoch_of


class ClaimRecord(msgspec.Struct, kw_only=True):
    """The stored value: ``claimed`` with a lease, or ``done`` with the encoded result."""

    state: Literal["claimed", "done"]
    claimed_at_ms: int
    lease_until_ms: int = 0
    result: bytes = b""  # the encoded (and, with keys, signed) ToolResult, once done
    epoch: int = 0  # the writer's owner epoch (module docstring); 0 in records written before it


@dataclass(frozen=True)
class Claimed:
    """Nobody held the intent: it is ours now."""


@dataclass(frozen=True)
class InDoubt:
    """An attempt claimed at ``claimed_at_ms`` never recorded Done; it is ours now, in doubt."""

    claimed_at_ms: int


@dataclass(frozen=True)
class InFlight:
    """Another attempt holds the intent until ``lease_until_ms``."""

    lease_until_ms: int


@dataclass(frozen=True)
class Expired:
    """Never claimed, and past its expiry: answer EXPIRED without running it."""


@dataclass(frozen=True)
class Done:
    """Answered before; ``result`` is the encoded ToolResult to republish, byte for byte."""

    result: bytes


ClaimOutcome = Done | InFlight | Expired | InDoubt | Claimed
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(ClaimRecord)


claim_epoch_of = epoch_of
"""The owner epoch a stored claim record carries (0 before records had one), None when it does
not decode: a claim record keeps it in a top-level ``epoch`` field, as a key's state does."""


class ClaimStore:
    """Claims over any mutable mapping of bytes (a Faust table in the effector)."""

    def __init__(self, table: MutableMapping[bytes, bytes]) -> None:
        self._table = table

    def claim(
        self,
        intent_id: str,
        *,
        now_ms: int,
        lease_ms: int,
        expires_at_ms: int | None = None,
        epoch: int = 0,
    ) -> ClaimOutcome:
        """The intent's state, in the order of the module docstring; ``Claimed`` and
        ``InDoubt`` write a claim leased until ``now_ms + lease_ms``, under the job's owner
        ``epoch`` (or the stored record's, if larger)."""
        key = intent_id.encode()
        raw = self._table.get(key)
        record = _decoder.decode(raw) if raw else None
        if record is not None and record.state == "done":
            return Done(record.result)
        if record is not None and now_ms < record.lease_until_ms:
            return InFlight(record.lease_until_ms)
        if record is None and expires_at_ms is not None and expires_at_ms <= now_ms:
            return Expired()
        self._table[key] = _encoder.encode(
            ClaimRecord(
                state="claimed",
                claimed_at_ms=now_ms,
                lease_until_ms=now_ms + lease_ms,
                epoch=max(epoch, record.epoch if record is not None else 0),
            )
        )
        return Claimed() if record is None else InDoubt(record.claimed_at_ms)

    def answered(self, intent_id: str) -> bool:
        """Whether the intent has its one answer (Done); reads only, writes nothing."""
        raw = self._table.get(intent_id.encode())
        if not raw:
            return False
        return _decoder.decode(raw).state == "done"

    def complete(self, intent_id: str, result: bytes, *, now_ms: int, epoch: int = 0) -> None:
        """Record the intent's one answer; every later ``claim`` returns it as ``Done``."""
        key = intent_id.encode()
        stored = self._table.get(key)
        floor = (claim_epoch_of(stored) or 0) if stored else 0
        self._table[key] = _encoder.encode(
            ClaimRecord(state="done", claimed_at_ms=now_ms, result=result, epoch=max(epoch, floor))
        )
