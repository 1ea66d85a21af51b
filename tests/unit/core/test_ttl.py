"""TTL collection, broker-free: an idle key's state is collected down to a tombstone that never
re-mints ids, and a suspension it reaches is dead-lettered with its queued events."""

from __future__ import annotations

import base64
import json
import re

import pytest

from keylane.authoring.api import AgentConfig, Complete
from keylane.authoring.context import ActivationContext
from keylane.core.pages import decode_page, is_page_key
from keylane.core.state import ArmedTimer, PagedKeyState, decode_state
from keylane.core.timers import TTL, timer_token
from keylane.testing import AgentHarness, ManualClock
from tests.unit.hitl_support import (
    HOUR,
    KEY,
    TIMEOUT_OUTPUT,
    TTL_MS,
    WAIT_MS,
    AsksForApproval,
    approval,
    asked,
    assert_changed_nothing,
    harness_of,
    send_fire,
    the_error,
)


async def counts(ctx: ActivationContext) -> Complete:
    n = ctx.memory.get("n", 0) + 1
    ctx.memory.set("n", n)
    return Complete(str(n).encode())


def assert_collected(harness: AgentHarness) -> None:
    """TTL collected the key: only a tombstone (seq, applied offsets, and in its outbox the
    dead letters the collection staged, until confirmed) is left, with no timers."""
    state = harness.state(KEY)
    assert state.memory.entries == {} and state.continuation is None and state.pending == {}
    assert state.llm_cache == [] and state.buffered == []
    assert [o.label for o in state.outbox] == [
        e.reason for e in harness.errors() if e.reason == "ttl_wiped_suspension"
    ]
    assert state.timers == {}
    assert KEY in harness.store


async def test_an_idle_key_is_collected_after_ttl_and_starts_over() -> None:
    clock = ManualClock()
    harness = harness_of(counts, clock)
    await harness.send_event(KEY, "x")
    await harness.send_event(KEY, "x")

    clock.advance(TTL_MS - 1)
    assert await harness.fire_due_timers() == []
    assert KEY in harness.store

    clock.advance(1)
    [decision] = await harness.fire_due_timers()

    assert decision.new_state is not None
    assert_collected(harness)
    assert harness.state(KEY).seq == 2, "the tombstone keeps seq, so ids are never minted twice"
    assert harness.errors() == []
    assert len(harness.timers) == 0
    await harness.send_event(KEY, "x")
    assert [v for _, v in harness.outputs()] == [b"1", b"2", b"1"]


async def test_an_input_before_the_ttl_keeps_the_key() -> None:
    clock = ManualClock()
    harness = harness_of(counts, clock)
    await harness.send_event(KEY, "x")

    clock.advance(TTL_MS - 1)
    await harness.send_event(KEY, "x")
    clock.advance(1)
    assert await harness.fire_due_timers() == []  # the first TTL was superseded
    assert KEY in harness.store

    clock.advance(TTL_MS - 1)
    [decision] = await harness.fire_due_timers()
    assert decision.new_state is not None
    assert_collected(harness)


async def test_a_key_collected_by_ttl_does_not_reuse_the_intent_ids_of_its_previous_life() -> None:
    # The effector's claim store runs each intent id once and answers a repeated id with the
    # stored result: a new intent must never carry the id of an intent that already ran.
    async def refunds(ctx: ActivationContext) -> Complete:
        ctx.act("refund", '{"amount": ' + ctx.event.decode() + "}")
        return Complete(b"refunding")

    clock = ManualClock()
    harness = harness_of(refunds, clock)
    await harness.send_event(KEY, "5")
    clock.advance(TTL_MS)
    await harness.fire_due_timers()
    assert_collected(harness)

    await harness.send_event(KEY, "900")

    first, second = harness.intents()
    assert (first.args_json, second.args_json) == ('{"amount": 5}', '{"amount": 900}')
    assert second.intent_id != first.intent_id


async def test_a_key_collected_by_ttl_does_not_reuse_the_output_ids_of_its_previous_life() -> None:
    clock = ManualClock()
    harness = harness_of(counts, clock)
    await harness.send_event(KEY, "x")
    clock.advance(TTL_MS)
    await harness.fire_due_timers()

    await harness.send_event(KEY, "x")

    first, second = (e for e in harness.published if e.topic == "agent.output")
    assert second.record_id != first.record_id


async def test_when_both_timers_are_due_in_one_scan_the_hitl_fire_wins_and_the_key_survives() -> None:
    clock = ManualClock()
    harness, _ = await asked(clock)

    clock.advance(WAIT_MS + TTL_MS + HOUR)
    decisions = await harness.fire_due_timers()

    assert len(decisions) == 2  # HITL first, then the TTL fire it made stale
    assert decisions[1].new_state is None
    assert harness.outputs() == [(KEY, TIMEOUT_OUTPUT)]
    assert harness.errors() == []
    assert KEY in harness.store
    assert harness.state(KEY).timers == {
        TTL: ArmedTimer(deadline_ms=clock.now_ms + TTL_MS, token=timer_token(TTL, 1, clock.now_ms + TTL_MS))
    }


