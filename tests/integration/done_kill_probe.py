"""`python -m tests.integration.done_kill_probe effector ...`: keylane's CLI frozen right after
the effector's first local Done put, before that Done's changelog record is delivered.

The first ``ClaimStore.complete`` of the process (per DONE_FREEZE_MARKER, once across
restarts) writes Done into the claim table as usual: RocksDB has it, and its changelog
record sits in Faust's producer buffer. The probe then writes the marker file and blocks
the event loop, so nothing more is produced (the result is not published either), until
the test kills the process with SIGKILL. A restart on the same data dir finds Done locally
while the changelog still ends at the intent's claim."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from keylane.cli import main
from keylane.stages.effector.claims import ClaimStore

_MARKER = Path(os.environ["DONE_FREEZE_MARKER"])
_complete = ClaimStore.complete


def _complete_then_freeze(self: ClaimStore, intent_id: str, result: bytes, **kwargs: Any) -> None:
    _complete(self, intent_id, result, **kwargs)
    if _MARKER.exists():
        return
    _MARKER.write_text(f"{os.getpid()} {intent_id}\n")
    while True:  # the event loop stops here: no changelog send, no publish, until SIGKILL
        time.sleep(60)


ClaimStore.complete = _complete_then_freeze  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
