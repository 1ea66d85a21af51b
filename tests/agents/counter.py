"""The chaos tests' agent: a per-key counter with one side effect per event.

Each new event adds its id to the key's ``counted`` list in memory (changed in place, then
written: see the agent), whose length is its ``count``, and to the ``events`` ring (with
COUNTER_BALLAST_BYTES set, every other key also keeps that much ballast, so its memory is
paged, and rewrites one piece of it per event), asks the model once, stages
``record_effect`` {key, event, count} and suspends; the ToolResult resumes it and it
completes with {key, event, count, seq, status, intent_id}. Model calls go to
LLM_LEDGER and tool executions to TOOL_LEDGER (one fsynced JSON line each), so what happened
survives kill -9 and can be counted across processes. The tool is what a side effect that
must not repeat should be: it takes the intent id, and its reconcile hook tells the effector
whether an intent left in doubt by a crash took effect.
"""

from __future__ import annotations

import json
import os
import zlib
from pathlib import Path
from typing import Any

from keylane import (
    ActivationContext,
    AgentConfig,
    Complete,
    LlmRequest,
    Suspend,
    match_any,
    respond_with,
    tool,
)
from tests.agents.flow import LedgeredLLM, append_ledger

TOOL = "record_effect"
BALLAST_ENTRIES = 20
PAGED_BALLAST_BYTES = 24 * 1024
"""What the chaos runs set COUNTER_BALLAST_BYTES to: enough to page a key's memory."""


def ballast_bytes() -> int:
    """COUNTER_BALLAST_BYTES (0 when unset): the memory a ballasted key keeps besides its
    counter, so that its memory is paged (over 16 KiB: service/keylane/core/pages.py)."""
    return int(os.environ.get("COUNTER_BALLAST_BYTES", "0"))


def ballasted(key: str) -> bool:
    """Every other key carries the ballast, so a chaos run attacks paged and inline memory."""
    return zlib.crc32(key.encode()) % 2 == 0


def make_provider() -> LedgeredLLM:
    latency = float(os.environ.get("FAKE_LLM_LATENCY_MS", "5"))
    return LedgeredLLM([(match_any(), respond_with(b"counted", latency_ms=latency))])


config = AgentConfig(provider_factory=make_provider)
sharded4 = AgentConfig(provider_factory=make_provider, shards=4)


def record_effect(args: dict[str, Any], *, intent_id: str | None = None) -> dict[str, Any]:
    """The side effect: one TOOL_LEDGER line per execution, with the intent id when the
    effector passes it (keylane versions that do pass it as the ``intent_id`` keyword)."""
    append_ledger(
        "TOOL_LEDGER",
        {
            "key": args["key"],
            "event": args["event"],
            "count": args["count"],
            "intent_id": intent_id,
            "pid": os.getpid(),
        },
    )
    return {"recorded": args["event"], "count": args["count"]}


def reconcile_effect(intent_id: str) -> dict[str, Any] | None:
    """For an intent the effector left in doubt (killed after claiming it, before recording
    its outcome): the earlier result if its effect is in TOOL_LEDGER, else None (run it)."""
    path = Path(os.environ["TOOL_LEDGER"])
    lines = path.read_text().splitlines() if path.exists() else []
    for line in lines:
        entry = json.loads(line)
        if entry.get("intent_id") == intent_id:
            return {"recorded": entry["event"], "count": entry["count"]}
    return None


try:
    record_effect = tool(TOOL, side_effect=True, reconcile=reconcile_effect)(record_effect)
except TypeError:  # a keylane whose tools have no reconcile hook yet
    record_effect = tool(TOOL, side_effect=True)(record_effect)


async def agent(ctx: ActivationContext) -> Complete | Suspend:
    if ctx.is_resume:
        assert ctx.resume_result is not None
        story = json.loads(ctx.snapshot)
        output = {
            "key": ctx.entity_key.decode(),
            "event": story["event"],
            "count": story["count"],
            "seq": ctx.seq,
            "status": ctx.resume_result.status,
            "intent_id": ctx.resume_result.intent_id,
        }
        return Complete(output=json.dumps(output, sort_keys=True).encode())
    event = ctx.event.decode()
    # The key's events so far, changed in place before the write that stores them. Were a
    # change in place memory, an activation abandoned after it (a rebalance cancels it, or a
    # model call fails) and run again by the same worker would count its event twice.
    counted = ctx.memory.get("counted", [])
    counted.append(event)
    count = len(counted)
    ctx.memory.set("counted", counted)
    ctx.memory.set("count", count)
    ctx.memory.append("events", event)
    ballast = ballast_bytes()
    if ballast and ballasted(ctx.entity_key.decode()):
        # Filled at the key's first event, then one entry rewritten per event: the pages an
        # activation writes hold the counter and one piece of ballast.
        size = ballast // BALLAST_ENTRIES
        for index in range(BALLAST_ENTRIES) if count == 1 else (count % BALLAST_ENTRIES,):
            ctx.memory.set(f"ballast-{index}", f"{event}:{index}:".ljust(size, "."))
    await ctx.call_model(LlmRequest(model_id="fake", messages=[event]))
    key = ctx.entity_key.decode()
    ctx.act(TOOL, json.dumps({"key": key, "event": event, "count": count}, sort_keys=True))
    return Suspend(snapshot=json.dumps({"event": event, "count": count}).encode())
