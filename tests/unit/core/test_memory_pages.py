"""Paged memory (service/keylane/core/pages.py, service/keylane/core/key_states.py): a key's
memory over 16 KiB lives in bucket pages; an activation writes the pages it changed, each
into the slot the committed record does not name, then the record naming them."""

from __future__ import annotations

import random

import pytest
from prometheus_client import REGISTRY

from keylane import inspect
from keylane.authoring.api import Complete
from keylane.authoring.context import ActivationContext
from keylane.authoring.memory import Memory
from keylane.cells import MemoryBlob, MemoryEntry
from keylane.core.key_states import KeyStates, entity_items
from keylane.core.pages import PAGED_FROM_BYTES, decode_page, encode_page, is_page_key, page_key, page_owner
from keylane.core.state import (
    CorruptState,
    EmptiedKeyState,
    KeyState,
    PagedKeyState,
    decode_state,
    memory_bytes,
)
from keylane.kafka.topic_reader import TopicRecord
from keylane.testing import AgentHarness

KEY = b"doc-1"
CELL = 1024


def cell(name: str, version: int) -> bytes:
    return random.Random(f"{name}/{version}").randbytes(CELL)


async def cells(ctx: ActivationContext) -> Complete:
    """``fill:<n>``: n cells of 1 KiB. ``set:<i>:<v>``: rewrite cell i. ``del:<i>``: drop it.
    ``clear``: drop every cell."""
    command, *args = ctx.event.decode().split(":")
    if command == "fill":
        for i in range(int(args[0])):
            ctx.memory.set(f"c{i}", cell(f"c{i}", 0))
    elif command == "set":
        ctx.memory.set(f"c{args[0]}", cell(f"c{args[0]}", int(args[1])))
    elif command == "del":
        ctx.memory.delete(f"c{args[0]}")
    elif command == "clear":
        for name in list(ctx.memory.keys()):
            ctx.memory.delete(name)
    return Complete(output=b"ok")


