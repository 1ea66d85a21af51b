"""Runtime-only benchmarks: in process, FakeLLM, no broker — keylane's own cost per activation.

Every activation goes through KeyRuntime exactly as in a worker (decode, state load,
activation, one encoded KeyState commit) via keylane.testing.AgentHarness; only the broker
round trips are absent.

The timer-based tiers (overhead_*, timer_baseline_50ms) run on an event loop of their own
whose timers wake to the microsecond (``microsecond_timers``). On asyncio's default epoll loop
a timer wakes only on a whole-millisecond grid, so ten keys sleeping 50 ms wake together and
each key's figure becomes the loop's whole period less 50 ms: a sawtooth of the burst's
length, not of what one activation costs (40 µs of CPU added to every activation took the
figure from 0.86 down to 0.36 ms).

Each benchmark warms up on a tenth of its work (discarded), then splits its count over
REPETITIONS[size] measured repetitions, each after a full garbage collection with the
survivors frozen (``gc.freeze``), so that one repetition does not pay for another's garbage.
A rate is the median of the repetitions' rates; samples are every repetition's together.
"""

from __future__ import annotations

import asyncio
import gc
import selectors
import statistics
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from bench import names
from bench.harness import REPETITIONS, Recorder, Result, Size, percentile, progress
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
from keylane.catalog import INTENTS
from keylane.cells import MemoryBlob, MemoryEntry
from keylane.core.state import KeyState, encode_state
from keylane.testing import AgentHarness
from keylane.wire import AgentEnvelope, ToolIntent, decode, encode

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
T = TypeVar("T")


