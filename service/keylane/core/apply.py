"""Applying a key's Decision, the step after ``KeyRuntime.handle`` that the worker and the
in-process harness share: write the key's state (its record, and the memory pages it changed),
update the timer index, and hand back the records to publish."""

from __future__ import annotations

from keylane.core.activation import Decision
from keylane.core.key_states import KeyStates
from keylane.core.timers import TimerIndex
from keylane.records import Emit


def apply_decision(
    states: KeyStates, timers: TimerIndex, key: bytes | None, decision: Decision
) -> list[Emit]:
    """Write ``decision``'s new state (if any) for ``key`` into ``states`` (memory pages first,
    then the one record that commits them), record its timers in ``timers``, and return the
    records to publish, in order, once the write is done."""
    if decision.new_state is not None:
        assert key is not None  # a decision with a state is for a record with a key
        states.write(
            key, decision.new_state, decision.blob, unpages=decision.unpages, readback=decision.readback
        )
        timers.update(key, decision.new_state)
    return decision.emits
