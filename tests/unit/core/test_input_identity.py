"""Inputs are recognised by identity, not by offset: every copy keylane re-produces (a re-route
to the key's partition, ShardKeys' copy) is the record it copies, and results nobody waits for
are acknowledged, not dead-lettered.

Each test here failed on the runtime that recognised repeats by offset alone.
"""

from __future__ import annotations

from types import SimpleNamespace

import msgspec
from msgspec.structs import replace

from keylane import metrics
from keylane.authoring.api import AgentConfig, Complete, Suspend
from keylane.authoring.context import ActivationContext
from keylane.catalog import EVENTS, EVENTS_SHARDED, OUTPUT
from keylane.core.state import SETTLED_INTENTS_KEPT, encode_state, settled_intent_ids
from keylane.records import ORIGIN_HEADER, InputRecord, origin_header, origin_of
from keylane.signing import Keyring
from keylane.testing import AgentHarness, ManualClock
from keylane.wire import AgentEnvelope, Approval, ToolResult, encode

KEY = b"cust-7"


async def counts(ctx: ActivationContext) -> Complete:
    """Counts its events in memory: a repeat or a gap shows in the output."""
    n = int(ctx.memory.get("n") or 0) + 1
    ctx.memory.set("n", n)
    return Complete(f"{ctx.event.decode()}:{n}".encode())


def event_record(
    offset: int, payload: str, *, origin: tuple[str, int, int] | None, topic: str = EVENTS
) -> InputRecord:
    return InputRecord(
        topic=topic,
        broker_topic=topic,
        partition=1,
        offset=offset,
        key=KEY,
        value=encode(AgentEnvelope(payload=payload)),
        origin=origin,
    )


def outputs(harness: AgentHarness) -> list[tuple[str, bytes]]:
    return [(e.record_id, e.value) for e in harness.published if e.topic == OUTPUT]


async def test_a_second_copy_of_a_rerouted_event_is_a_redelivery_not_a_new_event() -> None:
    # A librdkafka producer put the event on partition 4; the worker re-produced it to the
    # key's partition twice (a crash between the re-produce and the commit): offsets 10 and 13.
    harness = AgentHarness(counts, AgentConfig(), clock=ManualClock())
    first = event_record(10, "a", origin=("agent.events", 4, 7))
    second = replace(first, offset=13)

    await harness.redeliver(first)
    before = harness.store[KEY]
    again = await harness.redeliver(second)

    assert harness.state(KEY).seq == 1, "one activation, not two"
    assert again.new_state is not None and encode_state(again.new_state) == before
    [(first_id, first_value), (again_id, again_value)] = outputs(harness)
    assert (again_id, again_value) == (first_id, first_value) == (first_id, b"a:1")


async def test_copies_from_several_origins_and_originals_each_apply_once_in_order() -> None:
    harness = AgentHarness(counts, AgentConfig(), clock=ManualClock())
    stream = [
        event_record(0, "native-0", origin=None),
        event_record(1, "copy-4/7", origin=("agent.events", 4, 7)),
        event_record(2, "copy-5/3", origin=("agent.events", 5, 3)),
        event_record(3, "copy-4/7", origin=("agent.events", 4, 7)),  # repeated copy
        event_record(4, "copy-4/8", origin=("agent.events", 4, 8)),
        event_record(5, "native-5", origin=None),
        event_record(6, "copy-5/3", origin=("agent.events", 5, 3)),  # repeated copy
    ]
    for record in stream:
        await harness.redeliver(record)

    distinct = dict(outputs(harness))
    assert sorted(distinct.values()) == sorted(
        [b"native-0:1", b"copy-4/7:2", b"copy-5/3:3", b"copy-4/8:4", b"native-5:5"]
    )
    assert harness.state(KEY).seq == 5


async def test_a_sharded_copy_made_again_by_shard_keys_is_recognised_by_its_origin() -> None:
    harness = AgentHarness(counts, AgentConfig(), clock=ManualClock(), events_topic=EVENTS_SHARDED)
    copies = [
        event_record(o, "x", origin=("agent.events", 0, 48), topic=EVENTS_SHARDED) for o in (48, 50, 93)
    ]
    for copy in copies:
        await harness.redeliver(copy)

    assert harness.state(KEY).seq == 1
    assert {value for _, value in outputs(harness)} == {b"x:1"}


async def test_a_recreated_input_topic_is_read_as_new_records_not_as_redeliveries() -> None:
    harness = AgentHarness(counts, AgentConfig(), clock=ManualClock())
    for offset in range(3):
        await harness.redeliver(replace(event_record(offset, f"old-{offset}", origin=None), log_end=3))
    await harness.redeliver(replace(event_record(1, "old-1", origin=None), log_end=3))
    assert harness.state(KEY).seq == 3, "a redelivery below the log end is still a redelivery"

    # The topic was deleted and created again: its offsets start at 0 while the log ends at 1.
    await harness.redeliver(replace(event_record(0, "new-0", origin=None), log_end=1))

    assert harness.state(KEY).seq == 4
    assert outputs(harness)[-1][1] == b"new-0:4"


def test_the_origin_header_names_the_first_original_however_often_a_record_is_copied() -> None:
    original = SimpleNamespace(topic="t.agent.events", partition=4, offset=7, headers=[])
    header = origin_header(original)
    assert header == (ORIGIN_HEADER, b"t.agent.events/4/7")
    copy = SimpleNamespace(topic="t.agent.events", partition=1, offset=99, headers=[header])
    assert origin_header(copy) == header
    assert origin_of([header]) == ("t.agent.events", 4, 7)
    assert origin_of({ORIGIN_HEADER: b"a.b/c/1"}) is None  # a header that does not parse is ignored
    assert origin_of(None) is None


