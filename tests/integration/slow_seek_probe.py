"""`python -m tests.integration.slow_seek_probe worker ...`: keylane's CLI on a busy event loop.

Every ``seek_wait`` (Faust's seek in the consumer thread, which keylane's offset guard uses to
position an assignment) returns SLOW_SEEK_S late, as it does when the event loop is busy:
meanwhile the consumer thread fetches from the new position and Faust delivers the records
to the streams. Code that assumes nothing arrives between a seek and its next statement
loses those records."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Mapping
from typing import Any

from faust.transport.consumer import ThreadDelegateConsumer

from keylane.cli import main

_DELAY_S = float(os.environ.get("SLOW_SEEK_S", "1.0"))
_seek_wait = ThreadDelegateConsumer.seek_wait


async def _late_seek_wait(self: Any, partitions: Mapping[Any, int]) -> None:
    await _seek_wait(self, partitions)
    await asyncio.sleep(_DELAY_S)


ThreadDelegateConsumer.seek_wait = _late_seek_wait  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
