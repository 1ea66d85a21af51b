"""An agent that changes memory values in place without writing them, for kill -9 tests of
"only a write changes memory" (docs/runtime.md, *Memory*).

``fill:<n>``: ``n`` entries of 1 KiB (over 16 KiB: the memory is paged) and ``log`` =
``["written"]``. ``change``: appends to the list ``get("log")`` gave, in place, and writes
nothing. ``fail``: the same, then raises, so the activation fails. Every output is the key's
``log`` as the activation found it, before it changed anything, as JSON: always
``["written"]`` when only writes are memory, whatever the worker went through in between.
"""

from __future__ import annotations

import json

from keylane import ActivationContext, Complete


async def agent(ctx: ActivationContext) -> Complete:
    command = ctx.event.decode()
    if command.startswith("fill:"):
        for entry in range(int(command.split(":")[1])):
            ctx.memory.set(f"ballast-{entry}", "~" * 1024)
        ctx.memory.set("log", ["written"])
        return Complete(output=json.dumps(ctx.memory.get("log")).encode())
    log = ctx.memory.get("log")
    found = json.dumps(log).encode()
    log.append(command)
    if command == "fail":
        raise RuntimeError("the activation fails after changing a value in place")
    return Complete(output=found)
