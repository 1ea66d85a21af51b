"""The Memory facade (values, rings, soft and hard caps) and the replay cache (LRU, TTL, size)."""

from __future__ import annotations

import hashlib
import re
from typing import Any

import msgspec
import pytest

from keylane.authoring.memory import Memory, MemoryOverflow
from keylane.cells import MemoryBlob, MemoryEntry
from keylane.core.replay_cache import MAX_BYTES, MAX_ENTRIES, TTL_MS, ReplayCache
from keylane.llm.types import LlmRequest, LlmResponse, cache_key, cache_key_of, request_scope

NOW = 1_700_000_000_000


def size_of(key: str, value: Any) -> int:
    """What the caps count for one entry: the key's length plus the msgpack-encoded value."""
    return len(key) + len(msgspec.msgpack.encode(value))


def memory(entries: dict[str, MemoryEntry] | None = None, **options: Any) -> Memory:
    return Memory(MemoryBlob(entries=entries or {}), now_ms=NOW, **options)


# --- Memory: values and rings ---------------------------------------------------------------


def test_get_set_delete_on_scalars() -> None:
    mem = memory()

    assert mem.get("missing") is None
    assert mem.get("missing", "fallback") == "fallback"
    mem.set("name", "ada")
    mem.set("profile", {"tier": "gold", "ids": [1, 2]})
    mem.set("name", "grace")
    mem.delete("profile")
    mem.delete("never-there")

    assert mem.get("name") == "grace"
    assert mem.get("profile") is None
    assert list(mem.keys()) == ["name"]
    assert mem.total_bytes == size_of("name", "grace")


def test_what_memory_holds_comes_back_as_written_after_the_commit() -> None:
    value = {
        "none": None,
        "flag": True,
        "n": -(2**63),
        "x": 1.5,
        "s": "é",
        "b": b"\x00",
        "l": [1, {"2": [3]}],
    }
    mem = memory()
    mem.set("v", value)
    mem.append("r", {7: "seven"})

    committed = msgspec.msgpack.decode(msgspec.msgpack.encode(mem.to_blob()), type=MemoryBlob)
    again = Memory(committed, now_ms=NOW)

    assert again.get("v") == value
    assert again.ring("r") == ({7: "seven"},)


@pytest.mark.parametrize(
    ("value", "refusal"),
    [
        ({"a", "b"}, "a value of type set cannot be stored (store a sorted list)"),
        ({"ids": frozenset({1})}, "a value of type frozenset cannot be stored (store a sorted list)"),
        ([object()], "a value of type object cannot be stored (store its fields as a dict)"),
        ({(1, 2): "pair"}, "a dict key of type tuple cannot be stored; use str or int keys"),
        (2**64, "does not fit 64 bits; store it as a str"),
    ],
    ids=["set", "nested-frozenset", "object", "tuple-key", "big-int"],
)
def test_a_value_that_would_not_come_back_as_written_is_refused_at_the_write(
    value: Any, refusal: str
) -> None:
    mem = memory()

    with pytest.raises(TypeError, match=f"^memory key 'k': .*{re.escape(refusal)}"):
        mem.set("k", value)
    with pytest.raises(TypeError, match=re.escape(refusal)):
        mem.append("k", value)
    assert list(mem.keys()) == [] and not mem.dirty


def test_append_builds_a_ring_that_keeps_the_newest_max_items() -> None:
    mem = memory()

    for n in range(5):
        mem.append("recent", n, max_items=3)

    assert mem.ring("recent") == (2, 3, 4)
    assert mem.ring("absent") == ()


def test_append_with_max_items_zero_keeps_an_empty_ring() -> None:
    mem = memory()

    mem.append("nothing", "x", max_items=0)

    assert mem.ring("nothing") == ()


def test_set_replaces_a_ring_with_a_scalar() -> None:
    mem = memory()
    mem.append("k", 1)

    mem.set("k", "scalar now")

    assert mem.get("k") == "scalar now"


