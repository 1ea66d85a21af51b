"""The Memory facade: a key's working memory as an agent sees it during one activation.

Writes are staged on a copy, made at the first write (the committed entries are shared
until then: a large memory's dict costs O(entries) to copy and is one more large young
container for the garbage collector to walk); the runtime commits them only when the
activation succeeds.
Values are what comes back as written: None, bool, int, float, str, bytes, and lists and
dicts (str or int keys) of those; a tuple is stored as a list. Anything else (a set, a
datetime, a dataclass) is refused with TypeError at the write: msgpack would store a set as
a list, or fail only at the commit, far from the line that wrote it.

A list or a dict crosses between the agent and memory as a copy, both ways (``_detached``):
``set`` and ``append`` keep the value as it was at the call, as a restart would read it,
and ``get`` and ``ring`` hand out values the agent can change freely. Otherwise a value
changed in place without a write would reach the worker's kept state and not the key's
record: an activation that then failed would leave its change behind for the key's next
activation to commit, and a paged key's page would not get it at all, so what the key
remembered would depend on whether the worker restarted in between.

Size is the sum of encoded keys and values. Two caps, per key:

* soft cap (75% of the hard cap): the first write that reaches it logs a warning and counts
  ``memory_soft_cap_warnings``, once per activation;
* hard cap (1 MiB): a write that would exceed it first compacts once (drops the least
  recently used entries, other than the one being written, down to half the cap); if the
  write still does not fit it raises MemoryOverflow, and neither the write nor the
  compaction is applied;
* room in the state blob (``room_bytes``, given by the runtime): memory shares one
  changelog record with the key's replay cache, outbox, queued events, continuation and
  bookkeeping, so the runtime passes what the blob's limit leaves after those. The room is
  counted as the MEMORY cell encodes (keys and values plus ENTRY_OVERHEAD_BYTES per entry)
  and handled like the hard cap: compact once, then MemoryOverflow. A write within the
  room can still fail its activation if the activation then grows the rest of the state
  (``state_too_large``); the room turns the common case into an error the agent can catch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import msgspec

from keylane.cells import MemoryBlob, MemoryEntry, encoded_size, entry_bytes
from keylane.errors import KeylaneError

log = logging.getLogger(__name__)

MEMORY_HARD_CAP_BYTES = 1024 * 1024
DEFAULT_RING_ITEMS = 64
ENTRY_OVERHEAD_BYTES = encoded_size(MemoryEntry(value=None, ring=False, last_access_ms=-(2**63))) + 5
"""Upper bound of what one entry adds to the encoded cell besides its key and value bytes:
the entry's field names, flag and timestamp, and the key's msgpack header."""


class MemoryOverflow(KeylaneError):
    """A memory write that does not fit under the hard cap, or in the room the key's state
    blob leaves for memory, even after one compaction."""

    def __init__(self, key: str, attempted_bytes: int, cap_bytes: int, *, room: bool = False) -> None:
        over = (
            f"over the {cap_bytes} bytes the key's state leaves for memory (memory, replay cache, "
            "outbox and queued events share one changelog record)"
            if room
            else f"over the {cap_bytes}-byte cap"
        )
        super().__init__(
            f"memory write to {key!r} needs {attempted_bytes} bytes, {over} after compaction; "
            "store less per key or keep large data elsewhere"
        )
        self.key = key
        self.attempted_bytes = attempted_bytes
        self.cap_bytes = cap_bytes


class Memory:
    """get / set / delete / append / ring over a staged copy of the MEMORY cell."""

    def __init__(
        self,
        blob: MemoryBlob,
        *,
        now_ms: int,
        hard_cap_bytes: int = MEMORY_HARD_CAP_BYTES,
        room_bytes: int | Callable[[], int] | None = None,
        on_soft_cap: Callable[[int], None] | None = None,
        total_bytes: int | None = None,
    ) -> None:
        self._entries: dict[str, MemoryEntry] = blob.entries
        self._shared = True
        """Whether ``_entries`` is a dict someone else holds (the committed blob's, or the one
        ``to_blob`` handed over): the next write copies it first (``_staged``)."""
        # An entry's size is measured when a write or a delete needs it: a large memory comes
        # with its total (``total_bytes``, kept beside paged memory), and measuring every
        # entry would encode all of it on every activation.
        self._sizes: dict[str, int] = {}
        if total_bytes is None:
            total_bytes = sum(self._size_of(key) for key in self._entries) if self._entries else 0
        self._total = total_bytes
        self._now_ms = now_ms
        self._hard_cap = hard_cap_bytes
        self._room_given = room_bytes
        self._soft_cap = hard_cap_bytes * 3 // 4
        self._on_soft_cap = on_soft_cap
        self._warned = False
        self.dirty = False
        self.changed: set[str] = set()
        """The names written, touched or deleted: the entries the commit replaces."""
        self.took_values = False
        """Whether a value from the agent went in (``set``, ``append``): the runtime then
        decodes the committed blob for the key's next read rather than keeping the staged
        state as it is (KeyRuntime._round_trips)."""

    @property
    def _room(self) -> int | None:
        """The room the runtime gives memory, asked of it the first time a write needs it
        (most activations write nothing, and working it out encodes the rest of the state)."""
        if callable(self._room_given):
            self._room_given = self._room_given()
        return self._room_given

    @property
    def total_bytes(self) -> int:
        """Current size of keys and values, as the caps count it."""
        return self._total

    def get(self, key: str, default: Any = None) -> Any:
        """The scalar stored under ``key``, or ``default``. TypeError if it is a ring."""
        entry = self._touch(key)
        if entry is None:
            return default
        if entry.ring:
            raise TypeError(f"memory key {key!r} holds a ring; read it with ring({key!r})")
        return _detached(entry.value)

    def set(self, key: str, value: Any) -> None:
        """Store ``value`` under ``key``, replacing a scalar or a ring."""
        _check_storable(key, value)
        self._write(key, MemoryEntry(value=_detached(value), ring=False, last_access_ms=self._now_ms))

    def delete(self, key: str) -> None:
        """Remove ``key``; nothing happens when it is absent."""
        if key in self._entries:
            self._total -= self._size_of(key)
            del self._staged()[key]
            del self._sizes[key]
            self.dirty = True
            self.changed.add(key)

    def append(self, key: str, item: Any, *, max_items: int = DEFAULT_RING_ITEMS) -> None:
        """Append to the ring under ``key``, keeping its newest ``max_items`` items."""
        entry = self._entries.get(key)
        if entry is not None and not entry.ring:
            raise TypeError(f"memory key {key!r} holds a scalar; append needs a ring")
        _check_storable(key, item)
        items = [*(entry.value if entry else []), _detached(item)]
        items = items[-max_items:] if max_items > 0 else []
        self._write(key, MemoryEntry(value=items, ring=True, last_access_ms=self._now_ms))

    def ring(self, key: str) -> tuple[Any, ...]:
        """The ring under ``key``, oldest first; () when absent. TypeError on a scalar."""
        entry = self._touch(key)
        if entry is None:
            return ()
        if not entry.ring:
            raise TypeError(f"memory key {key!r} holds a scalar; read it with get({key!r})")
        return tuple(_detached(entry.value))

    def keys(self) -> Iterator[str]:
        """Keys in memory, in insertion order (page by page for a memory over 16 KiB, which
        is stored in pages: docs/runtime.md)."""
        return iter(list(self._entries))

    def to_blob(self) -> MemoryBlob:
        """The staged MEMORY cell, for the commit. The cell takes the staged dict over: a
        write after this (an agent that kept its context) stages on a copy again."""
        self._shared = True
        return MemoryBlob(entries=self._entries)

    def _staged(self) -> dict[str, MemoryEntry]:
        """The entries, to write to: copied first while they are shared."""
        if self._shared:
            self._entries = dict(self._entries)
            self._shared = False
        return self._entries

    def _touch(self, key: str) -> MemoryEntry | None:
        entry = self._entries.get(key)
        if entry is not None and entry.last_access_ms != self._now_ms:
            entry = MemoryEntry(value=entry.value, ring=entry.ring, last_access_ms=self._now_ms)
            self._staged()[key] = entry
            self.dirty = True
            self.changed.add(key)
        return entry

    def _write(self, key: str, entry: MemoryEntry) -> None:
        size = entry_bytes(key, entry.value)
        projected = self._total - self._size_of(key) + size
        if self._over(key, projected):
            before = (dict(self._entries), dict(self._sizes), self._total, self.dirty)
            cap = self._hard_cap if self._room is None else min(self._hard_cap, self._room)
            self._compact(keep=key, target=cap // 2)
            projected = self._total - self._size_of(key) + size
            if self._over(key, projected):
                # The write fails as a whole: the entries compaction dropped come back, so an
                # agent that catches MemoryOverflow and goes on commits its memory intact.
                self._entries, self._sizes, self._total, self.dirty = before
                self._shared = False  # ``before`` holds a copy
                if projected > self._hard_cap:
                    raise MemoryOverflow(key, projected, self._hard_cap)
                assert self._room is not None
                raise MemoryOverflow(key, self._cell_bytes(key, projected), self._room, room=True)
        self._staged()[key] = entry
        self._total = projected
        self._sizes[key] = size
        self.dirty = True
        self.took_values = True
        self.changed.add(key)
        if self._total >= self._soft_cap and not self._warned:
            self._warned = True
            log.warning("memory at %s bytes, over the soft cap of %s", self._total, self._soft_cap)
            if self._on_soft_cap is not None:
                self._on_soft_cap(self._total)

    def _size_of(self, key: str) -> int:
        """What ``key``'s entry counts for (0 when absent), measured once."""
        size = self._sizes.get(key)
        if size is None:
            entry = self._entries.get(key)
            if entry is None:
                return 0
            size = self._sizes[key] = entry_bytes(key, entry.value)
        return size

    def _over(self, key: str, projected: int) -> bool:
        """Whether memory holding ``projected`` bytes (with ``key`` written) breaks a cap."""
        if projected > self._hard_cap:
            return True
        return self._room is not None and self._cell_bytes(key, projected) > self._room

    def _cell_bytes(self, key: str, projected: int) -> int:
        """Upper bound of the encoded MEMORY cell with ``key`` written and ``projected`` bytes."""
        entries = len(self._entries) + (key not in self._entries)
        return projected + ENTRY_OVERHEAD_BYTES * entries + _CELL_OVERHEAD_BYTES

    def _compact(self, *, keep: str, target: int) -> None:
        """Drop least recently used entries (never ``keep``) until the total is at most target."""
        by_age = sorted((e.last_access_ms, k) for k, e in self._entries.items() if k != keep)
        for _, key in by_age:
            if self._total <= target:
                break
            self.delete(key)


