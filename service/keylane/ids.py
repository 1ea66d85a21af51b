"""Deterministic ids: the same input replays to the same ids, so duplicates can be recognised.

``intent_id = uuid5(NAMESPACE, "<key.hex()>|<seq>|<step_index>")``; outputs and error
records get ids of the same construction. Nothing here reads a clock or a counter.
"""

from __future__ import annotations

import uuid

NAMESPACE = uuid.UUID("a3d7c2e4-5b1f-4c8e-9e62-0f4b7d19c5a8")


def intent_id(entity_key: bytes, seq: int, step_index: int) -> str:
    """The id of the intent staged at ``step_index`` of activation ``seq`` of a physical key."""
    return str(uuid.uuid5(NAMESPACE, f"{entity_key.hex()}|{seq}|{step_index}"))


def output_id(entity_key: bytes, seq: int) -> str:
    """The id of the output of activation ``seq`` of a physical key."""
    return str(uuid.uuid5(NAMESPACE, f"{entity_key.hex()}|{seq}|output"))


def error_id(topic: str, partition: int, offset: int, reason: str) -> str:
    """The id of the error record raised for one input record."""
    return str(uuid.uuid5(NAMESPACE, f"error|{topic}|{partition}|{offset}|{reason}"))
