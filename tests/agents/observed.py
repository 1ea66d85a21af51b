"""The agent of the observability test (tests/integration/test_observability.py): one worker
whose keys, by their name, take every path the dashboards show.

* ``order-*``: a model call (with token counts), a read-only tool inline, a side-effect tool
  through the effector; the result resumes it and it completes;
* ``ask-*``: asks a human and waits (the test answers some, leaves one waiting);
* ``late-*``: asks a human for 2 s only: the timer fires and the default policy denies;
* ``burst-*``: a slow model call, then complete: many of them fill the partition's lane window
  (``max_in_flight=1``, a window of 16 records), so its fetching pauses.
"""

from __future__ import annotations

import json
from typing import Any

from keylane import (
    ActivationContext,
    AgentConfig,
    Complete,
    FakeLLM,
    LlmRequest,
    Suspend,
    match_any,
    match_contains,
    respond_with,
    tool,
)

BURST_LATENCY_MS = 150
ANSWERED_WAIT_MS = 600_000
LATE_WAIT_MS = 2_000


@tool(
    "lookup_order",
    description="Look up an order by id.",
    parameters={"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]},
)
def lookup_order(args: dict[str, Any]) -> dict[str, Any]:
    return {"order_id": args["order_id"], "state": "paid"}


@tool("ship_order", side_effect=True, description="Ship an order.")
def ship_order(args: dict[str, Any]) -> dict[str, Any]:
    return {"shipped": args["order_id"]}


def make_provider() -> FakeLLM:
    return FakeLLM(
        [
            (match_contains("burst"), respond_with(b"noted", latency_ms=BURST_LATENCY_MS)),
            (match_any(), respond_with(b"on it", latency_ms=20, prompt_tokens=40, completion_tokens=8)),
        ]
    )


config = AgentConfig(provider_factory=make_provider, max_in_flight=1)


async def agent(ctx: ActivationContext) -> Complete | Suspend:
    key = ctx.entity_key.decode()
    if ctx.is_resume:
        if ctx.resume_approval is not None:
            decision = "approved" if ctx.resume_approval.approved else "denied"
            return Complete(output=f"{key} {decision} by {ctx.resume_approval.approver}".encode())
        assert ctx.resume_result is not None
        return Complete(output=f"{key} shipped: {ctx.resume_result.status}".encode())
    event = ctx.event.decode()
    ctx.memory.append("events", event, max_items=5)
    answer = await ctx.call_model(LlmRequest(model_id="fake-observed", messages=[event]))
    if key.startswith("burst-"):
        return Complete(output=answer.response)
    if key.startswith(("ask-", "late-")):
        ctx.request_approval(json.dumps({"refund": event}))
        return Suspend(timeout_ms=LATE_WAIT_MS if key.startswith("late-") else ANSWERED_WAIT_MS)
    await ctx.run_tool("lookup_order", {"order_id": event})
    ctx.act("ship_order", json.dumps({"order_id": event}))
    return Suspend()
