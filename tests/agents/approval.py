"""An agent that asks a human before it completes, for the HITL broker tests.

Its timeout policy is a pure function of the FallbackContext: keys starting with "drop-"
are dropped, "escalate-" keys escalate once to the "managers" channel, the rest are denied.

Keys a test answers ("approve-", "reject-", "kcat-") wait HITL_ANSWER_WAIT_MS (two minutes by
default): on a busy machine the CLI calls that answer them take seconds, and a deadline that
fires first turns an approval into a fail-closed denial. The others wait HITL_WAIT_MS.
"""

from __future__ import annotations

import json
import os

from keylane import (
    ActivationContext,
    AgentConfig,
    Complete,
    Deny,
    Drop,
    Escalate,
    FallbackContext,
    HitlPolicy,
    Suspend,
)

WAIT_MS = int(os.environ.get("HITL_WAIT_MS", "4000"))
ANSWER_WAIT_MS = int(os.environ.get("HITL_ANSWER_WAIT_MS", "120000"))
ANSWERED = (b"approve-", b"reject-", b"kcat-")


def on_timeout(context: FallbackContext) -> Deny | Drop | Escalate:
    if context.entity_key.startswith(b"drop-"):
        return Drop()
    if context.entity_key.startswith(b"escalate-"):
        return Escalate(tool_name="managers", args_json='{"why": "no answer"}', timeout_ms=60_000)
    return Deny()


config = AgentConfig(hitl_policy=HitlPolicy(max_escalations=1, on_timeout=on_timeout))


async def ask_first(ctx: ActivationContext) -> Complete | Suspend:
    if ctx.is_resume:
        assert ctx.resume_approval is not None
        decision = "approved" if ctx.resume_approval.approved else "denied"
        return Complete(output=f"{decision} by {ctx.resume_approval.approver}".encode())
    ctx.request_approval(json.dumps({"refund": ctx.event.decode()}))
    answered = ctx.entity_key.startswith(ANSWERED)
    return Suspend(timeout_ms=ANSWER_WAIT_MS if answered else WAIT_MS)
