"""Events queued behind a suspension: how they run once it ends, what their failures say, and
how many may wait (the per-key caps and their dead letters)."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from prometheus_client import REGISTRY

from keylane import ids
from keylane.authoring.api import AgentConfig, Complete, Suspend
from keylane.authoring.context import ActivationContext
from keylane.catalog import EVENTS, OUTPUT
from keylane.core.activation import KeyRuntime
from keylane.core.state import KeyState, decode_state, encode_state
from keylane.records import InputRecord
from keylane.testing import AgentHarness, ManualClock
from keylane.wire import AgentEnvelope, Approval, ErrorRecord, decode, encode

KEY = b"ticket-3"


async def suspends_on_wait(ctx: ActivationContext) -> Complete | Suspend:
    """Suspends on events "wait*", fails on "boom", otherwise echoes the event."""
    if ctx.is_resume:
        return Complete(b"resumed " + ctx.snapshot)
    if ctx.event.startswith(b"wait"):
        ctx.act("refund", "{}")
        return Suspend(snapshot=ctx.event)
    if ctx.event == b"boom":
        raise RuntimeError("queued event broke")
    return Complete(b"ran " + ctx.event)


async def test_a_queued_event_that_suspends_again_keeps_the_rest_queued() -> None:
    harness = AgentHarness(suspends_on_wait, AgentConfig(), clock=ManualClock())
    await harness.send_event(KEY, "wait-1")
    for event in ["a", "wait-2", "b"]:
        await harness.send_event(KEY, event)
    [first] = harness.intents()

    await harness.send_result(harness.result_for(first))

    assert [v for _, v in harness.outputs()] == [b"resumed wait-1", b"ran a"]
    state = harness.state(KEY)
    assert state.continuation is not None
    assert state.continuation.snapshot == b"wait-2"
    assert [b.payload for b in state.buffered] == [b"b"]

    await harness.send_result(harness.result_for(harness.intents()[1]))

    assert [v for _, v in harness.outputs()][2:] == [b"resumed wait-2", b"ran b"]
    assert harness.state(KEY).buffered == []


async def test_redelivering_the_resuming_result_republishes_the_drained_outputs_and_runs_nothing() -> None:
    harness = AgentHarness(suspends_on_wait, AgentConfig(), clock=ManualClock())
    await harness.send_event(KEY, "wait")
    await harness.send_event(KEY, "queued")
    [intent] = harness.intents()
    decision = await harness.send_result(harness.result_for(intent))
    committed = harness.store[KEY]

    again = await harness.redeliver(harness.records[-1])

    assert again.new_state is not None and encode_state(again.new_state) == committed  # rewritten as is
    assert harness.store[KEY] == committed
    assert [(e.record_id, e.value) for e in again.emits] == [(e.record_id, e.value) for e in decision.emits]
    assert [e.record_id for e in again.emits] == [ids.output_id(KEY, 0), ids.output_id(KEY, 2)]
    assert [e.topic for e in again.emits] == [OUTPUT, OUTPUT]


async def test_a_redelivered_queued_event_is_not_queued_twice() -> None:
    harness = AgentHarness(suspends_on_wait, AgentConfig(), clock=ManualClock())
    await harness.send_event(KEY, "wait")
    await harness.send_event(KEY, "once")
    queued = harness.store[KEY]

    again = await harness.redeliver(harness.records[-1])

    assert again.emits == []
    assert again.new_state is not None and encode_state(again.new_state) == queued  # rewritten as is
    assert harness.store[KEY] == queued
    assert [b.payload for b in harness.state(KEY).buffered] == [b"once"]
    await harness.send_result(harness.result_for(harness.intents()[0]))
    assert [v for _, v in harness.outputs()] == [b"resumed wait", b"ran once"]


async def test_a_failing_queued_event_becomes_an_error_and_the_next_one_still_runs() -> None:
    harness = AgentHarness(suspends_on_wait, AgentConfig(), clock=ManualClock())
    await harness.send_event(KEY, "wait")
    await harness.send_event(KEY, "boom")
    await harness.send_event(KEY, "after")

    await harness.send_result(harness.result_for(harness.intents()[0]))

    [error] = harness.errors()
    assert error.reason == "activation_error"
    assert "queued event broke" in error.detail
    assert error.origin is not None
    assert (error.origin.topic, error.origin.offset) == (EVENTS, 1)
    assert [v for _, v in harness.outputs()] == [b"resumed wait", b"ran after"]
    assert harness.state(KEY).buffered == []


async def test_a_failing_queued_event_keeps_the_raw_bytes_of_the_record_that_was_sent() -> None:
    """agent.errors keeps the input's raw bytes ("nothing is dropped silently"): for an event
    that waited behind a suspension that is the envelope that was sent, event_id included."""
    harness = AgentHarness(suspends_on_wait, AgentConfig(), clock=ManualClock())
    await harness.send_event(KEY, "wait")
    await harness.send_event(KEY, "boom", event_id="evt-42")
    sent = harness.records[-1].value

    await harness.send_result(harness.result_for(harness.intents()[0]))

    [error] = harness.errors()
    assert error.raw_value_b64 is not None
    assert base64.b64decode(error.raw_value_b64) == sent


async def test_a_failing_queued_event_names_the_broker_topic_it_came_from() -> None:
    """RecordOrigin is "enough to find it again with any Kafka client": behind a topic prefix
    that is the broker's topic name, as for an event that fails without waiting."""
    runtime = KeyRuntime(suspends_on_wait, AgentConfig(), clock=ManualClock())
    store: dict[bytes, bytes] = {}

    def state_of(key: bytes) -> KeyState:
        return decode_state(store.get(key))

    async def deliver(topic: str, broker_topic: str, offset: int, value: bytes) -> list[ErrorRecord]:
        record = InputRecord(
            topic=topic, broker_topic=broker_topic, partition=4, offset=offset, key=KEY, value=value
        )
        decision = await runtime.handle(record, state_of)
        if decision.new_state is not None:
            store[KEY] = encode_state(decision.new_state)
        return [decode(e.value, ErrorRecord) for e in decision.emits if e.topic == "agent.errors"]

    await deliver(EVENTS, "prod.agent.events", 10, encode(AgentEnvelope(payload="wait")))
    await deliver(EVENTS, "prod.agent.events", 11, encode(AgentEnvelope(payload="boom")))
    continuation = state_of(KEY).continuation
    assert continuation is not None
    [intent_id] = continuation.pending_intent_ids
    result = f'{{"v":1,"intent_id":"{intent_id}","entity_key":"{KEY.decode()}","status":"OK"}}'.encode()

    [error] = await deliver("agent.results", "prod.agent.results", 0, result)

    assert error.origin is not None
    assert (error.origin.topic, error.origin.partition, error.origin.offset) == ("prod.agent.events", 4, 11)
    assert error.error_id == ids.error_id("prod.agent.events", 4, 11, "activation_error")


