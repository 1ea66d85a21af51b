"""Selecting and planning re-drives of dead letters (service/keylane/dead_letters.py), and the
re-drive count a dead letter of a re-driven record carries (service/keylane/records.py)."""

from __future__ import annotations

import base64
from types import SimpleNamespace

import pytest

from keylane.catalog import EVENTS, EVENTS_SHARDED, RESULTS, load_catalog
from keylane.dead_letters import (
    DeadLetter,
    Redriven,
    Selection,
    dead_letters_of,
    parse_since,
    plan,
    search_space,
    target_topic,
)
from keylane.kafka.partitioner import expected_partition
from keylane.kafka.topic_reader import TopicRecord
from keylane.records import (
    ORIGIN_HEADER,
    REDRIVE_OF_HEADER,
    REDRIVES_HEADER,
    InputRecord,
    error_emit,
    raw_digest,
)
from keylane.wire import AgentEnvelope, ErrorRecord, RecordOrigin, decode, encode

CATALOG = load_catalog(prefix="prod.")
HOUR_MS = 3_600_000


def dead(
    error_id: str,
    *,
    key: bytes | None = b"k",
    value: bytes = b"v",
    reason: str = "activation_error",
    topic: str = "prod.agent.events",
    offset: int = 0,
    at_ms: int = 1_000,
    redrives: int = 0,
    **fields: object,
) -> DeadLetter:
    given: dict[str, object] = {
        "raw_key_b64": None if key is None else base64.b64encode(key).decode(),
        "raw_value_b64": base64.b64encode(value).decode(),
        **fields,
    }
    error = ErrorRecord(
        error_id=error_id,
        reason=reason,  # type: ignore[arg-type]
        detail="boom",
        origin=RecordOrigin(topic=topic, partition=0, offset=offset),
        at_ms=at_ms,
        redrives=redrives,
        **given,  # type: ignore[arg-type]
    )
    return DeadLetter(error, at_ms, 0, offset, key)


def test_since_takes_a_duration_back_from_now_or_an_iso_time() -> None:
    now = 10 * 86_400_000
    assert parse_since("30m", now_ms=now) == now - 30 * 60_000
    assert parse_since("2h", now_ms=now) == now - 2 * HOUR_MS
    assert parse_since("1d", now_ms=now) == now - 24 * HOUR_MS
    assert parse_since("1970-01-01T01:00", now_ms=now) == HOUR_MS, "UTC unless it says otherwise"
    assert parse_since("1970-01-01T02:00+01:00", now_ms=now) == HOUR_MS
    with pytest.raises(ValueError, match="neither a duration"):
        parse_since("yesterday", now_ms=now)


def test_a_selection_matches_reason_key_and_time_together() -> None:
    letters = [dead("a", key=b"k1", at_ms=5), dead("b", key=b"k2", reason="malformed_record", at_ms=10)]
    assert [d.id for d in letters if Selection()(d)] == ["a", "b"]
    assert [d.id for d in letters if Selection(reason="malformed_record")(d)] == ["b"]
    assert [d.id for d in letters if Selection(key="k1")(d)] == ["a"]
    assert [d.id for d in letters if Selection(since_ms=6)(d)] == ["b"]
    assert [d.id for d in letters if Selection(key="k1", since_ms=6)(d)] == []


def test_dead_letters_keep_the_first_of_each_id_in_origin_order() -> None:
    def on_errors(error: ErrorRecord, offset: int) -> TopicRecord:
        return TopicRecord(b"k", encode(error), {}, 0, offset, 100 + offset)

    late = dead("late", offset=9).error
    early = dead("early", offset=2).error
    again = ErrorRecord(**{**{f: getattr(early, f) for f in early.__struct_fields__}, "at_ms": 99})
    records = [on_errors(late, 0), on_errors(early, 1), on_errors(again, 2)]
    records.append(TopicRecord(b"k", b"not a dead letter", {}, 0, 3, 200))

    letters = dead_letters_of(records)

    assert [d.id for d in letters] == ["early", "late"], "origin order, one per id, garbage left out"
    assert letters[0].error.at_ms == early.at_ms, "the first record of an id is kept"


