"""Wall-clock milliseconds, and the seam that lets tests replace them.

A ``Clock`` is any callable that returns the current time in Unix milliseconds. The
runtime, the effector and ShardKeys take one (``wall_clock_ms`` by default); tests pass
``keylane.testing.ManualClock`` to make hours pass at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable

Clock = Callable[[], int]


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000