class Recording(dict[bytes, bytes]):
    """A store that records the keys written, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[tuple[bytes, int]] = []
        self.log: list[tuple[bytes, bytes]] = []  # what a changelog would hold, in order

    def __setitem__(self, key: bytes, value: bytes) -> None:
        self.writes.append((key, len(value)))
        self.log.append((key, value))
        super().__setitem__(key, value)


def harness() -> tuple[AgentHarness, Recording]:
    h = AgentHarness(cells)
    store = Recording()
    h.store = store
    h.states = KeyStates(store.get, store.__setitem__)
    return h, store


def expected(versions: dict[int, int]) -> dict[str, bytes]:
    return {f"c{i}": cell(f"c{i}", v) for i, v in versions.items()}


def memory_of(h: AgentHarness) -> dict[str, bytes]:
    return {name: entry.value for name, entry in h.state(KEY).memory.entries.items()}


async def test_small_memory_stays_in_the_record() -> None:
    h, store = harness()
    await h.send_event(KEY, "fill:8")

    assert list(store) == [KEY]
    assert not isinstance(decode_state(store[KEY]), PagedKeyState)
    assert memory_of(h) == expected(dict.fromkeys(range(8), 0))


async def test_memory_past_16_kib_is_paged_and_reads_back() -> None:
    h, store = harness()
    await h.send_event(KEY, "fill:64")

    record = decode_state(store[KEY])
    assert isinstance(record, PagedKeyState)
    assert record.memory.entries == {}  # the record leaves memory to its pages
    assert record.pages.buckets == 64  # a power of two, about one per KiB, at most one per entry
    assert len(store[KEY]) < 1024
    assert all(page_owner(k)[0] == KEY for k in store if is_page_key(k))
    assert memory_of(h) == expected(dict.fromkeys(range(64), 0))
    assert record.pages.memory_bytes == memory_bytes(h.state(KEY).memory)


async def test_an_activation_writes_the_pages_it_changed_then_the_record() -> None:
    h, store = harness()
    await h.send_event(KEY, "fill:512")
    store.writes.clear()

    await h.send_event(KEY, "set:7:1")

    *pages, (last, _) = store.writes
    assert last == KEY  # the record, the commit point, goes last
    assert 1 <= len(pages) <= 2 and all(is_page_key(k) for k, _ in pages)
    written = sum(size for _, size in store.writes)
    assert written <= 4 * CELL, written
    assert memory_of(h) == expected({**dict.fromkeys(range(512), 0), 7: 1})


def memory_bytes_observed() -> float:
    return REGISTRY.get_sample_value("keylane_memory_bytes_sum") or 0.0


@pytest.mark.parametrize("cells_filled", [8, 64])  # in the record, and paged
async def test_an_activation_that_never_opens_memory_commits_it_as_it_was(cells_filled: int) -> None:
    # The runtime stages no copy of memory the agent never opens (ctx.memory is opened on
    # first use); the key keeps its memory, and the activation still counts its size.
    h, store = harness()
    await h.send_event(KEY, f"fill:{cells_filled}")
    size = memory_bytes(h.state(KEY).memory)
    store.writes.clear()
    observed = memory_bytes_observed()

    await h.send_event(KEY, "leave-memory-alone")

    assert [key for key, _ in store.writes] == [KEY]  # no page: nothing in memory changed
    assert memory_of(h) == expected(dict.fromkeys(range(cells_filled), 0))
    assert memory_bytes_observed() - observed == size
    await h.send_event(KEY, "set:3:1")  # opened again, the memory is the one committed
    assert memory_of(h) == expected({**dict.fromkeys(range(cells_filled), 0), 3: 1})


async def test_the_changed_page_goes_to_the_slot_the_committed_record_does_not_name() -> None:
    h, store = harness()
    await h.send_event(KEY, "fill:64")
    before = decode_state(store[KEY])
    assert isinstance(before, PagedKeyState)
    named = {
        page_key(KEY, b, before.pages.slot(b)): store[page_key(KEY, b, before.pages.slot(b))]
        for b in range(before.pages.buckets)
    }
    store.writes.clear()

    await h.send_event(KEY, "set:3:1")

    assert all(key not in named for key, _ in store.writes if is_page_key(key))
    assert all(store[key] == page for key, page in named.items() if key in store)


async def test_a_crash_between_the_pages_and_the_record_leaves_the_activation_before() -> None:
    h, store = harness()
    await h.send_event(KEY, "fill:64")
    committed = dict(store)

    await h.send_event(KEY, "set:3:1")
    await h.send_event(KEY, "del:5")
    # Every page those activations wrote landed; neither record did (the crash came between).
    crashed = {k: v for k, v in store.items() if is_page_key(k)}
    crashed[KEY] = committed[KEY]
    restarted = KeyStates(crashed.get, crashed.__setitem__)  # nothing kept: read from pages

    entries = restarted.read(KEY).memory.entries
    assert {name: e.value for name, e in entries.items()} == expected(dict.fromkeys(range(64), 0))


async def test_a_restarted_worker_reads_the_memory_its_pages_hold() -> None:
    h, store = harness()
    await h.send_event(KEY, "fill:100")
    for version in range(1, 6):
        await h.send_event(KEY, f"set:{version * 13}:{version}")
    await h.send_event(KEY, "del:2")

    restarted = KeyStates(store.get, store.__setitem__)
    want = {**dict.fromkeys(range(100), 0), **{v * 13: v for v in range(1, 6)}}
    del want[2]
    assert {n: e.value for n, e in restarted.read(KEY).memory.entries.items()} == expected(want)


async def test_a_growing_memory_grows_its_layout_and_keeps_pages_small() -> None:
    h, store = harness()
    await h.send_event(KEY, "fill:20")
    first = decode_state(store[KEY])
    assert isinstance(first, PagedKeyState)
    for i in range(20, 300):
        await h.send_event(KEY, f"set:{i}:0")

    record = decode_state(store[KEY])
    assert isinstance(record, PagedKeyState)
    assert record.pages.buckets > first.pages.buckets
    store.writes.clear()
    await h.send_event(KEY, "set:150:9")
    assert sum(size for key, size in store.writes if is_page_key(key)) <= 4 * 4096
    assert memory_of(h) == expected({**dict.fromkeys(range(300), 0), 150: 9})


async def test_a_paged_keys_next_read_decodes_nothing_and_reads_what_its_record_says() -> None:
    """The writer keeps each paged record as decoded, with the slots and buckets it chose: the
    first paged write, one that flips a slot, one that grows the layout, and the first after
    the memory emptied (whose EmptiedKeyState record is decoded when read, as before)."""
    h, store = harness()
    commands = ["fill:20", "set:3:1", *(f"set:{i}:0" for i in range(20, 80)), "set:50:2", "clear", "fill:30"]
    for command in commands:
        await h.send_event(KEY, command)
        record = decode_state(store[KEY])
        if isinstance(record, PagedKeyState):
            assert h.states._decoded[KEY] == (store[KEY], record), command
        memory = h.states.read(KEY).memory.entries
        assert memory == KeyStates(store.get, store.__setitem__).read(KEY).memory.entries, command
    assert isinstance(record, PagedKeyState) and memory_of(h) == expected(dict.fromkeys(range(30), 0))


async def test_memory_emptied_goes_back_into_the_record() -> None:
    h, store = harness()
    await h.send_event(KEY, "fill:64")
    await h.send_event(KEY, "clear")

    assert not isinstance(decode_state(store[KEY]), PagedKeyState)
    assert memory_of(h) == {}
    await h.send_event(KEY, "fill:40")  # paged again, over pages an earlier layout left
    assert memory_of(h) == expected(dict.fromkeys(range(40), 0))


async def test_memory_emptied_empties_every_page_it_had_after_the_record() -> None:
    """Compaction keeps a key's last value: pages left as they were keep the memory for good."""
    h, store = harness()
    await h.send_event(KEY, "fill:64")
    for i in range(8):  # both slots of some buckets hold a page
        await h.send_event(KEY, f"set:{i}:1")
    paged = decode_state(store[KEY])
    assert isinstance(paged, PagedKeyState)
    held = {k: v for k, v in store.items() if is_page_key(k)}
    assert sum(map(len, held.values())) > 64 * CELL
    store.log.clear()

    await h.send_event(KEY, "clear")

    record = decode_state(store[KEY])
    assert not isinstance(record, PagedKeyState)
    (first, _), *rest = store.log
    assert first == KEY, "the record that names no page goes first"
    every_slot = {page_key(KEY, bucket, slot) for bucket in range(paged.pages.buckets) for slot in (0, 1)}
    assert {key for key, _ in rest} == every_slot
    assert set(held) <= every_slot
    pages_left = {k: v for k, v in store.items() if is_page_key(k)}
    assert all(v == encode_page({}, record.epoch) for v in pages_left.values())
    assert sum(map(len, pages_left.values())) < 32 * len(every_slot), "a few bytes each"
    await h.send_event(KEY, "fill:40")  # paged again, over the emptied pages
    assert memory_of(h) == expected(dict.fromkeys(range(40), 0))
    h.states = KeyStates(store.get, store.__setitem__)  # a restart: nothing kept
    assert memory_of(h) == expected(dict.fromkeys(range(40), 0))


