"""The decoded state KeyStates keeps from each key's last write: a read whose record is still
the one written decodes nothing, and any other record (a restore, another owner's write, a
blob that does not read) is decoded as it is; the kept states stay within their byte budget."""

from __future__ import annotations

import msgspec
import pytest

from keylane.authoring.api import AgentConfig, Complete, Suspend
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


async def remembers_a_pair(ctx: ActivationContext) -> Complete | Suspend:
    """``pair``: store a tuple; ``wait``: stage an intent and suspend; anything else reads."""
    if ctx.event == b"pair":
        ctx.memory.set("pair", (1, 2))
    elif ctx.event == b"wait" and not ctx.is_resume:
        ctx.act("refund", '{"n": 1}')
        return Suspend(snapshot=b"s")
    return Complete(repr(ctx.memory.get("pair")).encode())


async def test_an_activation_that_took_no_agent_value_keeps_its_state_as_is() -> None:
    """Nothing in it but decoded values and the runtime's own: its readback is the state
    committed, not a decode of its blob (which tests/conftest.py checks it equals)."""
    harness = AgentHarness(remembers_a_pair, AgentConfig(), clock=ManualClock())
    decisions = [await harness.send_event(KEY, "read"), await harness.send_event(KEY, "wait")]
    (intent,) = harness.intents()
    decisions.append(await harness.send_result(harness.result_for(intent)))

    for decision in decisions:
        assert decision.readback is not None and decision.new_state is not None
        assert decision.readback == decode_state(decision.blob)
        assert decision.readback.applied is decision.new_state.applied  # no decode made it
    # The first one's says the version its blob says (a fresh state says the newest).
    assert [d.readback is d.new_state for d in decisions] == [False, True, True]


async def test_a_value_the_agent_wrote_is_read_back_as_its_blob_decodes() -> None:
    """A tuple is stored as a msgpack array: the next activation sees the list any restart
    would, not the tuple the agent handed in."""
    harness = AgentHarness(remembers_a_pair, AgentConfig(), clock=ManualClock())
    wrote = await harness.send_event(KEY, "pair")
    assert wrote.readback is not wrote.new_state and wrote.readback == decode_state(wrote.blob)

    await harness.send_event(KEY, "read")

    assert harness.outputs()[-1] == (KEY, b"[1, 2]")


def test_a_state_vouched_for_that_does_not_round_trip_fails_the_check() -> None:
    state = KeyState(seq=1, settled_intents=("a", "b"))  # type: ignore[arg-type]  # a tuple
    with pytest.raises(AssertionError, match="decodes otherwise"):
        seal(state, 1 << 20, round_trips=True)
    sealed = seal(state, 1 << 20)
    assert (
        sealed is not None and sealed.readback is not None and sealed.readback.settled_intents == ["a", "b"]
    )


async def changes_its_log_in_place(ctx: ActivationContext) -> Complete:
    """``fill:<n>``: ``n`` cells of 1 KiB and a log ``["a"]`` (over 16 KiB: paged); ``change``
    and ``fail``: append to the log read with ``get``, in place, without a write (``fail``
    then raises); anything else reads."""
    command = ctx.event.decode()
    if command.startswith("fill:"):
        for cell in range(int(command.split(":")[1])):
            ctx.memory.set(f"c{cell}", "x" * 1024)
        ctx.memory.set("log", ["a"])
    elif command in ("change", "fail"):
        ctx.memory.get("log").append(command)
        if command == "fail":
            raise RuntimeError("the activation fails after changing a value in place")
    return Complete(repr(ctx.memory.get("log")).encode())


@pytest.mark.parametrize("cells", [1, 40], ids=["inline", "paged"])
async def test_a_value_changed_in_place_is_not_memory_and_the_key_reads_what_a_restart_reads(
    cells: int,
) -> None:
    """Only a write changes memory. A value changed in place once reached the kept state: a
    failed activation's change was committed by the key's next activation, and a paged key's
    change made in the millisecond of the entry's last read never reached its page, so the
    key remembered otherwise after a restart."""
    harness = AgentHarness(changes_its_log_in_place, AgentConfig(), clock=ManualClock())
    await harness.send_event(KEY, f"fill:{cells}")
    assert (len(harness.store) > 1) is (cells == 40), "paged or not, as named"

    for command in ("change", "fail", "change", "read"):
        await harness.send_event(KEY, command)
        restarted = KeyStates(harness.store.get, harness.store.__setitem__)
        assert harness.state(KEY).memory == restarted.read(KEY).memory

    assert harness.outputs()[-1] == (KEY, b"['a']")
    assert [error.reason for error in harness.errors()] == ["activation_error"]
