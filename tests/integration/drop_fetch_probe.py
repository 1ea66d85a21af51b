"""`python -m tests.integration.drop_fetch_probe worker ...`: keylane's CLI with Faust dropping
a fetched record, as it does on its own paths (a fetch batch cut short by a rebalance, a
stream queue cleared on revocation): the consumer's position has passed the record, and
nothing delivers it.

The first record fetched from each partition of a topic named ``*<DROP_FETCHED_TOPIC>`` is
taken out of the fetch result once per process, and written to DROP_FETCHED_LOG as
``topic/partition offset``."""

from __future__ import annotations

import os
import sys
from typing import Any

from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread

from keylane.cli import main

_SUFFIX = os.environ["DROP_FETCHED_TOPIC"]
_LOG = os.environ["DROP_FETCHED_LOG"]
_fetch_records = AIOKafkaConsumerThread._fetch_records
_dropped: set[Any] = set()


async def _dropping_fetch_records(self: Any, *args: Any, **kwargs: Any) -> Any:
    records = await _fetch_records(self, *args, **kwargs)
    for tp in list(records):
        batch = records[tp]
        if not batch or not tp.topic.endswith(_SUFFIX) or tp in _dropped:
            continue
        _dropped.add(tp)
        with open(_LOG, "a") as log:
            log.write(f"{tp.topic}/{tp.partition} {batch[0].offset}\n")
        if len(batch) == 1:
            del records[tp]
        else:
            records[tp] = batch[1:]
    return records


AIOKafkaConsumerThread._fetch_records = _dropping_fetch_records  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