_CELL_OVERHEAD_BYTES = 16  # the cell's "entries" name and map headers


_SCALARS = (type(None), bool, int, float, str, bytes)
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder()


_STORED_AS_IS = frozenset(_SCALARS)


def _detached(value: Any) -> Any:
    """``value`` as the key's record stores it, sharing no list or dict with ``value``. A
    scalar of one of the stored types is immutable, and is itself; a subclass of one (an
    IntEnum, a str Enum) comes back as its base type, as a restart would read it."""
    if type(value) in _STORED_AS_IS:
        return value
    return _decoder.decode(_encoder.encode(value))


def _check_storable(key: str, value: Any) -> None:
    """TypeError, naming the memory key and the type, unless ``value`` reads back as written."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, int) and not -(2**63) <= item < 2**64:
            raise TypeError(f"memory key {key!r}: {item} does not fit 64 bits; store it as a str")
        if isinstance(item, _SCALARS):
            continue
        if isinstance(item, list | tuple):
            stack.extend(item)
        elif isinstance(item, dict):
            for name, inner in item.items():
                if not isinstance(name, str | int) or isinstance(name, bool):
                    raise TypeError(
                        f"memory key {key!r}: a dict key of type {type(name).__name__} cannot be stored; "
                        "use str or int keys"
                    )
                stack.append(inner)
        else:
            hint = "a sorted list" if isinstance(item, set | frozenset) else "its fields as a dict"
            raise TypeError(
                f"memory key {key!r}: a value of type {type(item).__name__} cannot be stored (store {hint}); "
                "memory holds None, bool, int, float, str, bytes, and lists and dicts of them"
            )