class FireAndForget:
    """Acts once and completes: nobody waits for the result."""

    async def __call__(self, ctx: ActivationContext) -> Complete:
        ctx.act("notify", '{"to": "ops"}')
        return Complete(b"done")


async def test_the_result_of_a_fire_and_forget_intent_is_acknowledged_not_dead_lettered() -> None:
    harness = AgentHarness(FireAndForget(), AgentConfig(), clock=ManualClock())
    await harness.send_event(KEY, "go")
    [intent] = harness.intents()
    before = metrics.UNAWAITED_RESULTS.labels("result")._value.get()

    decision = await harness.send_result(harness.result_for(intent))
    await harness.send_result(harness.result_for(intent))  # and a copy of it

    assert decision.emits == [] and harness.errors() == []
    assert metrics.UNAWAITED_RESULTS.labels("result")._value.get() == before + 2


async def waits_for_refund(ctx: ActivationContext) -> Complete | Suspend:
    if ctx.is_resume:
        return Complete(b"resumed")
    ctx.act("refund", '{"amount": 5}')
    return Suspend(snapshot=b"s")


async def test_a_repeated_result_after_its_resume_is_acknowledged_and_resumes_nothing() -> None:
    harness = AgentHarness(waits_for_refund, AgentConfig(), clock=ManualClock())
    await harness.send_event(KEY, "go")
    [intent] = harness.intents()
    await harness.send_result(harness.result_for(intent))
    seq = harness.state(KEY).seq

    again = await harness.send_result(harness.result_for(intent))  # the effector republished it

    assert again.emits == [] and harness.errors() == []
    assert harness.state(KEY).seq == seq


async def test_a_result_for_an_intent_the_key_never_issued_is_still_an_orphan() -> None:
    harness = AgentHarness(FireAndForget(), AgentConfig(), clock=ManualClock())
    await harness.send_event(KEY, "go")
    stranger = ToolResult(intent_id="not-ours", entity_key=KEY.decode(), status="OK")

    await harness.send_result(stranger)

    [error] = harness.errors()
    assert (error.reason, error.detail) == ("orphaned_result", "no_continuation")


async def test_settled_intents_are_bounded() -> None:
    async def acts_a_lot(ctx: ActivationContext) -> Complete:
        for i in range(SETTLED_INTENTS_KEPT + 10):
            ctx.act("notify", f'{{"n": {i}}}')
        return Complete(b"done")

    harness = AgentHarness(acts_a_lot, AgentConfig(), clock=ManualClock())
    await harness.send_event(KEY, "go")

    state = harness.state(KEY)
    settled = settled_intent_ids(state)
    assert len(settled) == SETTLED_INTENTS_KEPT
    assert settled == [i.intent_id for i in harness.intents()[-SETTLED_INTENTS_KEPT:]]
    assert state.settled_intents == [], "every id keylane mints is kept as its 16 bytes"


class AsksApproval:
    async def __call__(self, ctx: ActivationContext) -> Complete | Suspend:
        if ctx.is_resume:
            return Complete(b"approved" if ctx.resume_approval and ctx.resume_approval.approved else b"other")
        ctx.request_approval('{"refund": 500}')
        return Suspend(snapshot=b"s")


async def test_a_tool_result_carrying_an_approval_requests_id_does_not_resume_it() -> None:
    harness = AgentHarness(AsksApproval(), AgentConfig(), clock=ManualClock())
    await harness.send_event(KEY, "refund 500")
    [request] = harness.approval_requests()

    for status in ("OK", "EXPIRED"):
        forged = ToolResult(intent_id=request.intent_id, entity_key=KEY.decode(), status=status)  # type: ignore[arg-type]
        await harness.send_result(forged)

    assert [(e.reason, e.detail) for e in harness.errors()] == [("orphaned_result", "kind_mismatch")] * 2
    assert harness.state(KEY).continuation is not None, "the suspension still waits for a person"
    assert harness.outputs() == []
    approval = Approval(intent_id=request.intent_id, entity_key=KEY.decode(), approved=True, approver="ann")
    await harness.send_approval(approval)
    assert harness.outputs() == [(KEY, b"approved")]


async def test_under_require_only_a_signed_tool_result_resumes() -> None:
    keyring = Keyring.parse("k1:secret")
    harness = AgentHarness(waits_for_refund, AgentConfig(), clock=ManualClock())
    harness.runtime.keyring = keyring
    harness.runtime.result_signatures = "require"
    await harness.send_event(KEY, "go")
    [intent] = harness.intents()
    unsigned = harness.result_for(intent)
    badly_signed = replace_struct(keyring.sign(unsigned), status="ERROR")
    non_ascii = replace_struct(unsigned, key_id="k1", signature="ünïcode")

    for forged in (unsigned, badly_signed, non_ascii):
        await harness.send_result(forged)
    assert [e.reason for e in harness.errors()] == ["unsigned_result"] * 3
    assert harness.outputs() == []

    await harness.send_result(keyring.sign(unsigned))
    assert harness.outputs() == [(KEY, b"resumed")]


def replace_struct(result: ToolResult, **changes: object) -> ToolResult:
    return msgspec.structs.replace(result, **changes)
