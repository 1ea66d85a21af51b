"""`python -m tests.integration.hold_fetch_probe worker ...`: keylane's CLI with Faust dropping
every record it fetches from a topic named ``*<HOLD_FETCHED_TOPIC>`` until the file
HOLD_RELEASE exists, as Faust drops fetched records on its own paths (see
tests/integration/drop_fetch_probe.py): the consumer's position passes them while the offset
guard still expects the first. Each dropped record is written to HOLD_FETCHED_LOG as
``topic/partition offset``."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread

from keylane.cli import main

_SUFFIX = os.environ["HOLD_FETCHED_TOPIC"]
_LOG = os.environ["HOLD_FETCHED_LOG"]
_RELEASE = Path(os.environ["HOLD_RELEASE"])
_fetch_records = AIOKafkaConsumerThread._fetch_records


async def _holding_fetch_records(self: Any, *args: Any, **kwargs: Any) -> Any:
    records = await _fetch_records(self, *args, **kwargs)
    if _RELEASE.exists():
        return records
    for tp in list(records):
        if tp.topic.endswith(_SUFFIX):
            with open(_LOG, "a") as log:
                log.writelines(f"{tp.topic}/{tp.partition} {record.offset}\n" for record in records[tp])
            del records[tp]
    return records


AIOKafkaConsumerThread._fetch_records = _holding_fetch_records  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
