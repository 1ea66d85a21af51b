"""The MEMORY cell's format, below both its users: the authoring API's Memory facade stages
it during an activation, and the core's KeyState (keylane.core.state) stores it in the key's
one state record.

msgspec structs encoded as msgpack with field names; ``encoded_size`` measures a value as the
state blob stores it. The rest of a key's cells are keylane.core.state's.
"""

from __future__ import annotations

from typing import Any

import msgspec


class MemoryEntry(msgspec.Struct, kw_only=True, gc=False):
    """One memory value: a scalar, or a ring (a bounded list, oldest first).

    Not tracked by the garbage collector (``gc=False``): a key's memory is a dict of these,
    copied at every activation, and a dict whose values the collector does not track is not
    tracked either, so a young collection does not walk a large memory entry by entry. That
    is safe because no cycle can run through an entry: only the Memory facade and the
    decoder make them, around a value that cannot refer back to its entry."""

    value: Any
    ring: bool = False
    last_access_ms: int = 0


class MemoryBlob(msgspec.Struct, kw_only=True):
    """The MEMORY cell."""

    entries: dict[str, MemoryEntry] = msgspec.field(default_factory=dict)


_encoder = msgspec.msgpack.Encoder()


def encoded_size(value: Any) -> int:
    """Bytes of one value (a memory value, a cell, a cell's entry) as the state blob stores it."""
    return len(_encoder.encode(value))


def entry_bytes(name: str, value: Any) -> int:
    """What one memory entry counts for against the caps: its name and its encoded value."""
    return len(name.encode()) + encoded_size(value)