def test_what_cannot_go_back_says_why() -> None:
    digest = raw_digest(b"x" * 10_000)
    too_big = dead("big", raw_value_b64=None, raw_value_digest=digest)
    theirs = dead("produced", reason="record_too_large")
    failing = dead("again", redrives=3)

    assert too_big.status() == "no_bytes" and "digest only" in too_big.why_not()
    assert theirs.status() == "not_an_input"
    assert failing.status() == "quarantined" and "after 3 re-drives" in failing.why_not()
    assert failing.status(max_redrives=4) == "redrivable"


def test_a_plan_sends_each_dead_letter_once_with_its_next_count() -> None:
    letters = [
        dead("new"),
        dead("done", offset=1),
        dead("twice", offset=2, redrives=2),
        dead("old", redrives=3),
    ]
    redriven = {"done": [Redriven("done", 1, "prod.agent.events", 0, 40, 0)]}

    steps = plan(letters, catalog=CATALOG, redriven=redriven)

    assert [(s.dead.id, s.action, s.count) for s in steps] == [
        ("new", "send", 1),
        ("done", "already", 1),
        ("twice", "send", 3),
        ("old", "quarantined", 3),
    ]
    assert steps[1].why == "already re-driven: prod.agent.events/0@40"


def test_a_dead_letter_goes_back_to_its_logical_origin_under_this_prefix() -> None:
    assert target_topic(dead("a", topic="prod.agent.results"), CATALOG) == RESULTS
    assert target_topic(dead("b", topic="old.agent.events"), CATALOG) == EVENTS
    assert target_topic(dead("c", topic="prod.agent.events.sharded"), CATALOG) == EVENTS_SHARDED
    copy = encode(AgentEnvelope(payload="e", entity_key="hot#2"))
    assert target_topic(dead("d", key=b"hot#2", value=copy), CATALOG) == EVENTS_SHARDED, "ShardKeys' copy"
    (step,) = plan([dead("e", topic="elsewhere")], catalog=CATALOG, redriven={})
    assert step.action == "not_an_input" and "not in the catalog" in step.why


def test_the_search_for_earlier_redrives_reads_only_the_keys_partitions() -> None:
    partitions = CATALOG[EVENTS].partitions
    space = search_space([dead("a", key=b"k1"), dead("b", key=b"k2")], CATALOG)
    assert space == {
        "prod.agent.events": {expected_partition(b"k1", partitions), expected_partition(b"k2", partitions)}
    }
    assert search_space([dead("a"), dead("b", key=None)], CATALOG) == {"prod.agent.events": None}


def test_a_redriven_records_dead_letter_carries_its_count_and_old_records_still_decode() -> None:
    headers = [(REDRIVE_OF_HEADER, b"dl-1"), (REDRIVES_HEADER, b"2"), ("trace", b"t")]
    message = SimpleNamespace(
        topic="prod.agent.events", partition=1, offset=7, key=b"k", value=b"v", headers=headers
    )

    record = InputRecord.of(EVENTS, message)
    error = decode(error_emit(record, "activation_error", "boom", now_ms=1).value, ErrorRecord)

    assert record.origin is None, "a re-drive is an original"
    assert (error.redrives, error.redriven_from) == (2, "dl-1")
    assert error.origin == RecordOrigin(topic="prod.agent.events", partition=1, offset=7)
    plain = error_emit(
        InputRecord.of(EVENTS, SimpleNamespace(**{**vars(message), "headers": []})),
        "activation_error",
        "boom",
        now_ms=1,
    )
    assert b"redrive" not in plain.value, "omitted by default: older readers see the same record"
    assert decode(plain.value, ErrorRecord).redrives == 0


def test_a_copy_of_a_redriven_record_keeps_its_count() -> None:
    headers = [
        (ORIGIN_HEADER, b"prod.agent.events/3/9"),
        (REDRIVE_OF_HEADER, b"dl-1"),
        (REDRIVES_HEADER, b"1"),
    ]
    message = SimpleNamespace(
        topic="prod.agent.events.sharded", partition=0, offset=2, key=b"k#0", value=b"v", headers=headers
    )

    record = InputRecord.of(EVENTS_SHARDED, message)

    assert record.origin == ("prod.agent.events", 3, 9)
    assert record.redrive == ("dl-1", 1)
