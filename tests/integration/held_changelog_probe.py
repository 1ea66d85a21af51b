"""`python -m tests.integration.held_changelog_probe worker ...`: keylane's CLI whose producer
holds every record for a ``*-changelog`` topic while the file HOLD_CHANGELOG exists and
RELEASE_CHANGELOG does not: the record is on its way (the job that wrote it passed every
check before it), as a record is while the process stands still. Each held record is written
to HELD_CHANGELOG_LOG as ``topic/partition key`` when the hold starts."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from faust.transport.drivers.aiokafka import Producer

from keylane.cli import main

_HOLD = Path(os.environ["HOLD_CHANGELOG"])
_RELEASE = Path(os.environ["RELEASE_CHANGELOG"])
_LOG = os.environ["HELD_CHANGELOG_LOG"]
_send = Producer.send


async def _holding_send(
    self: Any, topic: str, key: Any, value: Any, partition: Any, *rest: Any, **kw: Any
) -> Any:
    if topic.endswith("-changelog") and _HOLD.exists() and not _RELEASE.exists():
        with open(_LOG, "a") as log:
            log.write(f"{topic}/{partition} {key!r}\n")
        while not _RELEASE.exists():  # noqa: ASYNC110 (the test creates the file)
            await asyncio.sleep(0.05)
    return await _send(self, topic, key, value, partition, *rest, **kw)


Producer.send = _holding_send  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