@contextmanager
def collected_and_frozen() -> Iterator[None]:
    """A full collection, then every survivor frozen out of the collector's scans while the
    block runs: the block's collections see only its own objects."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def select_loop() -> asyncio.AbstractEventLoop:
    """An event loop whose selector (select(2)) takes its timeout in microseconds; epoll's
    takes whole milliseconds (see the module docstring)."""
    return asyncio.SelectorEventLoop(selectors.SelectSelector())


async def microsecond_timers(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """``main()`` on a select_loop of its own, in a thread."""

    def run() -> T:
        with asyncio.Runner(loop_factory=select_loop) as runner:
            return runner.run(main())

    return await asyncio.to_thread(run)


async def repeated(reps: int, count: int, measure: Callable[[int], Awaitable[T]]) -> list[T]:
    """``measure(n)`` once on a tenth of ``count`` to warm up (discarded), then ``reps`` times
    on ``count / reps`` each; the measured repetitions' results."""
    await measure(max(1, count // 10))
    results = []
    for _ in range(reps):
        with collected_and_frozen():
            results.append(await measure(max(1, count // reps)))
    return results


def sampled(name: str, unit: str, repetitions: list[list[float]], **extra: Any) -> Result:
    """A samples Result from each repetition's samples; a repetition's figure is its p50."""
    return Result(
        name=name,
        unit=unit,
        samples=[sample for rep in repetitions for sample in rep],
        repetitions=[percentile(sorted(rep), 50) for rep in repetitions],
        extra=extra,
    )


def rated(name: str, unit: str, rates: list[float], **extra: Any) -> Result:
    """A rate Result: the median of the repetitions' rates."""
    return Result(name=name, unit=unit, rate=statistics.median(rates), repetitions=rates, extra=extra)


async def timed(harness: AgentHarness, key: bytes, value: bytes = EVENT) -> float:
    """Wall milliseconds of one input record through the runtime, commit included."""
    started = time.perf_counter()
    await harness.send_raw(harness.events_topic, key, value)
    return (time.perf_counter() - started) * 1000


def noop_rate(keys: int) -> Callable[[int], Awaitable[float]]:
    """Activations/s of ``n`` no-op events over ``keys`` keys, on one harness."""
    harness = AgentHarness(noop, AgentConfig())
    key_list = [f"key-{i}".encode() for i in range(keys)]

    async def rate(n: int) -> float:
        started = time.perf_counter()
        for i in range(n):
            await harness.send_raw(harness.events_topic, key_list[i % keys], EVENT)
            if len(harness.published) > 10_000:
                harness.published.clear()
                harness.records.clear()
        return n / (time.perf_counter() - started)

    return rate


async def bench_noop(recorder: Recorder, count: int, reps: int) -> None:
    for name, keys in ((names.NOOP_1KEY, 1), (names.NOOP_1000KEYS, 1000)):
        rates = await repeated(reps, count, noop_rate(keys))
        recorder.add(rated(name, "activations/s", rates, keys=keys))


def overhead_sampler(tier_ms: int) -> Callable[[int], Coroutine[Any, Any, list[float]]]:
    """Wall time of ``n`` activations whose model call takes ``tier_ms``, less ``tier_ms``,
    CONCURRENT_KEYS keys at once: a sampler for a loop on microsecond timers."""
    provider = FakeLLM([(match_any(), respond_with(b"ok", latency_ms=tier_ms))])
    harness = AgentHarness(model_agent(), AgentConfig(), provider=provider)

    async def overheads(n: int) -> list[float]:
        samples: list[float] = []
        per_key = -(-n // CONCURRENT_KEYS)

        async def one_key(index: int) -> None:
            key = f"tier-key-{index}".encode()
            for _ in range(per_key):
                samples.append(await timed(harness, key) - tier_ms)

        await asyncio.gather(*(one_key(i) for i in range(CONCURRENT_KEYS)))
        return samples

    return overheads


async def timer_lateness(n: int) -> list[float]:
    """How late ``n`` asyncio.sleep(0.05) wake, CONCURRENT_KEYS at once."""
    samples: list[float] = []
    per_key = -(-n // CONCURRENT_KEYS)

    async def one_key() -> None:
        for _ in range(per_key):
            started = time.perf_counter()
            await asyncio.sleep(0.05)
            samples.append((time.perf_counter() - started) * 1000 - 50)

    await asyncio.gather(*(one_key() for _ in range(CONCURRENT_KEYS)))
    return samples


def suspension_sampler() -> Callable[[int], Coroutine[Any, Any, list[float]]]:
    """Wall time of ``n`` round trips over 100 keys: an activation that stages a tool intent
    and suspends, then the tool's result that resumes and completes it."""
    registry = ToolRegistry()
    registry.register("side_effect", lambda args: args, side_effect=True)
    harness = AgentHarness(act_then_resume, AgentConfig(tools=registry))

    async def round_trips(n: int) -> list[float]:
        samples = []
        for i in range(n):
            key = f"suspend-{i % 100}".encode()
            started = time.perf_counter()
            decision = await harness.send_raw(harness.events_topic, key, EVENT)
            # The intent this activation staged, from its own decision: harness.intents()
            # decodes everything published so far and would make the timing grow with the run.
            (staged,) = (emit for emit in decision.emits if emit.topic == INTENTS)
            await harness.send_result(harness.result_for(decode(staged.value, ToolIntent)))
            samples.append((time.perf_counter() - started) * 1000)
        return samples

    return round_trips


async def bench_overhead(recorder: Recorder, tier_ms: int, count: int, reps: int) -> None:
    """overhead_sampler's figures on microsecond timers."""
    overheads = overhead_sampler(tier_ms)
    progress(f"{names.OVERHEAD[tier_ms]}: {count} activations at {tier_ms} ms in {reps} repetition(s)")
    recorder.add(
        sampled(
            names.OVERHEAD[tier_ms],
            "ms",
            await microsecond_timers(lambda: repeated(reps, count, overheads)),
            provider_latency_ms=tier_ms,
            concurrent_keys=CONCURRENT_KEYS,
        )
    )


async def bench_timer_baseline(recorder: Recorder, count: int, reps: int) -> None:
    """How late asyncio.sleep(0.05) wakes under the same concurrency, on the same microsecond
    timers: part of every tier's measured overhead is this (the kernel's wake-up), not keylane."""
    repetitions = await microsecond_timers(lambda: repeated(reps, count, timer_lateness))
    recorder.add(sampled(names.TIMER_BASELINE, "ms", repetitions))


async def bench_suspension_roundtrip(recorder: Recorder, count: int, reps: int) -> None:
    round_trips = suspension_sampler()
    recorder.add(sampled(names.SUSPENSION_ROUNDTRIP, "ms", await repeated(reps, count, round_trips)))


def state_with_memory(kib: int) -> KeyState:
    blob = MemoryBlob(entries={"document": MemoryEntry(value=b"m" * (kib * 1024), last_access_ms=1)})
    return KeyState(memory=blob, seq=1)


async def bench_state_commit(recorder: Recorder, kib: int, count: int, reps: int) -> None:
    harness = AgentHarness(bump_counter, AgentConfig())
    key = b"stateful"
    harness.store[key] = encode_state(state_with_memory(kib))

    async def commits(n: int) -> list[float]:
        return [await timed(harness, key) for _ in range(n)]

    repetitions = await repeated(reps, count, commits)
    committed = len(harness.store[key])
    recorder.add(sampled(names.STATE_COMMIT[kib], "ms", repetitions, blob_bytes=committed))


async def bench_encode(recorder: Recorder, kib: int, count: int, reps: int) -> None:
    state = state_with_memory(kib)

    async def encodes(n: int) -> list[float]:
        samples = []
        for _ in range(n):
            started = time.perf_counter()
            encode_state(state)
            samples.append((time.perf_counter() - started) * 1000)
        return samples

    recorder.add(sampled(names.ENCODE[kib], "ms", await repeated(reps, count, encodes), blob_kib=kib))


async def run_runtime_benchmarks(recorder: Recorder, *, size: Size) -> None:
    """Every runtime-only benchmark of bench/names.py, in order."""
    counts: dict[str, Any] = COUNTS[size]
    reps = REPETITIONS[size]
    progress(f"runtime benchmarks (in process, no broker), {reps} repetition(s) each")
    await bench_noop(recorder, counts["noop"], reps)
    for tier in names.OVERHEAD_TIERS_MS:
        await bench_overhead(recorder, tier, counts[f"overhead_{tier}"], reps)
    await bench_timer_baseline(recorder, counts["overhead_50"], reps)
    await bench_suspension_roundtrip(recorder, counts["suspend"], reps)
    for kib in names.STATE_SIZES_KIB:
        await bench_state_commit(recorder, kib, counts["state"], reps)
        await bench_encode(recorder, kib, counts["encode"], reps)
