"""A table restore whose fetched records never reached it is read again from the offset it reached.

Faust restores each active changelog partition up to the high watermark it noted when the
restore began, and the worker stays unready until every one is there. Its fetch loop throws
a batch away when the batch returns while the flow is stopped, and then seeks back only the
partitions with a committed offset (the inputs), not the changelogs. A recovery seeks its
changelog partitions and resumes the flow a few event-loop turns later, after its own tasks
wake up: a batch fetched from the new position in between was dropped, with the consumer's
position past it. A restore that lost the whole rest of a partition waited for good (a CI run
saw three partitions restore nothing for three minutes after a kill -9, with no standby
copies); one that lost only the first batch of a longer partition applied the records after
it and completed without the keys whose last record was in the batch, their state gone back.

Two remedies, both here:

* ``restore_positions_after_seek``, run after every seek to committed (Faust's
  ``perform_seek``, wrapped in service/keylane/kafka/patches.py): each changelog partition a
  restore still reads (active or standby, with records left to apply) is sought back to the
  offset the restore applied, read again and skipped as Faust's own restore start is. No
  batch is fetched while the seek to committed runs, so nothing after the dropped batch was
  applied yet.
* ``watch_restores``, a check every CHECK_EVERY_S while a restore runs, for a drop on a path
  that seeks nothing: an active partition with records to apply whose applied offset has not
  moved for REREAD_AFTER_S is sought back to that offset. A restore that makes progress,
  however slowly, is never touched. Each such re-read is logged and counted
  (``keylane_restore_rereads_total``).

Both seek in the consumer's thread (``seek_wait``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from faust.types import TP

from keylane import metrics
from keylane.core.stillness import Stillness

log = logging.getLogger(__name__)

CHECK_EVERY_S = 5.0
REREAD_AFTER_S = 15.0
"""How long an active partition's restore may apply nothing while it has records to apply
before it is read again (longer than any fetch; Faust warns after 30 s without a record)."""

_WATCH_ATTR = "_keylane_restore_watch"


def restore_start(applied: int) -> int:
    """Where Faust's restore of a partition reads from, given the offset it applied last: that
    offset, read again and skipped (Faust's own restore start), or the log start when it
    applied none (-1)."""
    return max(applied, 0)


def restore_positions(recovery: Any) -> dict[TP, int]:
    """Where each changelog partition that ``recovery`` (Faust's Recovery) still restores
    reads on from (``restore_start``)."""
    positions: dict[TP, int] = {}
    for remaining, offsets, reading in (
        (recovery.active_remaining(), recovery.active_offsets, recovery.active_tps),
        (recovery.standby_remaining(), recovery.standby_offsets, recovery.standby_tps),
    ):
        for tp, left in remaining.items():
            if left > 0 and tp in reading:
                positions[tp] = restore_start(offsets[tp])
    return positions


async def restore_positions_after_seek(consumer: Any) -> None:
    """After Faust's seek to committed: seek the changelog partitions a restore still reads
    back to the offsets it applied (module docstring)."""
    tables = consumer.app.tables
    if not tables:  # an app without a table restores nothing
        return
    assigned = consumer.assignment()
    positions = {tp: offset for tp, offset in restore_positions(tables.recovery).items() if tp in assigned}
    if not positions:
        return
    try:
        await consumer.seek_wait(positions)
    except Exception:  # one revoked meanwhile: its next restore starts over; the watch covers the rest
        log.warning("could not seek %s table restore partitions back", len(positions), exc_info=True)
        return
    log.info("positioned %s table restore partitions again, at the offsets they applied", len(positions))


class RestoreWatch:
    """The stall check of one app's table restores (module docstring)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self._still: Stillness[TP] = Stillness()
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
        self._still.keep_only(waiting)
        for tp in waiting:
            applied = recovery.active_offsets[tp]
            still_s = self._still.still_for(tp, applied, now)
            if still_s < REREAD_AFTER_S:
                continue
            self._still.restart(tp, applied, now)
            start = restore_start(applied)
            log.warning(
                "%s/%s: the table restore applied nothing for %.0fs with %s records to go "
                "(applied up to offset %s, the log ends at %s); reading again from offset %s",
                tp.topic,
                tp.partition,
                still_s,
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
