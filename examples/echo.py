"""The smallest agent: every event's payload comes back on agent.output."""

from keylane import ActivationContext, Complete


async def agent(ctx: ActivationContext) -> Complete:
    return Complete(output=ctx.event)