# --- How many events may wait, and what happens to one that does not fit -------------------


async def waits_for_approval(ctx: ActivationContext) -> Complete | Suspend:
    """Asks for an approval on "ask", otherwise echoes the event."""
    if ctx.is_resume:
        return Complete(b"approved")
    if ctx.event == b"ask":
        ctx.request_approval("{}")
        return Suspend()
    return Complete(b"ran " + ctx.event[:8])


FAUST_MAX_REQUEST_SIZE = 1_000_000
"""Faust's default producer_max_request_size: a bigger changelog record is never sent."""


def rejected(limit: str) -> float:
    value = REGISTRY.get_sample_value("keylane_buffered_events_rejected_total", {"limit": limit})
    return value or 0.0


def approve(harness: AgentHarness) -> Approval:
    [request] = harness.approval_requests()
    return Approval(intent_id=request.intent_id, entity_key=request.entity_key, approved=True, approver="ops")


async def test_480_events_of_1_kb_behind_one_approval_keep_the_state_under_its_limit() -> None:
    """The issue's case: 8 minutes at 1 event/s behind a 24 h approval used to reach the
    changelog's record limit. The queue stops at max_buffered_bytes; the rest are dead letters."""
    harness = AgentHarness(waits_for_approval, AgentConfig(), clock=ManualClock())
    await harness.send_event(KEY, "ask")
    before = rejected("bytes")

    for i in range(480):
        await harness.send_event(KEY, f"{i:04d}" + "x" * 1020)
        assert len(harness.store[KEY]) < FAUST_MAX_REQUEST_SIZE, f"state blob too big at event {i}"
    assert len(harness.store[KEY]) <= harness.runtime.state_limit(KEY)

    queued = harness.state(KEY).buffered
    assert 0 < len(queued) < 480
    assert sum(len(b.value) for b in queued) <= AgentConfig().max_buffered_bytes
    errors = harness.errors()
    assert [e.reason for e in errors] == ["buffer_full"] * (480 - len(queued))
    assert rejected("bytes") == before + len(errors)
    # Each dead letter names its own record: the first one refused is the first one not queued.
    assert errors[0].origin is not None and errors[0].origin.offset == 1 + len(queued)

    await harness.send_approval(approve(harness))

    outputs = [v for _, v in harness.outputs()]
    assert outputs == [b"approved", *(b"ran " + f"{i:04d}".encode() + b"xxxx" for i in range(len(queued)))]
    assert harness.state(KEY).buffered == []


