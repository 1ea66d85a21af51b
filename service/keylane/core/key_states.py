"""Reading and writing keys' states in a table, paged memory included: a state record, and for
a key whose memory is paged (service/keylane/core/pages.py) the pages it changed, written
before the record that names them.

The decoded memory of recently used paged keys is kept (``KeyStates.cache_bytes``), checked
against the state record it came with: reading a paged key reads its record and, unless the
record is the one the kept memory came with, every page it names. The record is enough to
tell: its pages are never written over while it is a key's record (a writer uses the other
slot), and every activation writes a new record (its applied offsets, at least).

A write replaces the pages of the buckets whose entries the activations changed (the
layout's ``dirty`` names, from the Memory facade), so its cost follows what changed, not how
much the key holds: the names of each bucket are kept beside the memory.

A key whose paged memory empties goes back to one record, and the pages its last record named
(both slots of each bucket) are written over with empty pages, after that record: compaction
keeps a key's last value, so pages left as they were would keep the memory's bytes in the
store and the changelog for good. They are emptied, not deleted: a tombstone carries no owner
epoch, and a former owner's late one would delete its successor's page past the epoch fence
(service/keylane/kafka/epochs.py). The record says how many buckets it empties
(EmptiedKeyState): a crash between it and the empty pages leaves some pages as they were,
named by no record, and the key's next write (the input run again, at the latest: its offset
is committed only once every record it wrote is) empties them again before its own record.
Every write follows a read of its key, which notes such a record.

The state a key was last written with is kept too, as the runtime sealed its record
(``KeyStates.decoded_bytes``; a paged key's with the layout its writer chose): a read whose
record is that one decodes nothing. Like the kept paged memory, such a state is shared
between reads, which the runtime never changes in place (it builds each next state with
``msgspec.structs.replace``).

All of this assumes a local store that holds what the changelog holds: a worker killed with
writes its changelog never got restores from the changelog alone
(service/keylane/kafka/clean_stop.py), since a restore read over such a store can pair a
record only it holds with pages the restore took back.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from msgspec.structs import replace as struct_replace

from keylane.cells import MemoryBlob, MemoryEntry
from keylane.core.pages import (
    GROW_AT_PAGE_BYTES,
    Names,
    PageLayout,
    UnreadablePage,
    assembled,
    bucket_of,
    buckets_for,
    encode_page,
    flipped,
    is_page_key,
    names_by_bucket,
    new_layout,
    page_key,
    with_slots,
)
from keylane.core.state import (
    CorruptState,
    EmptiedKeyState,
    KeyState,
    PagedKeyState,
    decode_state,
    emptied,
    encode_state,
    unpaged,
)

CACHE_BYTES = 64 * 1024 * 1024
"""Memory (as the Memory facade counts it) of the paged keys a worker keeps decoded."""
DECODED_BYTES = 16 * 1024 * 1024
"""Records (counted by their encoded size) of the keys whose state a worker keeps decoded as
it wrote them: a key's next read then decodes nothing when its record is still that one."""


@dataclass
class _Kept:
    record: bytes
    entries: dict[str, MemoryEntry]
    layout: PageLayout
    names: Names


