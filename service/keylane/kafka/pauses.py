"""Notice that this process stood still longer than its session timeout, before it writes.

A process stopped as a whole (``kill -STOP``, a stopped VM, a long GC pause) sends no
heartbeats: once the pause outlasts the consumer's session timeout, the group has evicted it
and its partitions may have moved. When it runs again, its lane jobs carry on where they
stood, and would write their keys' state and publish their outputs before the consumer finds
out at its next heartbeat. ``PauseWatch`` lets a job find out first: a daemon thread ticks
every TICK_S and notes every gap between ticks longer than the threshold (the session
timeout less a margin); a job that started before such a gap ended, or while one is still
going on (the ticker has not run since the process resumed), or within a session timeout
after one (until the consumer learns at its next heartbeat that it was evicted and leaves its
generation), must not write (``interrupted``). The worker then releases it unfinished: the
partition's new owner runs it.

This narrows a former owner's late writes to the moment between the check and the producer
sending the job's records; the owner epochs (service/keylane/kafka/epochs.py) keep the state safe from what is
left, and docs/runtime.md says what remains for outputs.
"""

from __future__ import annotations

import logging
import threading
import time

log = logging.getLogger(__name__)

TICK_S = 0.1
MARGIN = 0.8
"""A gap longer than this share of the session timeout counts: the heartbeat sent before it
may have been the last one the group coordinator saw."""


class PauseWatch:
    """Remembers when this process last resumed from a pause longer than ``threshold_s``."""

    def __init__(self, session_timeout_s: float) -> None:
        self.threshold_s = session_timeout_s * MARGIN
        self.settle_s = session_timeout_s
        """How long after a long pause no job writes: a consumer that was evicted learns it at
        its next heartbeat, well within a session timeout, and leaves its generation."""
        self._last_tick = time.monotonic()
        self._resumed_at = float("-inf")  # the end of the latest long pause
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def start(self) -> PauseWatch:
        self._thread = threading.Thread(target=self._tick, name="keylane-pause-watch", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def interrupted(self, since: float) -> bool:
        """Whether a job that started at ``since`` (a ``time.monotonic()`` reading) must not
        write: a long pause is going on now, one ended after the job started, or one ended
        less than ``settle_s`` ago (the job started while the consumer may still believe in a
        generation the group has left)."""
        now = time.monotonic()
        return (
            now - self._last_tick > self.threshold_s
            or self._resumed_at > since
            or now - self._resumed_at < self.settle_s
        )

    def _tick(self) -> None:
        while not self._stop.wait(TICK_S):
            now = time.monotonic()
            gap = now - self._last_tick
            if gap > self.threshold_s:
                self._resumed_at = now
                log.warning(
                    "this process stood still for %.1fs, past its session timeout: its partitions "
                    "may have moved, so its running activations are released unwritten",
                    gap,
                )
            self._last_tick = now
