"""A ToolLoop agent for the provider end-to-end test: one read-only tool run inline, one
side-effect tool run by the effector. The model is whatever ``--provider`` names; tool
executions are appended to TOOL_LEDGER."""

from __future__ import annotations

from typing import Any

from keylane import ActivationContext, AgentConfig, Complete, Suspend, ToolLoop, tool
from tests.agents.flow import append_ledger


@tool(
    "lookup_order",
    description="Look up an order by id.",
    parameters={"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]},
)
def lookup_order(args: dict[str, Any]) -> dict[str, Any]:
    return {"order_id": args["order_id"], "state": "delivered", "amount": 42}


@tool("issue_refund", side_effect=True, description="Refund an order.")
def issue_refund(args: dict[str, Any]) -> dict[str, Any]:
    append_ledger("TOOL_LEDGER", args)
    return {"refunded": args["order_id"]}


LOOP = ToolLoop(model="support-model", tools=["lookup_order", "issue_refund"])
config = AgentConfig(max_tokens_per_activation=10_000)


async def agent(ctx: ActivationContext) -> Complete | Suspend:
    return await LOOP.run(
        ctx,
        [
            {"role": "system", "content": "You are a support agent."},
            {"role": "user", "content": ctx.event.decode()},
        ],
    )
