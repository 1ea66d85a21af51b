"""Agents for the broker tests. Model calls and tool executions are appended to ledger files
(LLM_LEDGER, TOOL_LEDGER), so counts survive a kill -9 and span processes."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from keylane import (
    ActivationContext,
    AgentConfig,
    Complete,
    FakeLLM,
    LlmRequest,
    LlmResponse,
    Suspend,
    match_any,
    respond_with,
    tool,
)


def append_ledger(variable: str, line: dict[str, Any]) -> None:
    path = Path(os.environ[variable])
    with path.open("a") as ledger:
        ledger.write(json.dumps(line, sort_keys=True) + "\n")
        ledger.flush()
        os.fsync(ledger.fileno())


class LedgeredLLM(FakeLLM):
    """FakeLLM that also records every call that reached it in LLM_LEDGER."""

    async def complete(self, request: LlmRequest) -> LlmResponse:
        append_ledger("LLM_LEDGER", {"messages": request.messages})
        return await super().complete(request)


def make_provider() -> LedgeredLLM:
    latency = float(os.environ.get("FAKE_LLM_LATENCY_MS", "10"))
    return LedgeredLLM([(match_any(), respond_with(b"noted", latency_ms=latency))])


@tool("record_event", side_effect=True)
def record_event(args: dict[str, Any]) -> dict[str, Any]:
    """The side effect: one ledger line per execution."""
    append_ledger("TOOL_LEDGER", args)
    return {"recorded": args["event"]}


config = AgentConfig(provider_factory=make_provider)
sharded2 = AgentConfig(provider_factory=make_provider, shards=2)
sharded4 = AgentConfig(provider_factory=make_provider, shards=4)
narrow = AgentConfig(provider_factory=make_provider, max_in_flight=1)  # a window of 16 records
impatient = AgentConfig(provider_factory=make_provider, rebalance_grace_s=1.0)


async def remember(ctx: ActivationContext) -> Complete:
    """Memory-carrying: every output shows the key's ring of events so far."""
    ctx.memory.append("events", ctx.event.decode())
    await ctx.call_model(LlmRequest(model_id="fake", messages=[ctx.event.decode()]))
    output = {"key": ctx.entity_key.decode(), "event": ctx.event.decode(), "seq": ctx.seq}
    return Complete(output=json.dumps({**output, "ring": list(ctx.memory.ring("events"))}).encode())


async def act_then_complete(ctx: ActivationContext) -> Complete | Suspend:
    """Each event: remember it, ask the model, record it through the effector, suspend;
    the ToolResult resumes it and it completes with the whole story in its output."""
    if ctx.is_resume:
        assert ctx.resume_result is not None
        output = {
            "key": ctx.entity_key.decode(),
            "event": ctx.snapshot.decode(),
            "seq": ctx.seq,
            "ring": list(ctx.memory.ring("events")),
            "status": ctx.resume_result.status,
            "intent_id": ctx.resume_result.intent_id,
        }
        return Complete(output=json.dumps(output).encode())
    event = ctx.event.decode()
    ctx.memory.append("events", event)
    await ctx.call_model(LlmRequest(model_id="fake", messages=[event]))
    ctx.act("record_event", json.dumps({"key": ctx.entity_key.decode(), "event": event}))
    return Suspend(snapshot=ctx.event)
