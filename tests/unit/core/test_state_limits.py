"""A key's whole state fits one changelog record: what is trimmed, and what fails cleanly.

The limit is what one changelog record carries (``KeyRuntime(changelog_max_bytes=...)``, which
the worker takes from its producer and topic configuration) minus the record's overhead, or
``AgentConfig.max_state_bytes`` when that is lower.
"""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from keylane.authoring.api import AgentConfig, Complete, Suspend
from keylane.authoring.context import ActivationContext
from keylane.authoring.hitl import Deny, HitlPolicy
from keylane.authoring.memory import MemoryOverflow
from keylane.catalog import EVENTS, RESULTS
from keylane.core import activation
from keylane.core.activation import KeyRuntime
from keylane.core.state import encode_state
from keylane.llm.fake import FakeLLM, match_any, respond_with
from keylane.llm.types import LlmRequest
from keylane.testing import AgentHarness, ManualClock

KEY = b"ticket-9"


def over_limit() -> float:
    return REGISTRY.get_sample_value("keylane_state_over_limit_total") or 0.0


def trimmed() -> float:
    return REGISTRY.get_sample_value("keylane_state_cache_trimmed_total") or 0.0


async def outputs_what_it_is_told(ctx: ActivationContext) -> Complete | Suspend:
    """Event "<n>": output n bytes. "wait": suspend on a tool. "ask": call the model first.
    "ask and wait": call the model, then suspend on a tool."""
    if ctx.is_resume:
        return Complete(b"resumed")
    if ctx.event == b"wait":
        ctx.act("refund", "{}")
        return Suspend()
    if ctx.event in (b"ask", b"ask and wait"):
        await ctx.call_model(LlmRequest(model_id="m", messages=["hello"]))
        if ctx.event == b"ask and wait":
            ctx.act("refund", "{}")
            return Suspend()
        return Complete(b"asked")
    return Complete(b"o" * int(ctx.event))


def test_the_limit_is_the_changelog_record_minus_its_overhead_and_key_or_the_config_cap() -> None:
    default = KeyRuntime(outputs_what_it_is_told, AgentConfig())
    wide = KeyRuntime(outputs_what_it_is_told, AgentConfig(), changelog_max_bytes=2 * 1024 * 1024)
    capped = KeyRuntime(
        outputs_what_it_is_told, AgentConfig(max_state_bytes=65536), changelog_max_bytes=1 << 21
    )

    overhead = activation.RECORD_OVERHEAD_BYTES + len(KEY)
    assert default.state_limit(KEY) == activation.DEFAULT_CHANGELOG_MAX_BYTES - overhead
    assert wide.state_limit(KEY) == 2 * 1024 * 1024 - overhead
    assert capped.state_limit(KEY) == 65536


async def test_an_output_too_big_for_the_changelog_fails_its_activation_and_changes_nothing() -> None:
    """The output waits in the outbox, inside the state blob, until it is delivered: a blob over
    the changelog's record limit would fail inside Faust on every redelivery."""
    harness = AgentHarness(outputs_what_it_is_told, AgentConfig(), clock=ManualClock())
    await harness.send_event(KEY, "10")
    committed = harness.store[KEY]
    before = over_limit()

    decision = await harness.send_event(KEY, "1100000")

    assert decision.new_state is None
    assert harness.store[KEY] == committed
    assert [v for _, v in harness.outputs()] == [b"o" * 10]
    [error] = harness.errors()
    assert error.reason == "state_too_large"
    assert f"over its limit of {harness.runtime.state_limit(KEY)}" in error.detail
    assert "outbox 1100" in error.detail  # says which cell took the room
    assert error.origin is not None and (error.origin.topic, error.origin.offset) == (EVENTS, 1)
    assert over_limit() == before + 1


async def test_a_wider_changelog_takes_what_the_default_refuses_and_the_blob_stays_under_it() -> None:
    harness = AgentHarness(outputs_what_it_is_told, AgentConfig(), clock=ManualClock())
    harness.runtime.changelog_max_bytes = 2 * 1024 * 1024

    decision = await harness.send_event(KEY, "1100000")

    assert harness.errors() == []
    assert decision.new_state is not None and decision.blob == encode_state(decision.new_state)
    assert len(harness.store[KEY]) <= harness.runtime.state_limit(KEY)


async def test_a_memory_write_that_fits_the_memory_cap_but_not_the_state_blob_raises_memory_overflow() -> (
    None
):
    """The 1 MiB memory cap alone let memory and the rest of the state outgrow one record."""
    caught: list[MemoryOverflow] = []

    async def remembers(ctx: ActivationContext) -> Complete | Suspend:
        try:
            ctx.memory.set("notes", "n" * int(ctx.event))
        except MemoryOverflow as exc:
            caught.append(exc)
            return Complete(b"kept memory as it was")
        return Complete(b"stored")

    harness = AgentHarness(remembers, AgentConfig(), clock=ManualClock())
    await harness.send_event(KEY, "1000")

    await harness.send_event(KEY, "1000000")  # under the 1 MiB memory cap, over the record

    [overflow] = caught
    assert "the key's state leaves for memory" in str(overflow)
    assert harness.state(KEY).memory.entries["notes"].value == "n" * 1000
    assert [v for _, v in harness.outputs()] == [b"stored", b"kept memory as it was"]
    assert len(harness.store[KEY]) <= harness.runtime.state_limit(KEY)


