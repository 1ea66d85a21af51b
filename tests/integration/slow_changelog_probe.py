"""`python -m tests.integration.slow_changelog_probe worker ...`: keylane's CLI whose table
recovery takes SLOW_CHANGELOG_S over each changelog record it reads, as a busy event loop
does: a standby partition's records fetched in one go wait in Faust's changelog queue while
the recovery reads them one by one, and are there when the recovery ends and Faust resumes
its flow (which empties its queues)."""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from faust.tables.base import Collection

from keylane.cli import main

_DELAY_S = float(os.environ.get("SLOW_CHANGELOG_S", "0.05"))
_on_changelog_event = Collection.on_changelog_event


async def _slow_on_changelog_event(self: Any, event: Any) -> None:
    await asyncio.sleep(_DELAY_S)
    await _on_changelog_event(self, event)


Collection.on_changelog_event = _slow_on_changelog_event  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
