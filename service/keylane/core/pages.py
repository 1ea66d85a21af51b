"""Memory pages: a key whose MEMORY cell grows past PAGED_FROM_BYTES keeps it in bucket pages
beside its state record, so an activation writes the pages it changed and a small commit
record instead of the whole memory.

Each memory entry lives in bucket ``crc32(name) mod buckets`` (``buckets`` a power of two,
about one page per PAGE_TARGET_BYTES of memory). Every bucket has two slots, two table keys
(``page_key``), and the key's state record, the commit point, says which slot holds each
bucket's current page (``PageLayout.slots``). An activation writes each page it changed into
the slot its state record does *not* name, then the state record naming the new slots:

* a crash between the two leaves the old state record naming the old pages, which nothing
  wrote over, so a key is seen before or after an activation, never between;
* the pages and the state record go to the same changelog partition through one producer
  (a key's changelog partition is its input partition), so a restore that reads a state
  record has read the pages it names;
* compaction keeps each slot's last page, so a key holds at most two pages per bucket, and
  no page is ever deleted while a state record may name it;
* every page carries the owner epoch of its writer like the state record does
  (service/keylane/kafka/epochs.py), so the epoch fence keeps a former owner's late page
  from replacing its successor's. A former owner's unconfirmed page goes to the slot its
  last confirmed state record did not name, which is the one its successor restored.

Page keys start with the byte 0xFF, which no UTF-8 text starts with; an entity key must be
UTF-8 (keylane.wire.decode_key), so no entity's state record can share a page's key.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable
from functools import lru_cache

import msgspec

from keylane.cells import MemoryEntry

PAGE_PREFIX = b"\xffpage:"
PAGED_FROM_BYTES = 16 * 1024
"""Memory (keys and values, as the Memory facade counts it) from which a key's memory is paged;
below it the MEMORY cell stays inline in the state record, as it always was."""
PAGE_TARGET_BYTES = 1024
"""About how much memory one bucket holds: an activation that changes one entry writes about
this much more than the entry."""
MAX_BUCKETS = 4096
"""At most this many buckets: the state record names a slot per bucket (one bit each)."""
GROW_AT_PAGE_BYTES = 4 * PAGE_TARGET_BYTES
"""A page written larger than this grows the layout (when more buckets can help)."""


class PageLayout(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Where a paged key's memory is: ``buckets`` pages, bucket b's in slot bit b of ``slots``."""

    buckets: int
    slots: bytes
    memory_bytes: int
    """The memory's size as the Memory facade counts it (keys and values), so an activation
    knows it without reading every page."""
    dirty: frozenset[str] = msgspec.field(default_factory=frozenset)
    """Staged only, never in a written record: the entries the activations since the record
    was read wrote or deleted (the Memory facade's ``changed``), whose pages the write
    replaces."""

    def slot(self, bucket: int) -> int:
        return (self.slots[bucket >> 3] >> (bucket & 7)) & 1


class MemoryPage(msgspec.Struct, kw_only=True):
    """One bucket's entries, as written by the owner of epoch ``epoch``."""

    epoch: int = 0
    entries: dict[str, MemoryEntry] = msgspec.field(default_factory=dict)


ReadPage = Callable[[bytes], bytes | None]

_encoder = msgspec.msgpack.Encoder()
_page_decoder = msgspec.msgpack.Decoder(MemoryPage)


class UnreadablePage(ValueError):
    """A page a state record names is missing or does not decode."""


def page_key(key: bytes, bucket: int, slot: int) -> bytes:
    """The table key of ``key``'s page for ``bucket`` in ``slot``."""
    return PAGE_PREFIX + bucket.to_bytes(4, "big") + bytes((slot,)) + key


def is_page_key(stored_key: bytes) -> bool:
    """Whether a table key is a memory page's, not an entity's state record."""
    return stored_key.startswith(PAGE_PREFIX)


def page_owner(stored_key: bytes) -> tuple[bytes, int, int]:
    """(entity key, bucket, slot) of a page's table key."""
    rest = stored_key[len(PAGE_PREFIX) :]
    return rest[5:], int.from_bytes(rest[:4], "big"), rest[4]


