"""Runtime-only benchmarks: in process, FakeLLM, no broker — keylane's own cost per activation.

Every activation goes through KeyRuntime exactly as in a worker (decode, state load,
activation, one encoded KeyState commit) via keylane.testing.AgentHarness; only the broker
round trips are absent.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from bench import names
from bench.harness import Recorder, Result, Size, progress
from keylane import (
    ActivationContext,
    AgentConfig,
    Complete,
    FakeLLM,
    LlmRequest,
    Suspend,
    match_any,
    respond_with,
)
from keylane.authoring.tools import ToolRegistry
from keylane.cells import MemoryBlob, MemoryEntry
from keylane.core.state import KeyState, encode_state
from keylane.testing import AgentHarness
from keylane.wire import AgentEnvelope, encode

COUNTS: dict[Size, dict[str, int]] = {
    "smoke": {
        "noop": 300,
        "overhead_50": 40,
        "overhead_500": 8,
        "overhead_2000": 4,
        "suspend": 100,
        "state": 40,
        "encode": 200,
    },
    "quick": {
        "noop": 5_000,
        "overhead_50": 300,
        "overhead_500": 40,
        "overhead_2000": 20,
        "suspend": 500,
        "state": 300,
        "encode": 2_000,
    },
    "full": {
        "noop": 20_000,
        "overhead_50": 1_200,
        "overhead_500": 200,
        "overhead_2000": 100,
        "suspend": 2_000,
        "state": 1_000,
        "encode": 10_000,
    },
}
CONCURRENT_KEYS = 10  # tiers run this many keys at once, each key strictly serial


async def noop(ctx: ActivationContext) -> Complete:
    return Complete(output=ctx.event)


def model_agent() -> Callable[[ActivationContext], Awaitable[Complete]]:
    async def agent(ctx: ActivationContext) -> Complete:
        answer = await ctx.call_model(LlmRequest(model_id="bench", messages=[ctx.event.decode()]))
        return Complete(output=answer.response)

    return agent


async def act_then_resume(ctx: ActivationContext) -> Complete | Suspend:
    if ctx.is_resume:
        return Complete(output=b"done")
    ctx.act("side_effect", '{"n": 1}')
    return Suspend(snapshot=ctx.event)


async def bump_counter(ctx: ActivationContext) -> Complete:
    ctx.memory.set("counter", ctx.memory.get("counter", 0) + 1)
    return Complete(output=b"")


EVENT = encode(AgentEnvelope(payload="x"))


async def timed(harness: AgentHarness, key: bytes, value: bytes = EVENT) -> float:
    """Wall milliseconds of one input record through the runtime, commit included."""
    started = time.perf_counter()
    await harness.send_raw(harness.events_topic, key, value)
    return (time.perf_counter() - started) * 1000


async def bench_noop(recorder: Recorder, count: int) -> None:
    for name, keys in ((names.NOOP_1KEY, 1), (names.NOOP_1000KEYS, 1000)):
        harness = AgentHarness(noop, AgentConfig())
        key_list = [f"key-{i}".encode() for i in range(keys)]
        started = time.perf_counter()
        for i in range(count):
            await harness.send_raw(harness.events_topic, key_list[i % keys], EVENT)
            if len(harness.published) > 10_000:
                harness.published.clear()
                harness.records.clear()
        elapsed = time.perf_counter() - started
        recorder.add(Result(name=name, unit="activations/s", rate=count / elapsed, extra={"keys": keys}))


async def bench_overhead(recorder: Recorder, tier_ms: int, count: int) -> None:
    provider = FakeLLM([(match_any(), respond_with(b"ok", latency_ms=tier_ms))])
    harness = AgentHarness(model_agent(), AgentConfig(), provider=provider)
    samples: list[float] = []
    per_key = -(-count // CONCURRENT_KEYS)

    async def one_key(index: int) -> None:
        key = f"tier-key-{index}".encode()
        for _ in range(per_key):
            samples.append(await timed(harness, key) - tier_ms)

    progress(f"{names.OVERHEAD[tier_ms]}: {per_key * CONCURRENT_KEYS} activations at {tier_ms} ms")
    await asyncio.gather(*(one_key(i) for i in range(CONCURRENT_KEYS)))
    recorder.add(
        Result(
            name=names.OVERHEAD[tier_ms],
            unit="ms",
            samples=samples,
            extra={"provider_latency_ms": tier_ms, "concurrent_keys": CONCURRENT_KEYS},
        )
    )


async def bench_timer_baseline(recorder: Recorder, count: int) -> None:
    """How late asyncio.sleep(0.05) wakes under the same concurrency: part of every tier's
    measured overhead is this, not keylane (epoll waits in whole milliseconds)."""
    samples: list[float] = []
    per_key = -(-count // CONCURRENT_KEYS)

    async def one_key() -> None:
        for _ in range(per_key):
            started = time.perf_counter()
            await asyncio.sleep(0.05)
            samples.append((time.perf_counter() - started) * 1000 - 50)

    await asyncio.gather(*(one_key() for _ in range(CONCURRENT_KEYS)))
    recorder.add(Result(name=names.TIMER_BASELINE, unit="ms", samples=samples))


async def bench_suspension_roundtrip(recorder: Recorder, count: int) -> None:
    registry = ToolRegistry()
    registry.register("side_effect", lambda args: args, side_effect=True)
    harness = AgentHarness(act_then_resume, AgentConfig(tools=registry))
    samples = []
    for i in range(count):
        key = f"suspend-{i % 100}".encode()
        started = time.perf_counter()
        await harness.send_raw(harness.events_topic, key, EVENT)
        intent = harness.intents()[-1]
        await harness.send_result(harness.result_for(intent))
        samples.append((time.perf_counter() - started) * 1000)
    recorder.add(Result(name=names.SUSPENSION_ROUNDTRIP, unit="ms", samples=samples))


def state_with_memory(kib: int) -> KeyState:
    blob = MemoryBlob(entries={"document": MemoryEntry(value=b"m" * (kib * 1024), last_access_ms=1)})
    return KeyState(memory=blob, seq=1)


async def bench_state_commit(recorder: Recorder, kib: int, count: int) -> None:
    harness = AgentHarness(bump_counter, AgentConfig())
    key = b"stateful"
    harness.store[key] = encode_state(state_with_memory(kib))
    samples = [await timed(harness, key) for _ in range(count)]
    committed = len(harness.store[key])
    recorder.add(
        Result(name=names.STATE_COMMIT[kib], unit="ms", samples=samples, extra={"blob_bytes": committed})
    )


def bench_encode(recorder: Recorder, kib: int, count: int) -> None:
    state = state_with_memory(kib)
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        encode_state(state)
        samples.append((time.perf_counter() - started) * 1000)
    recorder.add(Result(name=names.ENCODE[kib], unit="ms", samples=samples, extra={"blob_kib": kib}))


async def run_runtime_benchmarks(recorder: Recorder, *, size: Size) -> None:
    """Every runtime-only benchmark of bench/names.py, in order."""
    counts: dict[str, Any] = COUNTS[size]
    progress("runtime benchmarks (in process, no broker)")
    await bench_noop(recorder, counts["noop"])
    for tier in names.OVERHEAD_TIERS_MS:
        await bench_overhead(recorder, tier, counts[f"overhead_{tier}"])
    await bench_timer_baseline(recorder, counts["overhead_50"])
    await bench_suspension_roundtrip(recorder, counts["suspend"])
    for kib in names.STATE_SIZES_KIB:
        await bench_state_commit(recorder, kib, counts["state"])
        bench_encode(recorder, kib, counts["encode"])
