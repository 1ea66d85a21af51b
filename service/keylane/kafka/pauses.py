"""Notice that this process stood still longer than its session timeout, before it writes.

A process stopped as a whole (``kill -STOP``, a stopped VM, a long GC pause) sends no
heartbeats: once the pause outlasts the consumer's session timeout, the group has evicted it
and its partitions may have moved. When it runs again, its lane jobs carry on where they
stood, and would write their keys' state and publish their outputs before the consumer finds
out at its next heartbeat. ``PauseWatch`` lets a job find out first: a daemon thread ticks
every TICK_S and notes every gap between ticks longer than the threshold (the session
timeout less a margin), with the group generation it sampled before the gap. A job must not
write (``interrupted``) if it started before such a gap ended, or while one is still going on
(the ticker has not run since the process resumed), or under the generation held before one:
the consumer may still believe in that generation until its next heartbeat, but the group
has left it. The worker then releases the job unfinished, and ``on_pause`` makes its consumer
rejoin the group at once: the rebalance revokes every partition (releasing the records queued
behind the released one, so no later record of a key is applied before it) and each partition
is read again from its committed offset, under a new generation, by its new owner or, if the
group had not evicted this worker after all, by this one.

This narrows a former owner's late writes to the moment between the check and the producer
sending the job's records; the owner epochs (service/keylane/kafka/epochs.py) keep the state safe from what is
left, and docs/runtime.md says what remains for outputs.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

TICK_S = 0.1
MARGIN = 0.8
"""A gap longer than this share of the session timeout counts: the heartbeat sent before it
may have been the last one the group coordinator saw."""


class PauseWatch:
    """Remembers the long pauses of this process, and the group generation held before each."""

    def __init__(
        self,
        session_timeout_s: float,
        *,
        generation: Callable[[], int],
        on_pause: Callable[[], None] | None = None,
    ) -> None:
        self.threshold_s = session_timeout_s * MARGIN
        self._generation = generation
        self._on_pause = on_pause
        self._last_tick = time.monotonic()
        self._generation_seen = generation()  # at the last tick: before a gap, once one is found
        self._resumed_at = float("-inf")  # the end of the latest long pause
        self._fenced: set[int] = set()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def start(self) -> PauseWatch:
        self._thread = threading.Thread(target=self._tick, name="keylane-pause-watch", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def interrupted(self, since: float, epoch: int) -> bool:
        """Whether a job that started at ``since`` (a ``time.monotonic()`` reading) under
        ``epoch`` (the group generation then) must not write: a long pause is going on now,
        one ended after the job started, or the job's generation is one this process held
        when a long pause began (the group has left it, whatever the consumer believes yet)."""
        return (
            time.monotonic() - self._last_tick > self.threshold_s
            or self._resumed_at > since
            or epoch in self._fenced
        )

    def _tick(self) -> None:
        while not self._stop.wait(TICK_S):
            now = time.monotonic()
            gap = now - self._last_tick
            if gap > self.threshold_s:
                self._fenced.add(self._generation_seen)
                self._resumed_at = now
                log.warning(
                    "this process stood still for %.1fs, past its session timeout: its partitions "
                    "may have moved, so its activations of generation %s are released unwritten and "
                    "it rejoins its group",
                    gap,
                    self._generation_seen,
                )
                if self._on_pause is not None:
                    try:
                        self._on_pause()
                    except Exception:
                        log.exception("could not act on the pause")
            self._last_tick = now
            self._generation_seen = self._generation()
