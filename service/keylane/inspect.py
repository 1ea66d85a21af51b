"""`keylane inspect`: a key's state as the runtime restores it, read from the state changelog.

The changelog, not a worker, is the source: it needs nothing from the workers (no endpoint,
no request in their lanes), it answers while they are down or crash-looping (when an operator
needs it most), and it is exactly what the key's next owner would restore: the last record of
the key in its changelog partition, a former owner's late write skipped as a restore skips it
(owner epochs, service/keylane/kafka/epochs.py). It shows the last *committed* state: an
activation running now is not in it yet. The read is a group-less consumer of one changelog
partition (every partition for ``--logical``), so it commits nothing and moves no one.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

from keylane.catalog import EVENTS, Catalog
from keylane.cells import MemoryEntry, encoded_size
from keylane.config import Settings
from keylane.core.key_states import KeyStates
from keylane.core.pages import is_page_key, page_owner
from keylane.core.state import KeyState, UnreadableState, epoch_of, state_changelog
from keylane.errors import KeylaneError
from keylane.kafka.partitioner import expected_partition
from keylane.kafka.topic_reader import TopicRecord, partition_ids, read_to_end
from keylane.keys import unshard_key


@dataclass(frozen=True)
class KeyView:
    """One physical key's stored state: its decoded state, or why it cannot be read."""

    key: str
    partition: int
    offset: int | None  # of the changelog record restored; None: the key has no state
    state: KeyState | None
    unreadable: str | None = None
    late_writes_skipped: int = 0


async def inspect_keys(settings: Settings, catalog: Catalog, key: str, *, logical: bool) -> list[KeyView]:
    """The state of ``key`` (a physical key), or with ``logical`` of every shard ``key#i``
    found in the changelog (none when the key was never sharded or has no state yet)."""
    partitions = catalog[EVENTS].partitions  # the changelog is co-partitioned with the inputs
    changelog = state_changelog(settings.app_id)
    try:
        await partition_ids(settings, changelog)  # read_to_end would wait on a missing topic
    except LookupError:
        raise KeylaneError(
            f"{changelog} does not exist on {settings.bootstrap_servers}: no worker of app id "
            f"{settings.app_id!r} has written state there; check KEYLANE_APP_ID (--app-id) and "
            "KEYLANE_TOPIC_PREFIX (--topic-prefix)"
        ) from None
    if logical:
        records = await read_to_end(settings, changelog)
        found = {r.key for r in records if r.key and _is_shard_of(r.key, key.encode())}
        shards = sorted(found, key=_shard_number)
        return [_restore(shard.decode(), _of_key(records, shard)) for shard in shards]
    partition = expected_partition(key.encode(), partitions)
    records = await read_to_end(settings, changelog, partitions=[partition])
    view = _restore(key, _of_key(records, key.encode()))
    return [view if view.offset is not None else KeyView(key, partition, None, None)]


def _of_key(records: list[TopicRecord], key: bytes) -> list[TopicRecord]:
    """The changelog records of ``key``: its state records and its memory pages."""
    return [r for r in records if r.key == key or (r.key is not None and _page_of(r.key, key))]


def _page_of(stored: bytes, key: bytes) -> bool:
    return is_page_key(stored) and page_owner(stored)[0] == key


def _is_shard_of(physical: bytes, logical: bytes) -> bool:
    try:
        return unshard_key(physical) == logical
    except ValueError:
        return False


def _shard_number(physical: bytes) -> int:
    return int(physical.rsplit(b"#", 1)[1])


