"""Applying a key's Decision, the step after ``KeyRuntime.handle`` that the worker and the
in-process harness share: write the key's state as one value, update the timer index, and
hand back the records to publish."""

from __future__ import annotations

from collections.abc import MutableMapping

from keylane.core.activation import Decision
from keylane.core.state import encode_state
from keylane.core.timers import TimerIndex
from keylane.records import Emit


def apply_decision(
    table: MutableMapping[bytes, bytes], timers: TimerIndex, key: bytes | None, decision: Decision
) -> list[Emit]:
    """Write ``decision``'s new state (if any) for ``key`` into ``table`` as its encoded blob
    (one table value: one changelog record), record its timers in ``timers``, and return the
    records to publish, in order, once the write is done."""
    if decision.new_state is not None:
        assert key is not None  # a decision with a state is for a record with a key
        table[key] = decision.blob if decision.blob is not None else encode_state(decision.new_state)
        timers.update(key, decision.new_state)
    return decision.emits