def test_reading_or_appending_the_wrong_kind_raises_type_error() -> None:
    mem = memory()
    mem.set("scalar", 1)
    mem.append("ring", 1)

    with pytest.raises(TypeError, match="holds a ring; read it with ring"):
        mem.get("ring")
    with pytest.raises(TypeError, match="holds a scalar; read it with get"):
        mem.ring("scalar")
    with pytest.raises(TypeError, match="holds a scalar; append needs a ring"):
        mem.append("scalar", 2)
    assert mem.get("scalar") == 1
    assert mem.ring("ring") == (1,)


def test_a_list_or_dict_crosses_between_the_agent_and_memory_as_a_copy() -> None:
    """Changing a value in place, after the write that stored it or after the read that gave
    it, changes nothing memory holds: only a write does."""
    ring_item = {"role": "user"}
    written = {"ids": [1, 2], "pair": (3, 4)}
    committed = MemoryBlob(entries={"kept": MemoryEntry(value=[{"n": 1}], last_access_ms=NOW)})
    mem = Memory(committed, now_ms=NOW)  # read in the millisecond it was last read: no touch

    mem.set("v", written)
    mem.append("r", ring_item)
    written["ids"].append(99)
    ring_item["role"] = "changed"
    mem.get("v")["ids"].clear()
    mem.get("kept")[0]["n"] = 2
    mem.ring("r")[0]["role"] = "changed"

    assert mem.get("v") == {"ids": [1, 2], "pair": [3, 4]}  # a tuple is stored as a list
    assert mem.ring("r") == ({"role": "user"},)
    assert mem.get("kept") == [{"n": 1}]
    assert committed.entries["kept"].value == [{"n": 1}]


def test_writes_are_staged_on_a_copy_of_the_committed_blob() -> None:
    committed = MemoryBlob(entries={"k": MemoryEntry(value="old", last_access_ms=1)})
    mem = Memory(committed, now_ms=NOW)

    mem.set("k", "new")
    mem.set("other", 1)

    assert committed.entries == {"k": MemoryEntry(value="old", last_access_ms=1)}
    assert mem.to_blob().entries["k"] == MemoryEntry(value="new", ring=False, last_access_ms=NOW)


@pytest.mark.parametrize(
    "write",
    [
        lambda mem: mem.get("k"),  # a read marks the entry recently used: a write too
        lambda mem: mem.ring("r"),
        lambda mem: mem.delete("k"),
        lambda mem: mem.append("r", 3),
        lambda mem: mem.set("new", 1),
    ],
    ids=["get", "ring", "delete", "append", "set"],
)
def test_no_write_reaches_the_committed_entries_it_shares_until_then(write: Any) -> None:
    entries = {
        "k": MemoryEntry(value="old", last_access_ms=1),
        "r": MemoryEntry(value=[1, 2], ring=True, last_access_ms=1),
    }
    committed = MemoryBlob(entries=dict(entries))
    mem = Memory(committed, now_ms=NOW)

    write(mem)

    assert committed.entries == entries
    assert mem.to_blob().entries != entries


def test_a_write_after_the_commit_does_not_change_the_committed_cell() -> None:
    mem = memory({"k": MemoryEntry(value="old", last_access_ms=1)})
    mem.set("k", "staged")
    cell = mem.to_blob()

    mem.set("k", "late")  # an agent that kept its context past the activation
    mem.delete("k")

    assert cell.entries == {"k": MemoryEntry(value="staged", ring=False, last_access_ms=NOW)}
    assert mem.to_blob().entries == {}


# --- Memory: caps ---------------------------------------------------------------------------


