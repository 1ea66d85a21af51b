"""A small support agent: it remembers each customer's recent messages, asks a model for a
reply, and sends the reply through the effector (a side effect, executed once).

    keylane worker --agent examples.support_agent:agent
    keylane effector --tools examples.support_agent

The model is the offline FakeLLM, so this runs anywhere. Sent replies are appended to the
ledger file (SUPPORT_LEDGER, default .keylane-data/sent-replies.jsonl): one line per reply
actually sent, however often Kafka redelivers.
"""

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
    Suspend,
    match_any,
    match_contains,
    respond_with,
    tool,
)

RECENT_MESSAGES = 5


def ledger_path() -> Path:
    return Path(os.environ.get("SUPPORT_LEDGER", ".keylane-data/sent-replies.jsonl"))


@tool("send_reply", side_effect=True)
def send_reply(args: dict[str, Any]) -> dict[str, Any]:
    """Deliver a reply to a customer (here: append it to the ledger file)."""
    path = ledger_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as ledger:
        ledger.write(json.dumps(args, sort_keys=True) + "\n")
    return {"delivered": True}


def make_provider() -> FakeLLM:
    return FakeLLM(
        [
            (match_contains("refund"), respond_with(b"We have started your refund.", latency_ms=50)),
            (match_any(), respond_with(b"Thanks for writing, we are on it.", latency_ms=50)),
        ],
        keep_requests=False,  # the compose and Kubernetes workers run this for as long as they run
    )


config = AgentConfig(provider_factory=make_provider)


async def agent(ctx: ActivationContext) -> Complete | Suspend:
    if ctx.is_resume:
        assert ctx.resume_result is not None
        return Complete(
            output=json.dumps(
                {
                    "customer": ctx.entity_key.decode(),
                    "reply": ctx.snapshot.decode(),
                    "delivery": ctx.resume_result.status,
                    "remembered": len(ctx.memory.ring("recent")),
                }
            ).encode()
        )
    ctx.memory.append("recent", ctx.event.decode(), max_items=RECENT_MESSAGES)
    answer = await ctx.call_model(
        LlmRequest(model_id="fake-support", messages=list(ctx.memory.ring("recent")))
    )
    ctx.act("send_reply", json.dumps({"customer": ctx.entity_key.decode(), "text": answer.response.decode()}))
    return Suspend(snapshot=answer.response)
