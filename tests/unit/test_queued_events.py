"""Events queued behind a suspension: how they run once it ends, and what their failures say."""

from __future__ import annotations

import base64

from service.catalog import EVENTS, OUTPUT
from service.records import InputRecord
from service.runtime import ids
from service.runtime.activation import KeyRuntime
from service.runtime.api import AgentConfig, Complete, Suspend
from service.runtime.context import ActivationContext
from service.runtime.state import KeyState, decode_state, encode_state
from service.testing import AgentHarness, ManualClock
from service.wire import AgentEnvelope, ErrorRecord, decode, encode

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
