"""The decoded state KeyStates keeps from each key's last write: a read whose record is still
the one written decodes nothing, and any other record (a restore, another owner's write, a
blob that does not read) is decoded as it is; the kept states stay within their byte budget."""

from __future__ import annotations

import msgspec

from keylane.authoring.api import AgentConfig, Complete
from keylane.authoring.context import ActivationContext
from keylane.core.key_states import KeyStates
from keylane.core.state import KeyState, decode_state, encode_state, seal
from keylane.testing import AgentHarness, ManualClock

KEY = b"counter"


async def counts(ctx: ActivationContext) -> Complete:
    n = ctx.memory.get("n", 0) + 1
    ctx.memory.set("n", n)
    return Complete(str(n).encode())


def written(states: KeyStates, key: bytes, state: KeyState) -> bytes:
    sealed = seal(state, 1 << 20)
    assert sealed is not None
    states.write(key, sealed.state, sealed.blob, readback=sealed.readback)
    return sealed.blob


def test_a_read_of_the_record_last_written_is_that_records_readback() -> None:
    store: dict[bytes, bytes] = {}
    states = KeyStates(store.get, store.__setitem__)
    sealed = seal(KeyState(seq=7), 1 << 20)
    assert sealed is not None and sealed.readback == decode_state(sealed.blob)

    states.write(KEY, sealed.state, sealed.blob, readback=sealed.readback)

    assert states.read(KEY) is sealed.readback


def test_a_record_replaced_under_the_cache_is_decoded_as_it_is() -> None:
    store: dict[bytes, bytes] = {}
    states = KeyStates(store.get, store.__setitem__)
    written(states, KEY, KeyState(seq=7))

    store[KEY] = encode_state(KeyState(seq=9, epoch=3))  # another owner's write, or a restore

    read = states.read(KEY)
    assert (read.seq, read.epoch) == (9, 3)


def test_the_kept_states_stay_within_their_byte_budget() -> None:
    store: dict[bytes, bytes] = {}
    one = len(encode_state(KeyState(seq=1)))
    states = KeyStates(store.get, store.__setitem__, decoded_bytes=3 * one)
    for i in range(10):
        written(states, b"key-%d" % i, KeyState(seq=1))

    assert states.read(b"key-9") is not states.read(b"key-0")
    assert len(states._decoded) == 3 and states._decoded_total <= 3 * one
    assert [states.read(b"key-%d" % i).seq for i in range(10)] == [1] * 10


async def test_a_blob_that_stopped_reading_quarantines_its_key_though_its_last_write_is_kept() -> None:
    harness = AgentHarness(counts, AgentConfig(), clock=ManualClock())
    await harness.send_event(KEY, "one")
    harness.store[KEY] = msgspec.msgpack.encode({"state_schema_version": 99, "seq": 3})

    decision = await harness.send_event(KEY, "two")

    assert decision.new_state is None
    assert [e.reason for e in harness.errors()] == ["poison_state"]
    assert harness.outputs() == [(KEY, b"1")]


async def test_each_activation_reads_the_state_the_last_one_committed() -> None:
    harness = AgentHarness(counts, AgentConfig(), clock=ManualClock())
    for _ in range(5):
        await harness.send_event(KEY, "tick")

    assert [value for _, value in harness.outputs()] == [b"1", b"2", b"3", b"4", b"5"]
    assert harness.state(KEY) == decode_state(harness.store[KEY])
