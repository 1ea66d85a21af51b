"""The agents the broker benchmarks run in `keylane worker` processes (bench/broker.py).

* ``noop``: completes with its event, so an e2e run measures keylane and the bus only;
* ``model_call``: one FakeLLM call of ``LLM_LATENCY_MS`` (an asyncio sleep, like a network
  wait), then completes with the event and the verdict. It keeps nothing per key, the
  precondition for sharding it (docs/sharding.md).

Configs: ``noop_config`` (no provider), ``config`` (the FakeLLM provider, unsharded),
``sharded`` (the same provider behind ShardKeys(N), N read from BENCH_SHARDS when the
worker imports this module), and ``lanes_key`` / ``lanes_partition`` (the two lane modes;
key lanes' ``max_in_flight`` read from BENCH_MAX_IN_FLIGHT, bench/lanes.py's choice).
"""

from __future__ import annotations

import os

from keylane import ActivationContext, AgentConfig, Complete, FakeLLM, LlmRequest, match_any, respond_with

LLM_LATENCY_MS = 50.0
SHARDS_ENV = "BENCH_SHARDS"
IN_FLIGHT_ENV = "BENCH_MAX_IN_FLIGHT"
VERDICT = b"scored"


def make_provider() -> FakeLLM:
    return FakeLLM([(match_any(), respond_with(VERDICT, latency_ms=LLM_LATENCY_MS))])


async def noop(ctx: ActivationContext) -> Complete:
    return Complete(output=ctx.event)


async def model_call(ctx: ActivationContext) -> Complete:
    response = await ctx.call_model(LlmRequest(model_id="bench-fake", messages=[ctx.event.decode()]))
    return Complete(output=ctx.event + b"|" + response.response)


noop_config = AgentConfig()
MAX_IN_FLIGHT = noop_config.max_in_flight  # AgentConfig's default
config = AgentConfig(provider_factory=make_provider)
sharded = AgentConfig(provider_factory=make_provider, shards=int(os.environ.get(SHARDS_ENV, "1")))
lanes_key = AgentConfig(
    provider_factory=make_provider,
    lanes="key",
    max_in_flight=int(os.environ.get(IN_FLIGHT_ENV, str(MAX_IN_FLIGHT))),
)
lanes_partition = AgentConfig(provider_factory=make_provider, lanes="partition")
