"""`python -m tests.integration.held_changelog_probe worker ...`: keylane's CLI whose producer
holds every record for a ``*-changelog`` topic while the file HOLD_CHANGELOG exists and
RELEASE_CHANGELOG does not: the record is on its way (the job that wrote it passed every
check before it), as a record is while the process stands still. Each held record is written
to HELD_CHANGELOG_LOG as ``topic/partition key`` when the hold starts.

Where it is held is HELD_CHANGELOG_AT's choice:

* ``send`` (the default): in aiokafka's ``send``, which every record keylane produces goes
  through, as a process that stopped before the record reached its producer;
* ``delivery``: after the ``send``, which returns at once, as a record that sits in the
  producer's batch or on the wire (a broker that has not answered yet, or a leader that moved):
  the caller may hand off and wait for other records meanwhile; its delivery resolves only once
  the record is released and Kafka confirmed it.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer

from keylane.cli import main

_HOLD = Path(os.environ["HOLD_CHANGELOG"])
_RELEASE = Path(os.environ["RELEASE_CHANGELOG"])
_LOG = os.environ["HELD_CHANGELOG_LOG"]
_AT = os.environ.get("HELD_CHANGELOG_AT", "send")
_send = AIOKafkaProducer.send
_held: set[asyncio.Task[None]] = set()


async def _released() -> None:
    while not _RELEASE.exists():  # noqa: ASYNC110 (the test creates the file)
        await asyncio.sleep(0.05)


async def _holding_send(self: Any, topic: str, *args: Any, **kw: Any) -> Any:
    if not (topic.endswith("-changelog") and _HOLD.exists() and not _RELEASE.exists()):
        return await _send(self, topic, *args, **kw)
    with open(_LOG, "a") as log:
        log.write(f"{topic}/{kw.get('partition')} {kw.get('key')!r}\n")
    if _AT == "send":
        await _released()
        return await _send(self, topic, *args, **kw)
    delivery: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    async def send_once_released() -> None:
        await _released()
        try:
            delivery.set_result(await (await _send(self, topic, *args, **kw)))
        except Exception as exc:  # noqa: BLE001 (the delivery carries any failure, as aiokafka's would)
            delivery.set_exception(exc)

    task = asyncio.ensure_future(send_once_released())
    _held.add(task)
    task.add_done_callback(_held.discard)
    return delivery


AIOKafkaProducer.send = _holding_send  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