async def test_a_ttl_fire_reaching_a_live_suspension_wipes_it_and_says_so() -> None:
    clock = ManualClock()
    harness, approver = await asked(clock)
    [request] = harness.approval_requests()
    ttl = harness.state(KEY).timers[TTL]

    clock.advance(WAIT_MS + TTL_MS)  # the HITL fire was never delivered
    decision = await send_fire(harness, TTL, ttl.token, ttl.deadline_ms)

    assert decision.new_state is not None
    assert_collected(harness)
    error = the_error(harness)
    assert error.reason == "ttl_wiped_suspension"
    assert error.entity_key == KEY.decode()
    assert str(TTL_MS) in error.detail
    assert "seq 0" in error.detail
    assert harness.outputs() == []

    assert await harness.fire_due_timers() == []  # the undelivered HITL timer went with the state
    late = await harness.send_approval(approval(request.intent_id))
    assert late.new_state is None
    assert [(e.reason, e.detail) for e in harness.errors()][1:] == [("orphaned_result", "no_continuation")]
    assert approver.decisions == []


async def test_events_queued_behind_a_suspension_ttl_collected_are_each_dead_lettered_with_their_bytes() -> (
    None
):
    clock = ManualClock()
    harness, _ = await asked(clock)
    await harness.send_event(KEY, "queued-1", event_id="e-1")
    await harness.send_event(KEY, "queued-2", event_id="e-2")
    ttl = harness.state(KEY).timers[TTL]

    clock.advance(WAIT_MS + TTL_MS)
    await send_fire(harness, TTL, ttl.token, ttl.deadline_ms)

    errors = harness.errors()
    assert [e.reason for e in errors] == ["ttl_wiped_suspension"] * 3
    kept = [base64.b64decode(e.raw_value_b64 or "") for e in errors[1:]]
    assert [json.loads(k)["event_id"] for k in kept] == ["e-1", "e-2"], "nothing is lost silently"


async def test_a_redelivered_ttl_fire_publishes_its_dead_letters_again() -> None:
    # A crash after the tombstone's changelog record and before Kafka confirmed the dead
    # letters redelivers the fire: the tombstone's outbox must still hold them.
    clock = ManualClock()
    harness, _ = await asked(clock)
    await harness.send_event(KEY, "queued-1", event_id="e-1")
    ttl = harness.state(KEY).timers[TTL]
    clock.advance(WAIT_MS + TTL_MS)
    await send_fire(harness, TTL, ttl.token, ttl.deadline_ms)
    first = [e.error_id for e in harness.errors()]
    assert len(first) == 2
    fire = harness.records[-1]

    again = await harness.redeliver(fire)

    assert [e.record_id for e in again.emits] == first
    assert harness.state(KEY).continuation is None and harness.state(KEY).buffered == []


async def test_a_ttl_fire_for_a_key_already_collected_changes_nothing() -> None:
    clock = ManualClock()
    harness = harness_of(AsksForApproval(), clock)
    await harness.send_event(KEY, "hello")
    ttl = harness.state(KEY).timers[TTL]
    clock.advance(TTL_MS)
    await harness.fire_due_timers()
    assert_collected(harness)
    published = len(harness.published)
    before = harness.store[KEY]

    decision = await send_fire(harness, TTL, ttl.token, ttl.deadline_ms)

    assert_changed_nothing(harness, decision, before, published)


@pytest.mark.parametrize("ttl_ms", [0, -1])
def test_agent_config_refuses_a_non_positive_ttl(ttl_ms: int) -> None:
    with pytest.raises(ValueError, match=re.escape("AgentConfig.ttl_ms")):
        AgentConfig(ttl_ms=ttl_ms)


async def test_a_collected_key_whose_memory_was_paged_keeps_none_of_it_in_its_pages() -> None:
    """Compaction keeps each page's last value: the collection empties them, or an expired
    key would keep its memory in the changelog for good."""

    async def remembers(ctx: ActivationContext) -> Complete:
        for i in range(24):
            ctx.memory.set(f"note-{i}", ctx.event.decode() * 1000)
        return Complete(b"noted")

    clock = ManualClock()
    harness = harness_of(remembers, clock)
    await harness.send_event(KEY, "x")
    pages = [k for k in harness.store if is_page_key(k)]
    assert pages and sum(len(harness.store[k]) for k in pages) > 24_000, "the memory is paged"

    clock.advance(TTL_MS)
    [decision] = await harness.fire_due_timers()

    assert decision.new_state is not None
    assert_collected(harness)
    assert not isinstance(decode_state(harness.store[KEY]), PagedKeyState)
    left = {k: v for k, v in harness.store.items() if is_page_key(k)}
    assert set(pages) <= set(left)
    assert all(decode_page(v, "") == {} for v in left.values())
    await harness.send_event(KEY, "y")  # the key starts over, paged again
    assert harness.state(KEY).memory.entries["note-3"].value == "y" * 1000