async def test_an_event_past_max_buffered_events_is_dead_lettered_and_changes_nothing() -> None:
    harness = AgentHarness(suspends_on_wait, AgentConfig(max_buffered_events=2), clock=ManualClock())
    await harness.send_event(KEY, "wait")
    await harness.send_event(KEY, "a")
    await harness.send_event(KEY, "b")
    committed = harness.store[KEY]
    before = rejected("events")

    decision = await harness.send_event(KEY, "c", event_id="evt-c")

    assert decision.new_state is None  # the key's state is not rewritten
    assert harness.store[KEY] == committed
    [error] = harness.errors()
    assert error.reason == "buffer_full"
    assert "max_buffered_events=2" in error.detail
    assert error.origin is not None and (error.origin.topic, error.origin.offset) == (EVENTS, 3)
    assert error.raw_value_b64 is not None
    assert base64.b64decode(error.raw_value_b64) == harness.records[-1].value
    assert rejected("events") == before + 1

    await harness.send_result(harness.result_for(harness.intents()[0]))

    assert [v for _, v in harness.outputs()] == [b"resumed wait", b"ran a", b"ran b"]
    await harness.send_event(KEY, "d")  # not suspended any more: runs at once
    assert [v for _, v in harness.outputs()][-1] == b"ran d"


async def test_an_event_past_max_buffered_bytes_is_dead_lettered_and_a_smaller_one_still_queues() -> None:
    harness = AgentHarness(suspends_on_wait, AgentConfig(max_buffered_bytes=200), clock=ManualClock())
    await harness.send_event(KEY, "wait")
    await harness.send_event(KEY, "a" * 100)
    before = rejected("bytes")

    await harness.send_event(KEY, "b" * 100)
    await harness.send_event(KEY, "c")

    [error] = harness.errors()
    assert error.reason == "buffer_full" and "max_buffered_bytes=200" in error.detail
    assert error.origin is not None and error.origin.offset == 2
    assert rejected("bytes") == before + 1
    assert [b.payload for b in harness.state(KEY).buffered] == [b"a" * 100, b"c"]


async def test_an_event_that_would_take_the_state_past_its_limit_is_dead_lettered() -> None:
    config = AgentConfig(max_state_bytes=8192, max_buffered_bytes=1 << 20)
    harness = AgentHarness(suspends_on_wait, config, clock=ManualClock())
    await harness.send_event(KEY, "wait")
    await harness.send_event(KEY, "a" * 3000)
    committed = harness.store[KEY]
    before = rejected("state")

    await harness.send_event(KEY, "b" * 6000)

    [error] = harness.errors()
    assert error.reason == "buffer_full" and "over its limit of 8192" in error.detail
    assert harness.store[KEY] == committed
    assert rejected("state") == before + 1


async def test_a_queued_event_is_stored_once() -> None:
    """Each queued event costs the state about its record's size, not twice that."""
    harness = AgentHarness(suspends_on_wait, AgentConfig(), clock=ManualClock())
    await harness.send_event(KEY, "wait")
    await harness.send_event(KEY, "a")  # the suspending event's outbox entries are gone from here on
    empty = len(harness.store[KEY])
    payload = "p" * 10_000

    await harness.send_event(KEY, payload)

    grew = len(harness.store[KEY]) - empty
    assert len(harness.records[-1].value or b"") < grew < len(harness.records[-1].value or b"") + 200
    assert harness.store[KEY].count(payload.encode()) == 1


async def test_the_buffered_depth_is_observed_per_queued_event() -> None:
    harness = AgentHarness(suspends_on_wait, AgentConfig(), clock=ManualClock())
    await harness.send_event(KEY, "wait")
    before = REGISTRY.get_sample_value("keylane_buffered_depth_sum") or 0.0

    for event in ["a", "b", "c"]:
        await harness.send_event(KEY, event)

    assert REGISTRY.get_sample_value("keylane_buffered_depth_sum") == before + 1 + 2 + 3


@pytest.mark.parametrize(
    "options",
    [
        {"max_buffered_events": -1},
        {"max_buffered_bytes": -1},
        {"max_buffered_events": 1.5},
        {"on_buffer_full": "drop_oldest"},
    ],
)
def test_buffer_limits_are_validated_when_the_config_is_built(options: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="AgentConfig"):
        AgentConfig(**options)