def _restore(key: str, records: list[TopicRecord]) -> KeyView:
    """The key's records (state records and memory pages) in changelog order, applied as a
    restore applies them: the epoch fence per table key."""
    restored: dict[bytes, tuple[TopicRecord | None, int]] = {}
    skipped = 0
    for record in records:
        assert record.key is not None
        chosen, epoch = restored.get(record.key, (None, -1))
        if record.value is None:  # a tombstone: the key's state was deleted
            restored[record.key] = (None, -1)
            continue
        written = epoch_of(record.value)
        if written is not None and written < epoch:
            skipped += not is_page_key(record.key)
            continue
        restored[record.key] = (record, written if written is not None else epoch)
    chosen = restored.get(key.encode(), (None, -1))[0]
    partition = records[0].partition if records else -1
    if chosen is None:
        return KeyView(key, partition, None, None, late_writes_skipped=skipped)
    try:
        state = KeyStates(lambda k: _value(restored.get(k)), _read_only).read(key.encode())
    except UnreadableState as exc:
        return KeyView(key, partition, chosen.offset, None, unreadable=str(exc), late_writes_skipped=skipped)
    return KeyView(key, partition, chosen.offset, state, late_writes_skipped=skipped)


def _value(restored: tuple[TopicRecord | None, int] | None) -> bytes | None:
    return restored[0].value if restored is not None and restored[0] is not None else None


def _read_only(key: bytes, value: bytes) -> None:
    raise AssertionError("inspect writes nothing")


def summary(view: KeyView, *, now_ms: int) -> dict[str, Any]:
    """What ``keylane inspect`` shows of one key, as JSON-ready data (its --json output)."""
    where = {"key": view.key, "changelog_partition": view.partition, "changelog_offset": view.offset}
    if view.unreadable is not None:
        return {**where, "unreadable": view.unreadable}
    if view.state is None:
        return {**where, "state": None}
    state = view.state
    cache = state.llm_cache
    return {
        **where,
        "seq": state.seq,
        "epoch": state.epoch,
        "late_writes_skipped": view.late_writes_skipped,
        "memory": {name: _memory_entry(entry) for name, entry in state.memory.entries.items()},
        "continuation": _continuation(state, now_ms),
        "replay_cache": {
            "entries": len(cache),
            "bytes": sum(e.size or len(e.response) for e in cache),
            "oldest_ms": min((e.created_ms for e in cache), default=None),
        },
        "buffered_events": [
            {"topic": e.origin_topic, "at": f"{e.origin_partition}@{e.origin_offset}", "bytes": len(e.value)}
            for e in state.buffered
        ],
        "paused": (
            None
            if state.paused is None
            else {"by": state.paused.operator, "reason": state.paused.reason, "at_ms": state.paused.at_ms}
        ),
        "held_inputs": [
            {"topic": e.origin_topic, "at": f"{e.origin_partition}@{e.origin_offset}", "bytes": len(e.value)}
            for e in state.held
        ],
        "outbox": [{"topic": o.topic, "record_id": o.record_id, "bytes": len(o.value)} for o in state.outbox],
        "applied": dict(state.applied),
        "timers": {kind: {"deadline_ms": timer.deadline_ms} for kind, timer in state.timers.items()},
    }


def _memory_entry(entry: MemoryEntry) -> dict[str, Any]:
    shown = {"items": _plain(entry.value)} if entry.ring else {"value": _plain(entry.value)}
    return {"ring": entry.ring, **shown, "bytes": encoded_size(entry.value)}


def _continuation(state: KeyState, now_ms: int) -> dict[str, Any] | None:
    waiting = state.continuation
    if waiting is None:
        return None
    return {
        "seq": waiting.seq,
        "suspended_at_ms": waiting.suspended_at_ms,
        "deadline_ms": waiting.deadline_ms,
        "deadline_in_s": round((waiting.deadline_ms - now_ms) / 1000, 1) if waiting.deadline_ms else None,
        "escalations": waiting.escalations,
        "pending": [
            {"intent_id": p.intent_id, "tool": p.tool, "kind": p.kind, "expires_at_ms": p.expires_at_ms}
            for p in state.pending.values()
        ],
    }


def _plain(value: Any) -> Any:
    """A memory value as JSON holds it: bytes as {"base64": ...}, the rest as they are."""
    if isinstance(value, bytes):
        return {"base64": base64.b64encode(value).decode()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {str(name): _plain(item) for name, item in value.items()}
    return value
