"""`python -m tests.integration.drop_restore_probe worker ...`: keylane's CLI with Faust losing
the first records its table restore fetches of each changelog partition, for
tests/integration/test_restore_reread.py (service/keylane/kafka/restore_watch.py).

Faust's ``Consumer.getmany`` is wrapped so that, while a restore runs, the records of each
active changelog partition in the first batch that holds any are dropped after the consumer
fetched them. With RESTORE_DROP_SEEKS=1 in the environment the wrap then seeks to committed,
as Faust's fetch loop does with a batch that returns while its flow is stopped
(``perform_seek``); without, it seeks nothing. Either way the consumer's position has passed
the dropped records. Each drop is logged (RESTORE_DROP_LINE) so that the test knows the
fault happened.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import AsyncIterator
from typing import Any

from faust.transport.consumer import Consumer
from faust.types import TP

from keylane.cli import main

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


if __name__ == "__main__":  # only in the worker: the test imports RESTORE_DROP_LINE from here
    Consumer.getmany = _getmany_losing_restored  # type: ignore[method-assign]
    sys.exit(main(sys.argv[1:]))
