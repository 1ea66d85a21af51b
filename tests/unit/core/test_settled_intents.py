"""Settled intent ids: kept as 16 bytes each when they are UUIDs, found only on an id's boundary,
and read from a blob written before that form."""

from __future__ import annotations

import uuid

from msgspec.structs import replace

from keylane.authoring.api import AgentConfig, Complete
from keylane.authoring.context import ActivationContext
from keylane.core.state import KeyState, encode_state, is_settled, settle, settled_intent_ids
from keylane.testing import AgentHarness, ManualClock

KEY = b"cust-7"
FIRST, SECOND = "0f1e2d3c-4b5a-5968-8776-8594a3b2c1d0", "a1b2c3d4-e5f6-5a7b-9c8d-0e1f2a3b4c5d"


def test_uuids_are_kept_as_their_bytes_and_other_ids_as_strings() -> None:
    upper = SECOND.upper()  # a UUID, but not as keylane writes one: its bytes would not give it back
    settled_ids, settled_intents = settle(KeyState(), [FIRST, "intent-z", upper, f"{{{FIRST}}}"])

    assert settled_ids == uuid.UUID(FIRST).bytes
    assert settled_intents == ["intent-z", upper, f"{{{FIRST}}}"]
    state = KeyState(settled_ids=settled_ids, settled_intents=settled_intents)
    assert [is_settled(state, i) for i in (FIRST, "intent-z", upper, SECOND)] == [True, True, True, False]
    assert settled_intent_ids(state) == ["intent-z", upper, f"{{{FIRST}}}", FIRST]


def test_an_id_matches_only_on_a_boundary() -> None:
    """Sixteen bytes that straddle two kept ids are not a settled id, unless they are one."""
    kept = uuid.UUID(FIRST).bytes + uuid.UUID(SECOND).bytes
    straddling = str(uuid.UUID(bytes=kept[8:24]))

    assert not is_settled(KeyState(settled_ids=kept), straddling)
    assert is_settled(KeyState(settled_ids=kept + uuid.UUID(straddling).bytes), straddling)
    assert [is_settled(KeyState(settled_ids=kept), i) for i in (FIRST, SECOND)] == [True, True]


def test_no_new_ids_and_none_as_strings_keeps_the_state_s_own_values() -> None:
    state = KeyState(settled_ids=uuid.UUID(FIRST).bytes)

    settled_ids, settled_intents = settle(state, [])

    assert settled_ids is state.settled_ids and settled_intents is state.settled_intents


class ActsOnce:
    async def __call__(self, ctx: ActivationContext) -> Complete:
        ctx.act("notify", '{"to": "ops"}')
        return Complete(b"done")


async def test_a_blob_with_its_settled_ids_as_strings_still_acknowledges_their_results() -> None:
    """A key committed before settled_ids: the late result of an intent it settled is
    acknowledged, and the key's next commit keeps every id as its bytes."""
    harness = AgentHarness(ActsOnce(), AgentConfig(), clock=ManualClock())
    await harness.send_event(KEY, "go")
    [intent] = harness.intents()
    state = harness.state(KEY)
    assert state.settled_ids == uuid.UUID(intent.intent_id).bytes
    harness.store[KEY] = encode_state(replace(state, settled_intents=[intent.intent_id], settled_ids=b""))

    late = await harness.send_result(harness.result_for(intent))
    await harness.send_event(KEY, "again")

    assert late.emits == [] and harness.errors() == []
    [_, second] = harness.intents()
    moved = harness.state(KEY)
    assert (moved.settled_intents, settled_intent_ids(moved)) == ([], [intent.intent_id, second.intent_id])
