"""A per-key counter whose worker loses the first records its table restore fetches of each
changelog partition, for the test of service/keylane/kafka/restore_watch.py.

Importing this module (the worker imports its agent's module before it starts) wraps Faust's
``Consumer.getmany`` so that, while a restore runs, the records of each active changelog
partition in the first batch that holds any are dropped after the consumer fetched them.
With RESTORE_DROP_SEEKS=1 in the environment the wrap then seeks to committed, as Faust's
fetch loop does with a batch that returns while its flow is stopped (``perform_seek``);
without, it seeks nothing. Either way the consumer's position has passed the dropped
records. Each drop is logged (RESTORE_DROP_LINE) so that the test knows the fault happened.

The agent counts: every event adds one to the key's ``count`` in memory, and the output is
the count, so a key whose memory the restore lost starts over at 1.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from typing import Any

from faust.transport.consumer import Consumer
from faust.types import TP

from keylane import ActivationContext, Complete

RESTORE_DROP_LINE = "test fault: dropped the restore's first records of"

log = logging.getLogger(__name__)
_fetch = Consumer.getmany
_dropped: set[TP] = set()


async def _getmany_losing_restored(self: Any, timeout: float) -> AsyncIterator[tuple[TP, Any]]:  # noqa: ASYNC109 - Faust's signature
    recovery = self.app.tables.recovery
    dropping: dict[TP, list[int]] = {}
    async for tp, message in _fetch(self, timeout):
        restoring = recovery.in_recovery and tp in recovery.active_tps
        if restoring and (tp in dropping or tp not in _dropped):
            dropping.setdefault(tp, []).append(message.offset)
            _dropped.add(tp)
            continue
        yield tp, message
    for tp, offsets in dropping.items():
        log.warning("%s %s/%s: offsets %s", RESTORE_DROP_LINE, tp.topic, tp.partition, offsets)
    if dropping and os.environ.get("RESTORE_DROP_SEEKS") == "1":
        await self.perform_seek()


Consumer.getmany = _getmany_losing_restored  # type: ignore[method-assign]


async def agent(ctx: ActivationContext) -> Complete:
    count = ctx.memory.get("count", 0) + 1
    ctx.memory.set("count", count)
    return Complete(output=str(count).encode())
