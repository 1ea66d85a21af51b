"""The re-drive test's agent (tests/integration/test_redrive.py): it has a bug, then it is fixed.

While the file BUG_FLAG names exists, an event containing "bug" raises, so it becomes an
``activation_error`` dead letter; an event containing "always" raises whatever the flag (a
record that fails again after its re-drive). Every other event completes at once with
{key, event, seq}.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from keylane import ActivationContext, Complete


async def agent(ctx: ActivationContext) -> Complete:
    event = ctx.event.decode()
    if "always" in event or ("bug" in event and Path(os.environ["BUG_FLAG"]).exists()):
        raise RuntimeError(f"the bug struck {event!r}")
    output = {"key": ctx.entity_key.decode(), "event": event, "seq": ctx.seq}
    return Complete(output=json.dumps(output, sort_keys=True).encode())
