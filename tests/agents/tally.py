"""A per-key tally: every event adds one to the key's ``count`` in memory, and the output is the
count, so a key whose memory went missing counts from 1 again."""

from __future__ import annotations

from keylane import ActivationContext, Complete


async def agent(ctx: ActivationContext) -> Complete:
    count = ctx.memory.get("count", 0) + 1
    ctx.memory.set("count", count)
    return Complete(output=str(count).encode())
