"""A paged key's record is its sealed blob with its new pages' slots put in
(keylane.core.pages.with_slots): byte for byte what encoding the state with its new layout
gives, whatever else the record holds, or no shortcut at all."""

from __future__ import annotations

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from keylane.core.pages import PageLayout, flipped, new_layout, with_slots
from keylane.core.state import Continuation, PagedKeyState, encode_state

SLOTS_NAME = b"\xa5slots"  # the field's name as msgpack encodes it


def slots_field(layout: PageLayout) -> bytes:
    """The bytes of ``layout``'s slots field in an encoded state: its name, then its value."""
    return SLOTS_NAME + msgspec.msgpack.encode(layout.slots)


def layouts(buckets: int) -> st.SearchStrategy[PageLayout]:
    return st.binary(min_size=(buckets + 7) // 8, max_size=(buckets + 7) // 8).map(
        lambda slots: PageLayout(buckets=buckets, slots=slots, memory_bytes=40_000)
    )


@st.composite
def staged_and_written(draw: st.DrawFn) -> tuple[PagedKeyState, PageLayout]:
    """A paged state as sealed (its staged layout), and the layout its write chose: some
    buckets flipped. The state's snapshot may hold anything, the staged slots' field too."""
    buckets = draw(st.sampled_from([2, 8, 64, 512, 4096]))
    staged = draw(layouts(buckets))
    changed = draw(st.lists(st.integers(0, buckets - 1), max_size=8))
    written = PageLayout(buckets=buckets, slots=flipped(staged.slots, changed), memory_bytes=40_000)
    field = slots_field(staged)
    noise = draw(st.binary(max_size=64))
    snapshot = draw(st.sampled_from([noise, field, noise + field, field[: len(field) // 2] + noise]))
    state = PagedKeyState(
        seq=draw(st.integers(0, 1 << 40)),
        continuation=Continuation(seq=1, step_index=0, pending_intent_ids=[], snapshot=snapshot),
        pages=msgspec.structs.replace(staged, dirty=frozenset({"a"})),
        epoch=draw(st.integers(0, 1000)),
    )
    return state, written


@given(staged_and_written())
def test_the_record_with_new_slots_is_what_encoding_it_gives(case: tuple[PagedKeyState, PageLayout]) -> None:
    state, written = case
    sealed = encode_state(state)
    record = with_slots(sealed, state.pages, written)
    expected = encode_state(msgspec.structs.replace(state, pages=written))
    assert record is None or record == expected
    snapshot = state.continuation.snapshot if state.continuation else b""
    if SLOTS_NAME not in snapshot:  # nothing in the record looks like the field: always taken
        assert record == expected


def test_a_layout_of_another_size_is_encoded_again() -> None:
    state = PagedKeyState(pages=new_layout(8, 40_000))
    for written in (new_layout(16, 40_000), new_layout(8, 41_000)):
        assert with_slots(encode_state(state), state.pages, written) is None


def test_a_record_holding_the_slots_field_twice_is_encoded_again() -> None:
    staged = new_layout(64, 40_000)
    field = slots_field(staged)
    state = PagedKeyState(
        continuation=Continuation(seq=1, step_index=0, pending_intent_ids=[], snapshot=field), pages=staged
    )
    written = msgspec.structs.replace(staged, slots=flipped(staged.slots, [3]))
    assert with_slots(encode_state(state), staged, written) is None