@pytest.mark.parametrize("next_input", ["run again", "fill:2", "fill:40"])
async def test_pages_a_crash_left_after_the_emptied_record_are_emptied_by_the_keys_next_write(
    next_input: str,
) -> None:
    """A kill -9 between the record memory emptied into and its empty pages leaves the pages
    holding the memory, named by no record. The key's next write, the input run again (its
    offset was not committed) or any other, empties them before its own record."""
    h, store = harness()
    await h.send_event(KEY, "fill:64")
    await h.send_event(KEY, "set:1:1")  # both slots of a bucket hold a page
    held = {k: v for k, v in store.items() if is_page_key(k)}
    await h.send_event(KEY, "clear")
    assert isinstance(decode_state(store[KEY]), EmptiedKeyState)
    store.update(held)  # the record landed, none of its empty pages did
    h.states = KeyStates(store.get, store.__setitem__)  # the restarted worker: nothing kept
    store.log.clear()

    if next_input == "run again":
        await h.redeliver(h.records[-1])
    else:
        await h.send_event(KEY, next_input)

    record = decode_state(store[KEY])
    assert not isinstance(record, EmptiedKeyState)
    assert store.log[-1][0] == KEY, "the record goes last"
    named: set[bytes] = set()
    if isinstance(record, PagedKeyState):
        named = {page_key(KEY, b, record.pages.slot(b)) for b in range(record.pages.buckets)}
    assert set(held) - named, "the test leaves pages no record names"
    assert all(decode_page(store[k], "") == {} for k in set(held) - named)
    want = {"run again": 0, "fill:2": 2, "fill:40": 40}[next_input]
    assert memory_of(h) == expected(dict.fromkeys(range(want), 0))
    if not named:  # emptied once: the write after that is the record alone
        store.log.clear()
        await h.send_event(KEY, "fill:3")
        assert [key for key, _ in store.log] == [KEY]


async def test_a_record_that_stays_inline_writes_no_page() -> None:
    h, store = harness()
    await h.send_event(KEY, "fill:8")
    store.log.clear()
    await h.send_event(KEY, "clear")
    assert [key for key, _ in store.log] == [KEY]


async def test_a_missing_page_is_poison_state_for_its_key_only() -> None:
    h, store = harness()
    await h.send_event(KEY, "fill:64")
    await h.send_event(b"other", "fill:2")
    record = decode_state(store[KEY])
    assert isinstance(record, PagedKeyState)
    del store[page_key(KEY, 0, record.pages.slot(0))]
    h.states = KeyStates(store.get, store.__setitem__)  # a restart: nothing kept

    with pytest.raises(CorruptState, match="memory page 0/"):
        h.states.read(KEY)
    await h.send_event(KEY, "set:1:1")
    assert [e.reason for e in h.errors()] == ["poison_state"]
    await h.send_event(b"other", "set:1:1")
    assert h.outputs()[-1] == (b"other", b"ok")  # every other key goes on