def test_the_soft_cap_warns_once_per_activation_at_three_quarters_of_the_hard_cap() -> None:
    warnings: list[int] = []
    mem = memory(hard_cap_bytes=1000, on_soft_cap=warnings.append)
    for key in "abc":
        mem.set(key, b"x" * 200)  # 203 bytes each
    mem.set("d", b"x" * 137)  # 1 + 2 + 137 -> 749 in all

    assert mem.total_bytes == 749
    assert warnings == []

    mem.set("d", b"x" * 138)  # 750: exactly 75% of 1000
    mem.set("e", b"more")
    mem.set("f", b"and more")

    assert warnings == [750]

    next_activation: list[int] = []
    Memory(mem.to_blob(), now_ms=NOW + 1, hard_cap_bytes=1000, on_soft_cap=next_activation.append).set("g", 1)
    assert len(next_activation) == 1


def aged(value: Any, last_access_ms: int) -> MemoryEntry:
    return MemoryEntry(value=value, last_access_ms=last_access_ms)


def three_aged_entries() -> dict[str, MemoryEntry]:
    """203 bytes each, 609 in all; "b" was used longest ago, then "c", then "a"."""
    return {"a": aged(b"x" * 200, 50), "b": aged(b"x" * 200, 10), "c": aged(b"x" * 200, 30)}


def test_a_write_over_the_hard_cap_drops_least_recently_used_entries_and_succeeds() -> None:
    mem = memory(three_aged_entries(), hard_cap_bytes=1000)
    big = b"x" * 400  # 1 + 3 + 400 = 404 bytes: 609 + 404 is over 1000

    mem.set("z", big)

    assert list(mem.keys()) == ["a", "c", "z"]
    assert mem.get("z") == big
    assert mem.total_bytes == 203 + 203 + 404


def test_reading_an_entry_makes_it_recently_used_and_spares_it_from_compaction() -> None:
    mem = memory(three_aged_entries(), hard_cap_bytes=1000)

    mem.get("b")
    mem.set("z", b"x" * 400)

    assert sorted(mem.keys()) == ["a", "b", "z"]


def test_compaction_drops_entries_down_to_half_the_hard_cap_not_just_enough_to_fit() -> None:
    entries = {**three_aged_entries(), "d": aged(b"x" * 200, 40)}  # 812 bytes; LRU order b, c, d, a
    mem = memory(entries, hard_cap_bytes=1000)

    mem.set("z", b"x" * 200)  # 812 + 203 is over 1000; dropping "b" alone would make it fit

    assert list(mem.keys()) == ["a", "d", "z"]  # "b" and "c" went: 812 -> 609 -> 406 <= 500
    assert mem.total_bytes == 3 * 203


def test_a_write_that_does_not_fit_even_after_compaction_raises_and_is_not_applied() -> None:
    mem = memory({"k": aged("small", 1)}, hard_cap_bytes=1000)
    before = mem.total_bytes

    with pytest.raises(MemoryOverflow) as overflow:
        mem.set("k", b"x" * 1000)
    with pytest.raises(MemoryOverflow):
        mem.append("ring", b"x" * 1000)

    assert mem.get("k") == "small"
    assert mem.ring("ring") == ()
    assert mem.total_bytes == before
    assert overflow.value.key == "k"
    assert overflow.value.attempted_bytes == size_of("k", b"x" * 1000)
    assert overflow.value.cap_bytes == 1000
    assert "over the 1000-byte cap" in str(overflow.value)


def test_a_failed_write_also_undoes_the_compaction_it_tried() -> None:
    mem = memory(three_aged_entries(), hard_cap_bytes=1000)
    before = {key: mem.get(key) for key in list(mem.keys())}

    with pytest.raises(MemoryOverflow):
        mem.set("huge", b"x" * 1000)

    assert {key: mem.get(key) for key in list(mem.keys())} == before, (
        "an agent that catches MemoryOverflow keeps its memory"
    )
    assert mem.to_blob().entries.keys() == before.keys()


# --- ReplayCache ----------------------------------------------------------------------------


def answer(body: bytes = b"answer") -> LlmResponse:
    return LlmResponse(response=body, model_id="fake-1", prompt_tokens=3, completion_tokens=4)


