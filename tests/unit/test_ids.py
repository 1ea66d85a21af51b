"""keylane.ids mints the same strings as the standard library's uuid5, which every id ever
written (intents, outputs, error records) was made with: a changed id would make a replayed
activation's records look new to every consumer that deduplicates by id."""

from __future__ import annotations

import uuid

from hypothesis import given, settings
from hypothesis import strategies as st

from keylane import ids


@settings(max_examples=500, deadline=None)
@given(name=st.text())
def test_uuid5_is_the_standard_librarys(name: str) -> None:
    assert ids.uuid5(name) == str(uuid.uuid5(ids.NAMESPACE, name))


@given(key=st.binary(max_size=64), seq=st.integers(min_value=0, max_value=2**63), step=st.integers(0, 1000))
def test_every_id_is_the_uuid5_of_its_name(key: bytes, seq: int, step: int) -> None:
    assert ids.intent_id(key, seq, step) == str(uuid.uuid5(ids.NAMESPACE, f"{key.hex()}|{seq}|{step}"))
    assert ids.output_id(key, seq) == str(uuid.uuid5(ids.NAMESPACE, f"{key.hex()}|{seq}|output"))
    assert ids.error_id("agent.events", step, seq, "malformed_record") == str(
        uuid.uuid5(ids.NAMESPACE, f"error|agent.events|{step}|{seq}|malformed_record")
    )


def test_a_known_intent_id() -> None:
    """Pinned: the id keylane has always given the first intent of a key's first activation."""
    assert ids.intent_id(b"order-1", 0, 0) == "0a2f3e51-f08c-53d7-9cfa-d4296bd60aea"