async def test_the_replay_cache_is_trimmed_first_so_the_input_still_commits() -> None:
    provider = FakeLLM([(match_any(), respond_with(b"r" * 40_000))])
    config = AgentConfig(max_state_bytes=60_000)
    harness = AgentHarness(outputs_what_it_is_told, config, provider=provider, clock=ManualClock())
    await harness.send_event(KEY, "ask and wait")
    assert len(harness.state(KEY).llm_cache) == 1, "a suspended activation keeps its model calls"
    before = trimmed()

    await harness.send_event(KEY, "3" * 30_000)  # 30 KB queued + 40 KB cache do not fit 60 KB

    assert harness.errors() == []
    assert [b.payload for b in harness.state(KEY).buffered] == [b"3" * 30_000]
    assert harness.state(KEY).llm_cache == []
    assert trimmed() == before + 1
    assert len(harness.store[KEY]) <= 60_000


async def test_the_replay_cache_lives_until_its_activation_completes() -> None:
    provider = FakeLLM([(match_any(), respond_with(b"verdict"))])
    harness = AgentHarness(outputs_what_it_is_told, AgentConfig(), provider=provider, clock=ManualClock())
    await harness.send_event(KEY, "ask")
    assert harness.state(KEY).llm_cache == [], "no activation of a completed seq runs again"

    await harness.send_event(KEY, "ask and wait")
    assert len(harness.state(KEY).llm_cache) == 1
    [intent] = harness.intents()
    await harness.send_result(harness.result_for(intent))

    assert [v for _, v in harness.outputs()] == [b"asked", b"resumed"]
    assert harness.state(KEY).llm_cache == []
    assert provider.call_count == 2


async def test_a_queued_event_whose_activation_does_not_fit_fails_alone_and_the_next_one_runs() -> None:
    harness = AgentHarness(outputs_what_it_is_told, AgentConfig(max_state_bytes=20_000), clock=ManualClock())
    await harness.send_event(KEY, "wait")
    for event in ["5", "30000", "7"]:
        await harness.send_event(KEY, event)
    before = over_limit()

    await harness.send_result(harness.result_for(harness.intents()[0]))

    assert [v for _, v in harness.outputs()] == [b"resumed", b"o" * 5, b"o" * 7]
    [error] = harness.errors()
    assert error.reason == "state_too_large"
    assert error.origin is not None and (error.origin.topic, error.origin.offset) == (EVENTS, 2)
    assert over_limit() == before + 1
    state = harness.state(KEY)
    assert state.continuation is None and state.buffered == []


async def test_a_resume_whose_state_does_not_fit_fails_and_the_key_stays_suspended() -> None:
    async def big_on_resume(ctx: ActivationContext) -> Complete | Suspend:
        if ctx.is_resume:
            return Complete(b"R" * 30_000)
        ctx.act("refund", "{}")
        return Suspend()

    harness = AgentHarness(big_on_resume, AgentConfig(max_state_bytes=20_000), clock=ManualClock())
    await harness.send_event(KEY, "go")
    suspended = harness.store[KEY]

    decision = await harness.send_result(harness.result_for(harness.intents()[0]))

    assert decision.new_state is None and harness.store[KEY] == suspended
    assert harness.outputs() == []
    [error] = harness.errors()
    assert error.reason == "state_too_large"
    assert error.origin is not None and error.origin.topic == RESULTS


@pytest.mark.parametrize("cap", [0, 100, 4095, 1.5])
def test_max_state_bytes_is_validated_when_the_config_is_built(cap: object) -> None:
    with pytest.raises(ValueError, match="max_state_bytes"):
        AgentConfig(max_state_bytes=cap)  # type: ignore[arg-type]


async def test_a_suspension_that_times_out_drops_its_replay_cache() -> None:
    clock = ManualClock()
    provider = FakeLLM([(match_any(), respond_with(b"verdict"))])
    config = AgentConfig(hitl_policy=HitlPolicy(timeout_ms=60_000, on_timeout=Deny(b"timed out")))
    harness = AgentHarness(outputs_what_it_is_told, config, provider=provider, clock=clock)
    await harness.send_event(KEY, "ask and wait")
    assert len(harness.state(KEY).llm_cache) == 1

    clock.advance(60_000)
    await harness.fire_due_timers()

    assert [v for _, v in harness.outputs()] == [b"timed out"]
    assert harness.state(KEY).continuation is None and harness.state(KEY).llm_cache == []
