"""Deterministic ids: the same input replays to the same ids, so duplicates can be recognised.

``intent_id = uuid5(NAMESPACE, "<key.hex()>|<seq>|<step_index>")``; outputs and error
records get ids of the same construction. Nothing here reads a clock or a counter.

``uuid5`` below is RFC 4122's name-based UUID (SHA-1, version 5) as its string, computed
without building a ``uuid.UUID``: every activation mints at least one id, and the standard
library's object and its checks cost three times the hash itself.
tests/unit/test_ids.py checks it against ``uuid.uuid5`` on random names.
"""

from __future__ import annotations

import uuid

from keylane.digests import sha1

NAMESPACE = uuid.UUID("a3d7c2e4-5b1f-4c8e-9e62-0f4b7d19c5a8")
_NAMESPACE_BYTES = NAMESPACE.bytes


_VARIANT_DIGIT = {digit: f"{(int(digit, 16) & 0x3) | 0x8:x}" for digit in "0123456789abcdef"}
"""The hex digit after the RFC 4122 variant's two bits (10) replace a digit's top two."""


def uuid5(name: str) -> str:
    """``str(uuid.uuid5(NAMESPACE, name))``."""
    # SHA-1 is what RFC 4122 prescribes for version 5; it names, it does not protect.
    text = sha1(_NAMESPACE_BYTES + name.encode()).hexdigest()
    # The first 16 bytes, with the version (5) for the 13th hex digit and the variant's bits
    # in the 17th.
    return f"{text[:8]}-{text[8:12]}-5{text[13:16]}-{_VARIANT_DIGIT[text[16]]}{text[17:20]}-{text[20:32]}"


def intent_id(entity_key: bytes, seq: int, step_index: int) -> str:
    """The id of the intent staged at ``step_index`` of activation ``seq`` of a physical key."""
    return uuid5(f"{entity_key.hex()}|{seq}|{step_index}")


def output_id(entity_key: bytes, seq: int) -> str:
    """The id of the output of activation ``seq`` of a physical key."""
    return uuid5(f"{entity_key.hex()}|{seq}|output")


def error_id(topic: str, partition: int, offset: int, reason: str) -> str:
    """The id of the error record raised for one input record."""
    return uuid5(f"error|{topic}|{partition}|{offset}|{reason}")