class KeyStates:
    """One table's key states: ``get`` and ``put`` read and write the table's raw values."""

    def __init__(
        self,
        get: Callable[[bytes], bytes | None],
        put: Callable[[bytes, bytes], None],
        *,
        cache_bytes: int = CACHE_BYTES,
        decoded_bytes: int = DECODED_BYTES,
    ) -> None:
        self._get = get
        self._put = put
        self.cache_bytes = cache_bytes
        self.decoded_bytes = decoded_bytes
        self._decoded: OrderedDict[bytes, tuple[bytes, KeyState]] = OrderedDict()
        """key: (the record it was written with, that record decoded), least recent first."""
        self._decoded_total = 0
        self._kept: OrderedDict[bytes, _Kept] = OrderedDict()
        self._kept_bytes = 0
        self._left: dict[bytes, tuple[bytes, int]] = {}
        """Keys read with an EmptiedKeyState record: (the record, its emptied buckets)."""

    def read(self, key: bytes) -> KeyState:
        """``key``'s committed state, its memory read from its pages when they hold it
        (CorruptState when a page it names is missing or does not decode)."""
        record = self._get(key)
        written = self._decoded.get(key)
        # A state is a function of its record's bytes: whoever wrote the table since (a
        # restore, another owner), an equal record decodes to an equal state.
        state = written[1] if written is not None and written[0] == record else decode_state(record)
        if not isinstance(state, PagedKeyState):
            if isinstance(state, EmptiedKeyState):
                assert record is not None
                self._left[key] = (record, state.emptied_buckets)
                return unpaged(state)
            return state
        assert record is not None
        kept = self._kept.get(key)
        if kept is not None and kept.record == record:
            self._kept.move_to_end(key)
        else:
            try:
                entries, names = assembled(state.pages, key, self._get)
            except UnreadablePage as exc:
                raise CorruptState(f"the key's memory does not read: {exc}") from None
            kept = self._keep(key, _Kept(record, entries, state.pages, names))
        return struct_replace(state, memory=MemoryBlob(entries=kept.entries))

    def write(
        self,
        key: bytes,
        state: KeyState,
        record: bytes | None = None,
        *,
        unpages: bool = False,
        readback: KeyState | None = None,
    ) -> int:
        """Commit ``state`` for ``key`` (``record``: its blob, when the runtime sealed it, and
        ``readback``: that blob as it decodes, kept for the key's next read): the pages it
        changed, then its record (a paged key's: the sealed blob with the slots of its new
        pages, ``with_slots``). With ``unpages`` (a paged key whose memory emptied), the
        pages the committed record names are emptied after the new record. Returns the bytes
        written."""
        written = self._empty_left_pages(key, state.epoch) if self._left else 0
        self._forget_decoded(key)
        if not isinstance(state, PagedKeyState):
            dropped = self._committed_layout(key) if unpages else None
            if dropped is not None:
                record = encode_state(emptied(state, dropped.buckets))
            elif record is None:
                record = encode_state(state)
            elif readback is not None:
                self._keep_decoded(key, record, readback)
            self._put(key, record)
            if self._kept:
                self._forget(key)
            written += len(record)
            if dropped is not None:
                written += self._empty_pages(key, dropped.buckets, state.epoch)
            return written
        layout, pages, names = self._pages(key, state)
        for bucket, blob in pages.items():
            self._put(page_key(key, bucket, layout.slot(bucket)), blob)
            written += len(blob)
        sealed = None if record is None else with_slots(record, state.pages, layout)
        record = encode_state(struct_replace(state, pages=layout)) if sealed is None else sealed
        self._put(key, record)
        self._keep(key, _Kept(record, state.memory.entries, layout, names))
        if isinstance(readback, PagedKeyState):  # the sealed blob's, but for its slots
            self._keep_decoded(key, record, struct_replace(readback, pages=layout))
        return written + len(record)

    def _empty_left_pages(self, key: bytes, epoch: int) -> int:
        """Empty the pages ``key``'s committed record (an EmptiedKeyState, as read) left to
        empty; the write that follows names none of them, or writes them over after."""
        left = self._left.pop(key, None)
        if left is None or left[0] != self._get(key):
            return 0
        return self._empty_pages(key, left[1], epoch)

    def _empty_pages(self, key: bytes, buckets: int, epoch: int) -> int:
        """Write both slots of ``buckets`` buckets of ``key``'s pages over with empty pages."""
        empty = encode_page({}, epoch)
        for bucket in range(buckets):
            for slot in (0, 1):
                self._put(page_key(key, bucket, slot), empty)
        return 2 * buckets * len(empty)

    def _committed(self, key: bytes) -> tuple[PageLayout | None, Names | None]:
        """The page layout ``key``'s committed record names (None: it is not paged) and, when
        the memory it came with is kept, the names of each bucket."""
        record = self._get(key)
        kept = self._kept.get(key)
        if kept is not None and kept.record == record:
            return kept.layout, kept.names
        committed = decode_state(record)
        return (committed.pages if isinstance(committed, PagedKeyState) else None), None

    def _committed_layout(self, key: bytes) -> PageLayout | None:
        """The page layout ``key``'s committed record names, if it is paged (and reads)."""
        try:
            return self._committed(key)[0]
        except CorruptState:
            return None

    def _pages(self, key: bytes, state: PagedKeyState) -> tuple[PageLayout, dict[int, bytes], Names]:
        """The layout ``state`` is written in, the pages to write (bucket: encoded page), each
        into the slot the committed record does not name, and the names by bucket."""
        entries = state.memory.entries
        staged = state.pages
        size = staged.memory_bytes
        old, names = self._committed(key)
        # The write takes the kept names over and changes them in place: a copy of a large
        # memory's names at every activation was most of what the young garbage collections
        # walked. Were the write to fail, the key's next read assembles its pages again.
        self._forget(key)
        if old is None:  # no page is named: every bucket starts in slot 0
            fresh = new_layout(staged.buckets, size)
            return fresh, *_every_page(entries, fresh, state)
        if (staged.buckets, staged.slots) != (old.buckets, old.slots):
            # Not staged from the committed record: replace every page it names.
            return _rewritten(entries, old, old.buckets, size, state)
        if names is None:
            names = names_by_bucket(entries, old.buckets)
        changed: set[int] = set()
        for name in staged.dirty:
            bucket = bucket_of(name, old.buckets)
            changed.add(bucket)
            if name in entries:
                names[bucket].add(name)
            else:
                names[bucket].discard(name)
        pages = {
            bucket: encode_page({name: entries[name] for name in names[bucket]}, state.epoch)
            for bucket in changed
        }
        if any(len(blob) > GROW_AT_PAGE_BYTES for blob in pages.values()):
            wanted = buckets_for(size, len(entries))
            if wanted > old.buckets:
                return _rewritten(entries, old, wanted, size, state)
        layout = PageLayout(buckets=old.buckets, slots=flipped(old.slots, changed), memory_bytes=size)
        return layout, pages, names

    def _keep(self, key: bytes, kept: _Kept) -> _Kept:
        self._forget(key)
        self._kept[key] = kept
        self._kept_bytes += kept.layout.memory_bytes
        while self._kept_bytes > self.cache_bytes and len(self._kept) > 1:
            _, oldest = self._kept.popitem(last=False)
            self._kept_bytes -= oldest.layout.memory_bytes
        return kept

    def _keep_decoded(self, key: bytes, record: bytes, state: KeyState) -> None:
        self._decoded[key] = (record, state)
        self._decoded_total += len(record)
        while self._decoded_total > self.decoded_bytes and self._decoded:
            _, (oldest, _) = self._decoded.popitem(last=False)
            self._decoded_total -= len(oldest)

    def _forget_decoded(self, key: bytes) -> None:
        written = self._decoded.pop(key, None)
        if written is not None:
            self._decoded_total -= len(written[0])

    def _forget(self, key: bytes) -> None:
        kept = self._kept.pop(key, None)
        if kept is not None:
            self._kept_bytes -= kept.layout.memory_bytes


def _every_page(
    entries: dict[str, MemoryEntry], layout: PageLayout, state: KeyState
) -> tuple[dict[int, bytes], Names]:
    names = names_by_bucket(entries, layout.buckets)
    pages = {
        bucket: encode_page({name: entries[name] for name in members}, state.epoch)
        for bucket, members in names.items()
    }
    return pages, names


def _rewritten(
    entries: dict[str, MemoryEntry], old: PageLayout, buckets: int, size: int, state: KeyState
) -> tuple[PageLayout, dict[int, bytes], Names]:
    """Every page of a layout of ``buckets`` (at least ``old``'s): a bucket ``old`` names goes
    to its other slot, a new one to slot 0 (no record names it)."""
    fresh = new_layout(buckets, size)
    named = (bucket for bucket in range(old.buckets) if not old.slot(bucket))
    layout = struct_replace(fresh, slots=flipped(fresh.slots, named))
    return layout, *_every_page(entries, layout, state)


def entity_items(items: Iterable[tuple[bytes, bytes]]) -> Iterator[tuple[bytes, bytes]]:
    """The (key, state record) pairs among a table's items, without its memory pages."""
    return ((key, value) for key, value in items if not is_page_key(key))