@lru_cache(maxsize=1 << 16)
def _name_hash(name: str) -> int:
    return zlib.crc32(name.encode())


def bucket_of(name: str, buckets: int) -> int:
    """The bucket of memory entry ``name`` among ``buckets`` (a power of two)."""
    return _name_hash(name) & (buckets - 1)


def buckets_for(memory_bytes: int, entries: int) -> int:
    """The bucket count for ``entries`` entries of ``memory_bytes`` in all: a power of two,
    about one bucket per PAGE_TARGET_BYTES but no more than there are entries (more would
    only add empty pages), at least 2 and at most MAX_BUCKETS."""
    wanted = max(2, -(-memory_bytes // PAGE_TARGET_BYTES))
    by_size = 1 << (wanted - 1).bit_length()
    by_entries = 1 << max(1, entries.bit_length() - 1)
    return min(MAX_BUCKETS, by_size, by_entries)


def new_layout(buckets: int, memory_bytes: int) -> PageLayout:
    """A layout of ``buckets`` with every bucket in slot 0 (for memory no state record pages yet)."""
    return PageLayout(buckets=buckets, slots=bytes((buckets + 7) // 8), memory_bytes=memory_bytes)


def encode_page(entries: dict[str, MemoryEntry], epoch: int) -> bytes:
    return _encoder.encode(MemoryPage(epoch=epoch, entries=entries))


def decode_page(blob: bytes | None, where: str) -> dict[str, MemoryEntry]:
    if blob is None:
        raise UnreadablePage(f"memory page {where} is missing")
    try:
        return _page_decoder.decode(blob).entries
    except msgspec.DecodeError as exc:
        raise UnreadablePage(f"memory page {where} does not decode: {exc}") from None


Names = dict[int, set[str]]
"""The names of a memory's entries by bucket."""


def assembled(layout: PageLayout, key: bytes, read_page: ReadPage) -> tuple[dict[str, MemoryEntry], Names]:
    """The memory a layout names, read page by page (UnreadablePage if one is missing), and
    its names by bucket."""
    entries: dict[str, MemoryEntry] = {}
    names: Names = {}
    for bucket in range(layout.buckets):
        slot = layout.slot(bucket)
        page = decode_page(read_page(page_key(key, bucket, slot)), f"{bucket}/{slot}")
        entries.update(page)
        names[bucket] = set(page)
    return entries, names


def names_by_bucket(entries: Iterable[str], buckets: int) -> Names:
    """The names of ``entries`` by bucket, every bucket present."""
    names: Names = {bucket: set() for bucket in range(buckets)}
    mask = buckets - 1
    for name in entries:
        names[_name_hash(name) & mask].add(name)
    return names


def flipped(slots: bytes, buckets: Iterable[int]) -> bytes:
    """``slots`` with each of ``buckets`` moved to its other slot."""
    out = bytearray(slots)
    for bucket in buckets:
        out[bucket >> 3] ^= 1 << (bucket & 7)
    return bytes(out)


def with_slots(record: bytes, staged: PageLayout, layout: PageLayout) -> bytes | None:
    """A paged state's ``record``, encoded with the ``staged`` layout, as encoding it with
    ``layout`` instead gives it, by replacing the slots' bytes; None when that is not sure to
    be it: a layout of another bucket count or size, or the staged slots' field not found in
    the record at exactly one place. The runtime seals (encodes) every state it commits to
    know its size, and a paged key's new slots are chosen only when it is written: this saves
    encoding its record twice."""
    if (layout.buckets, layout.memory_bytes) != (staged.buckets, staged.memory_bytes):
        return None
    before = _slots_field(staged.slots)
    at = record.find(before)
    if at < 0 or record.rfind(before) != at:  # rfind: an overlapping second match too
        return None
    return record[:at] + _slots_field(layout.slots) + record[at + len(before) :]


_SLOTS_NAME = _encoder.encode("slots")


def _slots_field(slots: bytes) -> bytes:
    """The bytes of a PageLayout's ``slots`` field in its encoding: its name, then its value."""
    return _SLOTS_NAME + _encoder.encode(slots)
