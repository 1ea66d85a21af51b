"""How long a watched value, one per key, has stood still: the stall checks' clock.

A stall check looks at a value per key at each of its turns (an offset expected next, an
offset applied) and acts on a key whose value has not moved for long enough. ``Stillness``
keeps, per key, the value it last saw and since when it has been that value.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class Stillness(Generic[K]):
    """Per key, the value seen last and since when (module docstring)."""

    def __init__(self) -> None:
        self._since: dict[K, tuple[object, float]] = {}

    def still_for(self, key: K, value: object, now: float) -> float:
        """How long ``key``'s value has been ``value`` at ``now``: 0 when it is new or moved
        (its clock starts now)."""
        seen = self._since.get(key)
        if seen is None or seen[0] != value:
            self._since[key] = (value, now)
            return 0.0
        return now - seen[1]

    def restart(self, key: K, value: object, now: float) -> None:
        """Start ``key``'s clock again at ``now``: a check acted, and waits as long again."""
        self._since[key] = (value, now)

    def forget(self, key: K) -> None:
        self._since.pop(key, None)

    def keep_only(self, keys: set[K]) -> None:
        """Forget every key not in ``keys``."""
        for key in [key for key in self._since if key not in keys]:
            del self._since[key]

    def clear(self) -> None:
        self._since.clear()
