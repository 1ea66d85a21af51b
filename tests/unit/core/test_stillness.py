"""The stall checks' clock (service/keylane/core/stillness.py)."""

from __future__ import annotations

from keylane.core.stillness import Stillness


def test_a_value_stands_still_from_when_it_was_first_seen_until_it_moves() -> None:
    clock: Stillness[str] = Stillness()
    assert clock.still_for("p0", 5, now=10.0) == 0.0
    assert clock.still_for("p0", 5, now=25.0) == 15.0
    assert clock.still_for("p0", 6, now=26.0) == 0.0  # moved: its clock starts over
    assert clock.still_for("p0", 6, now=30.0) == 4.0


def test_a_restart_and_a_forget_start_the_clock_again() -> None:
    clock: Stillness[str] = Stillness()
    clock.still_for("p0", 5, now=0.0)
    clock.still_for("p1", 7, now=0.0)
    clock.restart("p0", 5, now=20.0)
    assert clock.still_for("p0", 5, now=21.0) == 1.0
    clock.forget("p0")
    assert clock.still_for("p0", 5, now=22.0) == 0.0
    clock.keep_only({"p0"})
    assert clock.still_for("p1", 7, now=23.0) == 0.0  # forgotten: seen as new
    clock.clear()
    assert clock.still_for("p0", 5, now=24.0) == 0.0
