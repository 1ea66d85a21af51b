"""The effector's dedup store: one claim record per intent id, in its own RocksDB table.

``claim`` answers one of three:

* ``Claimed`` — nobody holds the intent (or the holder's lease ran out): it is ours now;
* ``InFlight`` — another attempt holds a live lease: wait for it, never run in parallel;
* ``Done`` — it ran before: republish the stored result, never run it again.

A lease is the tool timeout plus a margin, so a lease can only run out after any previous
execution has finished or been abandoned. An effector killed after the tool ran but before
``Done`` was recorded runs the tool again once the lease expires: tools that must not repeat
should use the intent id they receive as an idempotency key.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Literal

import msgspec


class ClaimRecord(msgspec.Struct, kw_only=True):
    state: Literal["claimed", "done"]
    claimed_at_ms: int
    lease_until_ms: int = 0
    result: bytes = b""  # the encoded ToolResult, once done


@dataclass(frozen=True)
class Claimed:
    pass


@dataclass(frozen=True)
class InFlight:
    lease_until_ms: int


@dataclass(frozen=True)
class Done:
    result: bytes


ClaimOutcome = Claimed | InFlight | Done
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(ClaimRecord)


class ClaimStore:
    """Claims over any mutable mapping of bytes (a Faust table in the effector)."""

    def __init__(self, table: MutableMapping[bytes, bytes]) -> None:
        self._table = table

    def claim(self, intent_id: str, *, now_ms: int, lease_ms: int) -> ClaimOutcome:
        key = intent_id.encode()
        raw = self._table.get(key)
        record = _decoder.decode(raw) if raw else None
        if record is not None and record.state == "done":
            return Done(record.result)
        if record is not None and now_ms < record.lease_until_ms:
            return InFlight(record.lease_until_ms)
        self._table[key] = _encoder.encode(
            ClaimRecord(state="claimed", claimed_at_ms=now_ms, lease_until_ms=now_ms + lease_ms)
        )
        return Claimed()

    def complete(self, intent_id: str, result: bytes, *, now_ms: int) -> None:
        self._table[intent_id.encode()] = _encoder.encode(
            ClaimRecord(state="done", claimed_at_ms=now_ms, result=result)
        )
