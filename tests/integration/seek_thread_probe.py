"""`python -m tests.integration.seek_thread_probe worker ...`: keylane's CLI with aiokafka's
fetcher watched. Every seek is written to SEEK_PROBE_LOG as one line: "ok" when it ran in
the thread that drains that fetcher's records (or before anything drained them),
"wrong-thread" otherwise, a race that crashed workers with a KeyError inside aiokafka's
fetched_records."""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

from aiokafka.consumer.fetcher import Fetcher

from keylane.cli import main

_LOG = os.environ["SEEK_PROBE_LOG"]
_seek_to = Fetcher.seek_to
_fetched_records = Fetcher.fetched_records


async def _watched_fetched_records(self: Any, *args: Any, **kwargs: Any) -> Any:
    self._probe_fetching_thread = threading.get_ident()  # each consumer has its own fetcher
    return await _fetched_records(self, *args, **kwargs)


def _watched_seek_to(self: Any, tp: Any, offset: int) -> None:
    fetching = getattr(self, "_probe_fetching_thread", None)
    where = "ok" if fetching in (None, threading.get_ident()) else "wrong-thread"
    with open(_LOG, "a") as log:
        log.write(f"{where} {tp.topic}/{tp.partition} {offset} {threading.current_thread().name}\n")
    _seek_to(self, tp, offset)


Fetcher.fetched_records = _watched_fetched_records  # type: ignore[method-assign]
Fetcher.seek_to = _watched_seek_to  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