def test_a_hit_returns_the_stored_response_marked_cached() -> None:
    cache = ReplayCache([])
    cache.put("k", answer(b"hello"), now_ms=NOW)

    hit = cache.get("k", now_ms=NOW)

    assert hit == LlmResponse(
        response=b"hello", model_id="fake-1", prompt_tokens=3, completion_tokens=4, cached=True
    )
    assert cache.get("other", now_ms=NOW) is None


def test_the_65th_entry_evicts_the_least_recently_used() -> None:
    cache = ReplayCache([])
    for n in range(MAX_ENTRIES + 1):
        cache.put(f"k{n}", answer(), now_ms=NOW)

    assert MAX_ENTRIES == 64
    assert len(cache.entries()) == 64
    assert cache.get("k0", now_ms=NOW) is None
    assert cache.get("k1", now_ms=NOW) is not None


def test_a_get_refreshes_an_entry_so_the_next_eviction_spares_it() -> None:
    cache = ReplayCache([])
    for n in range(MAX_ENTRIES):
        cache.put(f"k{n}", answer(), now_ms=NOW)

    assert cache.get("k0", now_ms=NOW) is not None
    cache.put("k64", answer(), now_ms=NOW)

    assert cache.get("k0", now_ms=NOW) is not None
    assert cache.get("k1", now_ms=NOW) is None


def test_an_entry_exactly_six_hours_old_is_live_and_one_millisecond_later_is_a_miss() -> None:
    cache = ReplayCache([])
    cache.put("k", answer(), now_ms=NOW)

    assert TTL_MS == 6 * 60 * 60 * 1000
    assert cache.get("k", now_ms=NOW + TTL_MS) is not None
    assert cache.get("k", now_ms=NOW + TTL_MS + 1) is None
    assert cache.entries() == []


def test_the_whole_cell_stays_under_100_kib_by_evicting_least_recently_used_entries() -> None:
    cache = ReplayCache([])
    chunk = 30 * 1024
    for name in "abc":
        cache.put(name, answer(name.encode() * chunk), now_ms=NOW)
    cache.get("a", now_ms=NOW)

    cache.put("d", answer(b"d" * chunk), now_ms=NOW)

    assert MAX_BYTES == 100 * 1024
    assert [e.cache_key for e in cache.entries()] == ["c", "a", "d"]
    assert len(msgspec.msgpack.encode(cache.entries())) <= MAX_BYTES


def test_a_response_over_100_kib_is_kept_as_a_digest_only_and_looks_up_as_a_miss() -> None:
    cache = ReplayCache([])
    huge = b"h" * (MAX_BYTES + 1)
    cache.put("small", answer(b"kept"), now_ms=NOW)

    cache.put("huge", answer(huge), now_ms=NOW)

    [small, stored] = cache.entries()
    assert (small.cache_key, small.digest_only, small.response) == ("small", False, b"kept")
    assert stored.digest_only
    assert stored.response == b""
    assert stored.digest == hashlib.sha256(huge).hexdigest()
    assert cache.get("huge", now_ms=NOW) is None
    assert cache.get("small", now_ms=NOW) is not None


# --- cache_key ------------------------------------------------------------------------------

BASE = LlmRequest(
    model_id="m-1",
    messages=[{"role": "user", "content": "hi"}],
    tools_schema=[{"name": "lookup"}],
    sampling_params={"temperature": 0.0, "top_p": 1.0},
)


def key_of(request: LlmRequest = BASE, *, entity_key: bytes = b"k#0", seq: int = 3) -> str:
    return cache_key(request, entity_key=entity_key, seq=seq)


@pytest.mark.parametrize(
    "variant",
    [
        lambda: key_of(seq=4),
        lambda: key_of(entity_key=b"k#1"),
        lambda: key_of(LlmRequest(**{**BASE.__dict__, "model_id": "m-2"})),
        lambda: key_of(LlmRequest(**{**BASE.__dict__, "messages": [{"role": "user", "content": "ho"}]})),
        lambda: key_of(LlmRequest(**{**BASE.__dict__, "tools_schema": None})),
        lambda: key_of(LlmRequest(**{**BASE.__dict__, "sampling_params": {"temperature": 0.5}})),
    ],
    ids=["seq", "key", "model", "messages", "tools_schema", "sampling_params"],
)
def test_the_cache_key_changes_with_everything_that_changes_the_answer(variant: Any) -> None:
    assert variant() != key_of()


