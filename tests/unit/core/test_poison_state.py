"""Poison state, broker-free: a key whose stored blob does not read is quarantined and its
inputs dead-lettered at once, the other keys go on; and no committed blob is one that would
not read back (a value of the wrong type fails the input instead of poisoning the key)."""

from __future__ import annotations

import base64
import json

import msgspec
import pytest

import keylane.core.state
from keylane.authoring.api import AgentConfig, Complete, Suspend
from keylane.authoring.context import ActivationContext
from keylane.authoring.hitl import Deny, Escalate, FallbackContext, HitlPolicy
from keylane.core.quarantine import Quarantine
from keylane.core.state import KeyState, encode_state
from keylane.testing import AgentHarness, ManualClock

KEY = b"poisoned"
OTHER = b"healthy"


async def counts(ctx: ActivationContext) -> Complete:
    n = ctx.memory.get("n", 0) + 1
    ctx.memory.set("n", n)
    return Complete(str(n).encode())


FROM_THE_FUTURE = msgspec.msgpack.encode({"state_schema_version": 99, "seq": 3})
NOT_MSGPACK = b"\xc1\xc1 not a state"


@pytest.mark.parametrize(
    ("blob", "says"), [(FROM_THE_FUTURE, "schema version 99"), (NOT_MSGPACK, "does not decode")]
)
async def test_an_unreadable_blob_quarantines_its_key_and_dead_letters_each_input(
    blob: bytes, says: str
) -> None:
    harness = AgentHarness(counts, AgentConfig(), clock=ManualClock())
    harness.store[KEY] = blob

    first = await harness.send_event(KEY, "one")
    await harness.send_event(OTHER, "fine")
    second = await harness.send_event(KEY, "two")

    assert first.new_state is None and second.new_state is None
    assert harness.store[KEY] == blob, "the unreadable blob is left for the operator"
    errors = harness.errors()
    assert [e.reason for e in errors] == ["poison_state", "poison_state"]
    assert all(says in e.detail and "quarantined" in e.detail for e in errors)
    assert [json.loads(base64.b64decode(e.raw_value_b64 or ""))["payload"] for e in errors] == ["one", "two"]
    assert harness.outputs() == [(OTHER, b"1")]
    assert KEY in harness.runtime.quarantine and len(harness.runtime.quarantine) == 1


async def test_a_key_leaves_quarantine_once_its_state_reads_again() -> None:
    harness = AgentHarness(counts, AgentConfig(), clock=ManualClock())
    harness.store[KEY] = FROM_THE_FUTURE
    await harness.send_event(KEY, "one")
    assert KEY in harness.runtime.quarantine

    del harness.store[KEY]  # the operator removed the key's state (or rolled forward)
    await harness.send_event(KEY, "two")

    assert KEY not in harness.runtime.quarantine
    assert harness.outputs() == [(KEY, b"1")]


def test_the_timer_rebuild_skips_and_quarantines_unreadable_blobs() -> None:
    quarantine = Quarantine()
    good = encode_state(KeyState(seq=4))

    readable = list(quarantine.readable([(OTHER, good), (KEY, FROM_THE_FUTURE), (b"also", good)]))

    assert [(k, s.seq) for k, s in readable] == [(OTHER, 4), (b"also", 4)]
    assert KEY in quarantine and len(quarantine) == 1
    assert list(quarantine.readable([(OTHER, good)])) and len(quarantine) == 0, "a rebuild starts over"


async def test_a_state_that_would_not_read_back_fails_the_input_and_commits_nothing() -> None:
    # A config built before AgentConfig checked ttl_ms's type (or patched after): the float
    # deadline it arms would not decode as the timer's int field.
    config = AgentConfig()
    object.__setattr__(config, "ttl_ms", 3.6e6)
    harness = AgentHarness(counts, config, clock=ManualClock())

    decision = await harness.send_event(KEY, "one")

    assert decision.new_state is None
    assert KEY not in harness.store
    [error] = harness.errors()
    assert error.reason == "activation_error"
    assert "would not decode" in error.detail and "nothing was committed" in error.detail
    assert KEY not in harness.runtime.quarantine


@pytest.mark.parametrize("patched", ["ttl_ms", "hitl_policy.timeout_ms"])
async def test_a_patched_config_fails_the_input_of_an_agent_that_writes_nothing(
    patched: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Such an activation's state is committed without decoding its blob (keylane.core.state.
    seal), but not when the config's times are not ints: it is decoded and refused. (As in a
    worker: without the check the tests run with.)"""
    monkeypatch.setattr(keylane.core.state, "CHECK_ROUND_TRIPS", False)

    async def suspends(ctx: ActivationContext) -> Suspend:
        return Suspend()

    config = AgentConfig(hitl_policy=HitlPolicy())
    owner = config.hitl_policy if patched.startswith("hitl") else config
    object.__setattr__(owner, patched.rsplit(".", 1)[-1], 3.6e6)
    harness = AgentHarness(suspends, config, clock=ManualClock())

    decision = await harness.send_event(KEY, "one")

    assert decision.new_state is None and KEY not in harness.store
    [error] = harness.errors()
    assert "would not decode" in error.detail


async def test_an_intent_names_its_tool_with_a_str() -> None:
    async def acts(ctx: ActivationContext) -> Complete:
        ctx.act(7, "{}")  # type: ignore[arg-type]
        return Complete()

    harness = AgentHarness(acts, AgentConfig(), clock=ManualClock())
    await harness.send_event(KEY, "one")

    [error] = harness.errors()
    assert "a tool name or approval channel must be a str, got int" in error.detail
    assert KEY not in harness.store


def test_configs_refuse_values_the_state_cannot_hold() -> None:
    with pytest.raises(
        ValueError, match=r"AgentConfig.ttl_ms must be a positive number of ms, got 3600000.0"
    ):
        AgentConfig(ttl_ms=3.6e6)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"Deny\.output must be bytes, got str"):
        Deny(output="text")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"Escalate\.timeout_ms"):
        Escalate("manager", "{}", 1.5)  # type: ignore[arg-type]


async def test_a_timeout_policy_returning_a_text_output_fails_closed_as_hitl_timeout() -> None:
    def deny_with_text(context: FallbackContext) -> Deny:
        return Deny(output="timed out")  # type: ignore[arg-type]

    async def waits(ctx: ActivationContext) -> Suspend:
        ctx.act("refund", "{}")
        return Suspend(timeout_ms=1_000)

    clock = ManualClock()
    harness = AgentHarness(waits, AgentConfig(hitl_policy=HitlPolicy(on_timeout=deny_with_text)), clock=clock)
    await harness.send_event(KEY, "refund")
    clock.advance(1_000)

    await harness.fire_due_timers()

    assert [e.reason for e in harness.errors()] == ["hitl_timeout"]
    assert "Deny.output must be bytes" in harness.errors()[0].detail
    assert harness.state(KEY).continuation is None, "the key reads and goes on"
