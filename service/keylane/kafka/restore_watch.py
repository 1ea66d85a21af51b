"""A table restore whose records stopped arriving is read again from the offset it reached.

Faust restores each active changelog partition up to the high watermark it noted when the
restore began, and the worker stays unready until every one is there. A record the consumer
fetched but Faust dropped on its way to the restore (its fetch loop throws a batch away when
it returns while the flow is stopped, or while a partition is briefly out of its active
set, and only the input partitions are sought back after that) leaves the consumer's
position past records the restore never applied: no later record comes to take their place,
since no one writes a partition while it restores, and the restore waits for good. This was
seen once on a busy CI machine, on a worker taking over a killed worker's partitions with no
standby copies: three partitions restored nothing for three minutes while their records sat
in the log, Faust logging "No event received for active tp ... since recovery start" every
five seconds.

``watch_restores`` checks every CHECK_EVERY_S while a restore runs: an active partition with
records still to apply whose applied offset has not moved for REREAD_AFTER_S is sought back to
that offset (Faust's own restore start, which it reads again and skips), in the consumer's
thread. A restore that makes progress, however slowly, is never touched; a re-read that
finds the records again costs one fetch. Each re-read is logged and counted
(``keylane_restore_rereads_total``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from faust.types import TP

from keylane import metrics

log = logging.getLogger(__name__)

CHECK_EVERY_S = 5.0
REREAD_AFTER_S = 15.0
"""How long an active partition's restore may apply nothing while it has records to apply
before it is read again (longer than any fetch; Faust warns after 30 s without a record)."""

_WATCH_ATTR = "_keylane_restore_watch"


class RestoreWatch:
    """The stall check of one app's table restores (module docstring)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self._still: dict[TP, tuple[int, float]] = {}
        """Per active partition with records to apply: the offset it had applied, and since when."""
        self._running = False

    def start(self) -> None:
        """Run the check in the app's event loop from now on (once), as one of the app's
        futures: the app cancels it when it stops."""
        if not self._running:
            self._running = True
            self.app.add_future(self._run())

    async def _run(self) -> None:
        while not self.app.should_stop:
            await asyncio.sleep(CHECK_EVERY_S)
            try:
                await self.check()
            except Exception:  # a check that fails is tried again at the next turn
                log.warning("could not check the table restores for a stall", exc_info=True)

    async def check(self, now: float | None = None) -> None:
        """Read again each active partition whose restore has applied nothing for
        REREAD_AFTER_S while records remain to apply (module docstring)."""
        recovery = self.app.tables.recovery
        if not recovery.in_recovery:
            self._still.clear()
            return
        now = time.monotonic() if now is None else now
        remaining = recovery.active_remaining()
        waiting = {tp for tp, count in remaining.items() if count > 0}
        for tp in list(self._still):
            if tp not in waiting:
                del self._still[tp]
        for tp in waiting:
            applied = recovery.active_offsets[tp]
            still = self._still.get(tp)
            if still is None or still[0] != applied:
                self._still[tp] = (applied, now)
                continue
            if now - still[1] < REREAD_AFTER_S:
                continue
            self._still[tp] = (applied, now)
            # Faust's restore start: the last offset applied, read again and skipped (-1: none yet).
            start = max(applied, 0)
            log.warning(
                "%s/%s: the table restore applied nothing for %.0fs with %s records to go "
                "(applied up to offset %s, the log ends at %s); reading again from offset %s",
                tp.topic,
                tp.partition,
                now - still[1],
                remaining[tp],
                applied,
                recovery.active_highwaters.get(tp),
                start,
            )
            metrics.RESTORE_REREADS.inc()
            try:
                await self.app.consumer.seek_wait({tp: start})
            except Exception:  # revoked meanwhile: its next restore starts over
                log.warning("%s/%s: could not seek the restore back", tp.topic, tp.partition, exc_info=True)


def watch_restores(app: Any) -> RestoreWatch:
    """Check ``app``'s table restores for a stall from its first partition assignment on
    (the first restore runs before Faust starts an app's timers)."""
    watch: RestoreWatch | None = getattr(app, _WATCH_ATTR, None)
    if watch is None:
        watch = RestoreWatch(app)
        setattr(app, _WATCH_ATTR, watch)

        async def on_assigned(sender: Any, *args: Any, signal: Any, **kwargs: Any) -> None:
            watch.start()

        app.on_partitions_assigned.connect(on_assigned)
    return watch