def test_the_cache_key_ignores_dict_key_order() -> None:
    reordered = LlmRequest(
        model_id="m-1",
        messages=[{"content": "hi", "role": "user"}],
        tools_schema=[{"name": "lookup"}],
        sampling_params={"top_p": 1.0, "temperature": 0.0},
    )

    assert key_of(reordered) == key_of()
    assert key_of() == key_of(BASE)


def test_the_committed_cell_carries_each_responses_sha256_and_its_true_size() -> None:
    cache = ReplayCache([])
    for name in ("a", "b"):
        cache.put(name, answer(name.encode() * 300), now_ms=NOW)

    committed = cache.entries()

    assert [e.digest for e in committed] == [hashlib.sha256(c * 300).hexdigest() for c in (b"a", b"b")]
    for entry in committed:
        assert entry.size == len(msgspec.msgpack.encode(msgspec.structs.replace(entry, size=0)))
    # read back as the next activation does: the digests are the committed ones
    again = ReplayCache(committed)
    assert [e.digest for e in again.entries()] == [e.digest for e in committed]


# --- lookup / keep: what call_model uses ----------------------------------------------------


def scope_of(request: LlmRequest = BASE, *, seq: int = 3) -> bytes:
    return request_scope(request, entity_key=b"k#0", seq=seq)


def test_the_key_of_a_scope_is_the_cache_key_of_its_request() -> None:
    # committed cells keep the keys cache_key gave: a cell written before lookup/keep still hits
    assert cache_key_of(scope_of()) == key_of()
    # as keylane 542a764 keyed it
    assert key_of() == "702b2975984a6b665feb758702da8e8f370ce67d0ef91a2c1106994fd919cc1e"


def test_a_kept_answer_is_a_hit_for_the_same_call_and_is_committed_under_its_key() -> None:
    cache = ReplayCache([])
    cache.keep(scope_of(), answer(b"hello"), now_ms=NOW)

    assert cache.lookup(scope_of(seq=4), now_ms=NOW) is None
    hit = cache.lookup(scope_of(), now_ms=NOW)
    assert hit is not None and hit.response == b"hello" and hit.cached
    assert [e.cache_key for e in cache.entries()] == [key_of()]
    assert cache.took_responses


def test_keeps_are_put_in_call_order_under_the_limits() -> None:
    cache = ReplayCache([])
    for n in range(MAX_ENTRIES + 1):
        cache.keep(scope_of(seq=n), answer(b"%d" % n), now_ms=NOW)

    committed = cache.entries()

    assert len(committed) == MAX_ENTRIES  # the first kept was evicted, as by a put
    kept_last = [cache_key_of(scope_of(seq=n)) for n in range(1, MAX_ENTRIES + 1)]
    assert [e.cache_key for e in committed] == kept_last


def test_no_key_is_worked_out_for_a_cell_that_is_never_read_again(monkeypatch: pytest.MonkeyPatch) -> None:
    import keylane.core.replay_cache as replay_cache

    digested: list[bytes] = []
    monkeypatch.setattr(replay_cache, "cache_key_of", lambda scope: digested.append(scope) or "k")
    cache = ReplayCache([])

    assert cache.lookup(scope_of(), now_ms=NOW) is None  # an empty cell: a miss without a key
    cache.keep(scope_of(), answer(), now_ms=NOW)
    assert digested == []  # an activation that completes drops its cell here
    cache.entries()
    assert digested == [scope_of()]
    # a committed cell is looked up by key
    again = ReplayCache(cache.entries())
    again.lookup(scope_of(seq=9), now_ms=NOW)
    assert digested == [scope_of(), scope_of(seq=9)]