async def test_the_timer_index_sees_state_records_only() -> None:
    h, store = harness()
    await h.send_event(KEY, "fill:64")

    assert [key for key, _ in entity_items(store.items())] == [KEY]


def test_paged_memory_counts_its_size_without_measuring_every_entry() -> None:
    rng = random.Random(7)
    blob = MemoryBlob()
    total: int | None = None
    for _ in range(200):
        memory = Memory(blob, now_ms=1, total_bytes=total)
        for _ in range(rng.randrange(1, 4)):
            name = f"k{rng.randrange(30)}"
            if rng.random() < 0.3:
                memory.delete(name)
            else:
                memory.set(name, rng.randbytes(rng.randrange(0, 300)))
        blob = memory.to_blob()
        total = memory.total_bytes
        assert total == memory_bytes(blob)


def test_a_fresh_key_is_not_paged() -> None:
    assert type(KeyStates({}.get, {}.__setitem__).read(KEY)) is KeyState
    assert PAGED_FROM_BYTES == 16 * 1024


def changelog(log: list[tuple[bytes, bytes]]) -> list[TopicRecord]:
    return [
        TopicRecord(key=k, value=v, headers={}, partition=0, offset=i, timestamp_ms=0)
        for i, (k, v) in enumerate(log)
    ]


async def test_inspect_reads_a_paged_memory_from_the_changelog_and_skips_a_late_page() -> None:
    h, store = harness()
    await h.send_event(KEY, "fill:64")
    await h.send_event(KEY, "set:3:1")
    record = decode_state(store[KEY])
    assert isinstance(record, PagedKeyState)
    # A former owner's late page (a lower epoch) lands on the slot the record names.
    bucket = next(b for b in range(record.pages.buckets) if page_key(KEY, b, record.pages.slot(b)) in store)
    late = encode_page({"c3": MemoryEntry(value=b"stale")}, epoch=-1)

    named = page_key(KEY, bucket, record.pages.slot(bucket))
    view = inspect._restore(KEY.decode(), changelog([*store.log, (named, late)]))

    assert view.state is not None and view.late_writes_skipped == 0
    memory = {n: e.value for n, e in view.state.memory.entries.items()}
    assert memory == expected({**dict.fromkeys(range(64), 0), 3: 1})


async def test_keylane_state_bytes_counts_a_paged_keys_memory_too() -> None:
    """Volumes are sized by it (docs/deploy.md): a paged key's record alone is a few hundred bytes."""
    h, store = harness()
    sum_before = REGISTRY.get_sample_value("keylane_state_bytes_sum") or 0.0
    await h.send_event(KEY, "fill:64")
    observed = (REGISTRY.get_sample_value("keylane_state_bytes_sum") or 0.0) - sum_before

    record = decode_state(store[KEY])
    assert isinstance(record, PagedKeyState)
    assert observed == len(store[KEY]) + record.pages.memory_bytes
    assert observed > 64 * CELL


async def test_a_large_memory_gives_the_garbage_collector_nothing_to_walk() -> None:
    """A key's memory is copied at every activation; were its entries tracked by the garbage
    collector, each young collection would walk the copies entry by entry (the 512 KiB state
    benchmark spent a tenth of its CPU there). The entries are not tracked, nor, as a result,
    the dicts holding them, as read back from pages, as staged, and as kept for the next read;
    and a write takes the kept names of each bucket over instead of copying them."""
    import gc

    harness = AgentHarness(cells)
    await harness.send_event(KEY, "fill:40")
    await harness.send_event(KEY, "set:3:1")
    fresh = KeyStates(harness.store.get, harness.store.__setitem__)
    for states in (harness.states, fresh):  # kept from the write, then read from the pages
        entries = states.read(KEY).memory.entries
        assert len(entries) == 40
        assert not any(gc.is_tracked(entry) for entry in entries.values())
        assert not gc.is_tracked(entries)
        assert not gc.is_tracked(Memory(MemoryBlob(entries=entries), now_ms=0).to_blob().entries)
    ring = MemoryEntry(value=["a", ["nested"]], ring=True)
    assert not gc.is_tracked(ring), "even an entry holding lists"
    names = harness.states._kept[KEY].names
    await harness.send_event(KEY, "set:5:1")
    assert harness.states._kept[KEY].names is names, "the write changed the kept names in place"
    assert harness.state(KEY).memory.entries["c5"].value == cell("c5", 1)
