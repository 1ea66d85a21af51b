"""Poison, oversize and forged records mixed into a kill -9 chaos run: each one becomes exactly
one dead letter, nothing wedges, and the good events keep exactly once in effect.

Two workers and an effector run the counter agent (tests.agents.counter) as real processes
while the real `kcat` produces a paced stream of good events and a seeded schedule kill -9s
one of the three at a time (tests/chaos/harness.py). At seeded instants of that schedule an
aiokafka producer writes bad records to every input topic: malformed and wrongly shaped
records, a non-UTF-8 key, a null key, empty and null values, a malformed event over 1.5 MiB
(its dead letter cannot carry its bytes: digest and prefix) and a 1.5 MB event the agent
cannot hold in memory, forged results and approvals for keys nobody suspended, intents for a
tool that does not exist and, with signatures on, unsigned and badly signed ones (a non-ASCII
signature among them). A seeded third of them land on another partition than their key's,
so the re-route path carries them too. Their keys (``bad-...``) never meet the good events'.

Then everything tests/chaos/harness.py checks for the good events holds (one output per
event, counters 1, 2, ..., one tool run per event, every input partition committed to its
end, agent.approvals included), and agent.errors holds exactly the dead letters the bad
records call for: one per bad record, found by its origin (topic, partition, offset as the
producer reported them), with the reason docs/runtime.md's table gives, its entity key and
intent id, and its raw bytes (or, when too large, their size, sha256 and first 4 KiB). A
dead letter's id may repeat only byte for byte, as outputs' ids may. The intent for the
missing tool has no dead letter of its own: the effector answers it REJECTED, and that
result, which no continuation waits for, is the ``orphaned_result``. Nothing else may be on
agent.errors.

CHAOS_SIGNATURES=require (the default here) runs every process with a signing key and all
three signature modes on ``require``; CHAOS_SIGNATURES=off runs keylane's defaults, where
the unsigned records are orphans like the signed ones (and the forged intents for the real
tool are left out: with signatures off the effector runs them, as documented). To replay a
failure, set the CHAOS_* variables the failure message prints.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hashlib
import json
import os
import random
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import msgspec
import pytest
from aiokafka import AIOKafkaProducer

from keylane import ids
from keylane.catalog import APPROVALS, ERRORS, EVENTS, INTENTS, RESULTS, Catalog
from keylane.config import Settings
from keylane.kafka.partitioner import expected_partition
from keylane.kafka.topic_reader import TopicRecord, read_to_end
from keylane.records import ID_HEADER, RAW_PREFIX_BYTES, origin_of
from keylane.signing import Keyring
from keylane.wire import Approval, ErrorRecord, MalformedRecord, RawDigest, ToolIntent, ToolResult, decode
from tests.agents.counter import TOOL
from tests.chaos.harness import (
    VARIANTS,
    EndState,
    PacedKcat,
    Plan,
    Poll,
    Supervisor,
    Violations,
    check,
    counter_processes,
    input_groups,
    read_end_state,
    wait_for_commits,
    wait_for_outputs,
)
from tests.processes import process_env

_SEED = int(os.environ.get("CHAOS_SEED", "1"))
_EVENTS = int(os.environ.get("CHAOS_EVENTS", "300"))
_KEYS = int(os.environ.get("CHAOS_KEYS", "40"))
_KILLS = int(os.environ.get("CHAOS_KILLS", "6"))
_SIGNATURES = os.environ.get("CHAOS_SIGNATURES", "require")
TIMEOUT_S = 600 + 40 * _KILLS + _EVENTS // 10
OUTPUTS_TIMEOUT_S = 180 + _EVENTS / 20
LETTERS_TIMEOUT_S = 120.0
COMMITS_TIMEOUT_S = 120.0
TOOL_TIMEOUT_S = "5"  # the effector's claim lease is this + 30 s: a killed claim waits that long
SIGNING_KEYS = "chaos-1:bad-input-chaos-secret"
FORGED_KEYS = "chaos-1:not-the-deployment-secret"  # the same key id, another secret
OVERSIZE_MALFORMED_BYTES = 1_900_000  # base64 makes its dead letter ~2.5 MB: over the 2 MiB limit
OVERSIZE_EVENT_BYTES = 1_500_000  # over the 1 MiB memory cap the counter agent writes it into
WRONG_PARTITION_SHARE = 0.3
VARIANT = VARIANTS[0]  # kcat's own partitioner: the good events are re-routed too

pytestmark = [pytest.mark.kafka, pytest.mark.chaos]

Origin = tuple[str, int, int]


# --- the bad records -------------------------------------------------------------------------


@dataclass(frozen=True)
class Bad:
    """One bad record to produce and the dead letter it calls for (docs/runtime.md, "Reasons
    on agent.errors"). ``answered`` marks an intent whose dead letter is the orphaned
    ToolResult the effector answers it with, not a letter of its own."""

    name: str
    topic: str  # logical catalog name
    key: bytes | None
    value: bytes | None
    reason: str
    detail: str  # the dead letter's detail contains this
    entity_key: str | None = None
    intent_id: str | None = None
    digest: bool | None = False  # True: raw value as digest + prefix; None: either form
    answered: bool = False
    slot: int = 0  # the stretch of the schedule it is produced in
    partition: int = 0


@dataclass(frozen=True)
class BadPlan:
    records: tuple[Bad, ...]
    at: tuple[float, ...]  # per slot: when in its pause the slot's records are produced (share)

    @classmethod
    def build(cls, *, seed: int, catalog: Catalog, slots: int, signatures: str) -> BadPlan:
        """The bad records of ``seed``, each with a seeded slot and partition (its key's, or
        another one in WRONG_PARTITION_SHARE of the cases). Draws from its own Random, so the
        good events and kills of the same seed stay those of the other chaos tests."""
        rng = random.Random(f"bad-input-{seed}")
        records = [
            dataclasses.replace(
                bad,
                slot=rng.randrange(slots),
                partition=_partition(bad.key, catalog[bad.topic].partitions, rng),
            )
            for bad in _bad_records(seed, signatures, rng)
        ]
        limit = catalog[EVENTS].max_message_bytes
        assert all(len(b.value or b"") + 1024 < limit for b in records), (
            "harness: a bad record over the limit"
        )
        return cls(tuple(records), tuple(round(rng.uniform(0.1, 0.9), 2) for _ in range(slots)))

    def in_slot(self, slot: int) -> list[Bad]:
        return [b for b in self.records if b.slot == slot]

    def describe(self) -> str:
        by_topic = Counter(b.topic for b in self.records)
        return (
            f"bad_records={len(self.records)} ({', '.join(f'{t}: {n}' for t, n in sorted(by_topic.items()))})"
        )


def _partition(key: bytes | None, partitions: int, rng: random.Random) -> int:
    wrong = rng.random() < WRONG_PARTITION_SHARE
    if key is None:
        return rng.randrange(partitions)
    home = expected_partition(key, partitions)
    return (home + 1 + rng.randrange(partitions - 1)) % partitions if wrong else home


class _Forger:
    """Builds the bad records of one seed: keys ``bad-<seed>-<name>``, deterministic intent ids."""

    def __init__(self, seed: int, *, signatures_on: bool) -> None:
        self.seed = seed
        self.on = signatures_on
        self.keyring = Keyring.parse(SIGNING_KEYS)
        self.forged = Keyring.parse(FORGED_KEYS)

    def key(self, name: str) -> str:
        return f"bad-{self.seed}-{name}"

    def intent_id(self, name: str) -> str:
        return str(uuid.uuid5(uuid.NAMESPACE_URL, f"keylane-bad-input-chaos/{self.seed}/{name}"))

    def malformed(
        self,
        name: str,
        topic: str,
        value: bytes | None,
        detail: str,
        *,
        key: bytes | Literal["own"] | None = "own",
        intent_id: str | None = None,
        digest: bool | None = False,
    ) -> Bad:
        raw_key = self.key(name).encode() if key == "own" else key
        return Bad(
            name, topic, raw_key, value, "malformed_record", detail, intent_id=intent_id, digest=digest
        )

    def orphan(self, name: str, topic: str, value: bytes, *, answered: bool = False) -> Bad:
        """A result or approval (or, ``answered``, the intent whose result is one) for a key
        nobody suspended: no continuation waits for it."""
        return Bad(
            name,
            topic,
            self.key(name).encode(),
            value,
            "orphaned_result",
            "no_continuation",
            entity_key=self.key(name),
            intent_id=self.intent_id(name),
            answered=answered,
        )

    def refused(self, name: str, topic: str, value: bytes, verdict: str) -> Bad:
        """An unsigned or badly signed result/approval: refused under require, an orphan off."""
        if not self.on:
            return self.orphan(name, topic, value)
        kind = "result" if topic == RESULTS else "approval"
        key = self.key(name)
        return Bad(name, topic, key.encode(), value, f"unsigned_{kind}", verdict, entity_key=key)

    def result(self, name: str, *, entity_key: str | None = None) -> ToolResult:
        return ToolResult(
            intent_id=self.intent_id(name),
            entity_key=entity_key or self.key(name),
            status="OK",
            result_json='{"forged":true}',
            completed_at_ms=1,
        )

    def approval(self, name: str) -> Approval:
        return Approval(
            intent_id=self.intent_id(name), entity_key=self.key(name), approved=True, approver="mallory"
        )

    def intent(self, name: str, tool: str, *, entity_key: str | None = None) -> ToolIntent:
        now_ms = int(time.time() * 1000)
        return ToolIntent(
            intent_id=self.intent_id(name),
            entity_key=entity_key or self.key(name),
            seq=0,
            step_index=0,
            tool=tool,
            args_json=json.dumps({"key": self.key(name), "event": f"{self.key(name)}-forged", "count": 1}),
            created_at_ms=now_ms,
            expires_at_ms=now_ms + 24 * 3600 * 1000,
        )

    def signed(self, record: msgspec.Struct) -> bytes:
        return msgspec.json.encode(self.keyring.sign(record))

    def forged_signature(self, record: msgspec.Struct) -> bytes:
        """Signed by the deployment's key id with another secret."""
        return msgspec.json.encode(self.forged.sign(record))

    @staticmethod
    def non_ascii_signature(record: msgspec.Struct) -> bytes:
        """The deployment's key id and a signature of non-ASCII characters (issue 12, item 1:
        hmac.compare_digest raised TypeError on those and wedged the record's lane)."""
        return msgspec.json.encode(msgspec.structs.replace(record, key_id="chaos-1", signature="ü" * 64))


def _envelope(**fields: object) -> bytes:
    return json.dumps({"v": 1, **fields}, separators=(",", ":")).encode()


def _bad_records(seed: int, signatures: str, rng: random.Random) -> list[Bad]:
    """Every bad record of the run, in a fixed order (their slots are drawn afterwards)."""
    f = _Forger(seed, signatures_on=signatures == "require")
    unsigned = msgspec.json.encode
    big = _envelope(payload="big-" + "x" * (OVERSIZE_EVENT_BYTES - 40))
    junk = b"\x00not json\xff" + rng.randbytes(OVERSIZE_MALFORMED_BYTES - 10)
    records = [
        # agent.events, read by the worker: KeyRuntime.handle / _parse, service/keylane/wire.py decode
        f.malformed(
            "event-malformed-json", EVENTS, b'{"v":1,"payload":"unterminated', "not a valid AgentEnvelope"
        ),
        f.malformed(
            "event-non-utf8-key",
            EVENTS,
            _envelope(payload="x"),
            "record key is not UTF-8",
            key=b"\xff\xfe" + f.key("utf8").encode(),
        ),
        f.malformed("event-no-key", EVENTS, _envelope(payload="x"), "record has no key", key=None),
        f.malformed(
            "event-wrong-type", EVENTS, _envelope(payload="x", entity_key=7), "not a valid AgentEnvelope"
        ),
        f.malformed("event-json-array", EVENTS, b'[1,"payload"]', "not a valid AgentEnvelope"),
        f.malformed("event-unknown-version", EVENTS, b'{"v":9,"payload":"x"}', "unknown schema version 9"),
        f.malformed(
            "event-other-entity-key",
            EVENTS,
            _envelope(payload="x", entity_key="acct-000"),
            "differs from the record key",
        ),
        f.malformed(
            "event-bad-base64",
            EVENTS,
            _envelope(payload_b64="%%%not-base64"),
            "payload_b64 is not valid base64",
        ),
        f.malformed("event-empty-value", EVENTS, b"", "not a valid AgentEnvelope"),
        f.malformed("event-null-value", EVENTS, None, "record has no value"),
        f.malformed("event-oversize-malformed", EVENTS, junk, "not a valid AgentEnvelope", digest=True),
        Bad(
            "event-oversize-for-memory",
            EVENTS,
            f.key("big").encode(),
            big,
            "activation_error",
            "MemoryOverflow",
            entity_key=f.key("big"),
            digest=None,
        ),
        # agent.results, read by the worker: the signature check, then KeyRuntime._admission
        f.malformed("result-malformed", RESULTS, b"\x80\x81 not a result", "not a valid ToolResult"),
        f.malformed(
            "result-other-entity-key",
            RESULTS,
            f.signed(f.result("result-other-entity-key", entity_key="acct-001")),
            "differs from the record key",
        ),
        f.orphan(
            "result-signed-no-continuation", RESULTS, f.signed(f.result("result-signed-no-continuation"))
        ),
        f.refused("result-unsigned", RESULTS, unsigned(f.result("result-unsigned")), "unsigned"),
        f.refused(
            "result-forged-signature",
            RESULTS,
            f.forged_signature(f.result("result-forged-signature")),
            "bad_signature",
        ),
        # agent.approvals, read by the worker
        f.malformed("approval-malformed", APPROVALS, b'{"v":1,"intent_id":', "not a valid Approval"),
        f.orphan("approval-signed", APPROVALS, f.signed(f.approval("approval-signed"))),
        f.refused("approval-unsigned", APPROVALS, unsigned(f.approval("approval-unsigned")), "unsigned"),
        f.refused(
            "approval-non-ascii-signature",
            APPROVALS,
            f.non_ascii_signature(f.approval("approval-non-ascii-signature")),
            "bad_signature",
        ),
        # agent.intents, read by the effector: service/keylane/stages/effector/handler.py
        f.malformed("intent-malformed", INTENTS, b"{not an intent}", "not a valid ToolIntent"),
        f.malformed(
            "intent-other-entity-key",
            INTENTS,
            f.signed(f.intent("intent-other-entity-key", TOOL, entity_key="acct-002")),
            "is not the intent's entity_key",
            intent_id=f.intent_id("intent-other-entity-key"),
        ),
        f.orphan(
            "intent-missing-tool",
            INTENTS,
            f.signed(f.intent("intent-missing-tool", "no_such_tool")),
            answered=True,
        ),
    ]
    if f.on:  # with signatures off the effector runs these, as documented: no bad records then
        for name, value, verdict in (
            ("intent-unsigned", unsigned(f.intent("intent-unsigned", TOOL)), "unsigned"),
            (
                "intent-non-ascii-signature",
                f.non_ascii_signature(f.intent("intent-non-ascii-signature", TOOL)),
                "bad_signature",
            ),
        ):
            records.append(
                Bad(
                    name,
                    INTENTS,
                    f.key(name).encode(),
                    value,
                    "unsigned_intent",
                    verdict,
                    intent_id=f.intent_id(name),
                )
            )
    return records


# --- producing them, and the dead letters they call for --------------------------------------


@dataclass(frozen=True)
class Injected:
    bad: Bad
    origin: Origin  # (broker topic, partition, offset), as the producer reported it


@dataclass(frozen=True)
class Letter:
    """A dead letter the run must end with, at one origin, and the raw bytes it must carry."""

    name: str
    origin: Origin
    reason: str
    detail: str
    entity_key: str | None
    intent_id: str | None
    key: bytes | None
    value: bytes | None
    digest: bool | None


def signature_env(mode: str) -> dict[str, str]:
    """The processes' signature settings for CHAOS_SIGNATURES (service/keylane/config.py)."""
    assert mode in ("require", "off"), f"CHAOS_SIGNATURES must be require or off, not {mode!r}"
    modes = {f"KEYLANE_{kind}_SIGNATURES": mode for kind in ("INTENT", "APPROVAL", "RESULT")}
    return {"KEYLANE_SIGNING_KEYS": SIGNING_KEYS if mode == "require" else "", **modes}


async def produce_bad(producer: AIOKafkaProducer, catalog: Catalog, bad: Bad) -> Injected:
    topic = catalog.name(bad.topic)
    metadata = await producer.send_and_wait(topic, key=bad.key, value=bad.value, partition=bad.partition)
    return Injected(bad, (topic, metadata.partition, metadata.offset))


def _intent_of(record: TopicRecord) -> str | None:
    try:
        return decode(record.value, ToolResult).intent_id
    except MalformedRecord:
        return None


def answers_of(bad: Bad, results: list[TopicRecord]) -> list[TopicRecord]:
    """The results on agent.results the effector answered a bad intent with (originals only:
    a copy the worker re-routed shares its original's dead letter)."""
    return [r for r in results if origin_of(r.headers) is None and _intent_of(r) == bad.intent_id]


def expected_letters(
    injected: Iterable[Injected], results: list[TopicRecord], results_topic: str
) -> dict[Origin, Letter]:
    """Every dead letter the run must end with, by origin: one per bad record, and for an
    intent the effector answers, one per answer on agent.results (each one is an input the
    worker reads and finds no continuation for; a republished answer is one more)."""
    letters: dict[Origin, Letter] = {}
    for item in injected:
        bad = item.bad
        sources = (
            [(item.origin, bad.name, bad.key, bad.value)]
            if not bad.answered
            else [
                (
                    (results_topic, r.partition, r.offset),
                    f"{bad.name}'s answer p{r.partition}@{r.offset}",
                    r.key,
                    r.value,
                )
                for r in answers_of(bad, results)
            ]
        )
        for origin, name, key, value in sources:
            letters[origin] = Letter(
                name, origin, bad.reason, bad.detail, bad.entity_key, bad.intent_id, key, value, bad.digest
            )
    return letters


def _origin(error: ErrorRecord) -> Origin | None:
    o = error.origin
    return None if o is None else (o.topic, o.partition, o.offset)


async def wait_for_letters(
    settings: Settings, catalog: Catalog, injected: list[Injected], *, timeout_s: float, between: Poll = None
) -> list[str]:
    """Poll agent.errors (and agent.results, for the answered intents) until every dead
    letter the bad records call for is there; returns the ones still missing at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        results = await read_to_end(settings, catalog.name(RESULTS), timeout_s=120)
        letters = expected_letters(injected, results, catalog.name(RESULTS))
        seen = set()
        for record in await read_to_end(settings, catalog.name(ERRORS), timeout_s=120):
            try:
                seen.add(_origin(decode(record.value, ErrorRecord)))
            except MalformedRecord:
                continue  # reported by the checks
        missing = [letter.name for origin, letter in letters.items() if origin not in seen]
        missing += [
            i.bad.name + " (never answered)"
            for i in injected
            if i.bad.answered and not answers_of(i.bad, results)
        ]
        if not missing or time.monotonic() > deadline:
            return missing
        await asyncio.sleep(1.0)
        if between is not None:
            await between()


# --- the checks of the dead letters ----------------------------------------------------------


def check_letters(
    letters: dict[Origin, Letter], errors: list[TopicRecord], found: Violations
) -> list[TopicRecord]:
    """Each expected dead letter is on agent.errors exactly once by id (a repeat byte for byte
    the same), as its bad record calls for. Returns the error records that are no bad record's
    dead letter: the harness's check reports each of those."""
    at: dict[Origin, list[tuple[TopicRecord, ErrorRecord]]] = defaultdict(list)
    rest: list[TopicRecord] = []
    for record in errors:
        try:
            error = decode(record.value, ErrorRecord)
        except MalformedRecord:
            rest.append(record)
            continue
        origin = _origin(error)
        if origin in letters:
            at[origin].append((record, error))
        else:
            rest.append(record)
    repeats = 0
    forms: dict[str, str] = {}
    for origin, letter in sorted(letters.items()):
        where = f"{letter.name} at {origin[0]}/{origin[1]}@{origin[2]}"
        got = at.get(origin, [])
        if not got:
            found.add("bad record without a dead letter", where)
            continue
        by_id: dict[str, list[tuple[TopicRecord, ErrorRecord]]] = defaultdict(list)
        for record, error in got:
            by_id[error.error_id].append((record, error))
        if len(by_id) > 1:
            shown = "; ".join(f"id {i}: {c[0][1].reason} ({c[0][1].detail[:100]})" for i, c in by_id.items())
            found.add("bad record with several dead letters", f"{where}: {shown}")
        for error_id, copies in by_id.items():
            repeats += len(copies) - 1
            # A bad record leaves no key state behind, so one re-read after a kill is decided
            # again: its dead letter repeats under the same id (records.py: "a duplicate that
            # consumers can recognise") stamped with the time of that decision. Everything
            # but ``at_ms`` must be the same.
            if len({msgspec.json.encode(msgspec.structs.replace(e, at_ms=0)) for _, e in copies}) > 1:
                found.add(
                    "dead letter id repeated with different contents",
                    f"{where}: id {error_id} x{len(copies)} differ in {_differing_fields(copies)} "
                    f"(at p{'/p'.join(f'{r.partition}@{r.offset}' for r, _ in copies)})",
                )
            record, error = copies[0]
            for problem in _letter_problems(letter, record, error):
                found.add("dead letter not as its bad record calls for", f"{where}: {problem}")
            if letter.value is not None and len(letter.value) > RAW_PREFIX_BYTES:
                form = "digest" if error.raw_value_digest is not None else "whole"
                forms[letter.name] = f"{len(letter.value)} bytes, {form}, record_bytes={error.record_bytes}"
    found.figures["dead_letters_expected"] = len(letters)
    found.figures["dead_letter_records"] = sum(len(v) for v in at.values())
    found.figures["dead_letters_repeated"] = repeats
    found.figures["oversize_dead_letters"] = forms
    return rest


def _differing_fields(copies: list[tuple[TopicRecord, ErrorRecord]]) -> list[str]:
    bodies = [json.loads(r.value or b"{}") for r, _ in copies]
    names = sorted(set().union(*bodies))
    return [n for n in names if len({json.dumps(b.get(n), sort_keys=True) for b in bodies}) > 1]


def _letter_problems(letter: Letter, record: TopicRecord, error: ErrorRecord) -> list[str]:
    problems = []
    if error.reason != letter.reason:
        problems.append(f"reason {error.reason!r}, expected {letter.reason!r} (detail: {error.detail[:300]})")
    elif error.error_id != ids.error_id(*letter.origin, letter.reason):
        problems.append(f"id {error.error_id} is not the deterministic id of its origin and reason")
    if letter.detail not in error.detail:
        problems.append(f"detail {error.detail[:300]!r} does not say {letter.detail!r}")
    if record.headers.get(ID_HEADER) != error.error_id.encode():
        problems.append(f"{ID_HEADER} header {record.headers.get(ID_HEADER)!r} is not its error_id")
    if (error.entity_key, error.intent_id) != (letter.entity_key, letter.intent_id):
        problems.append(
            f"entity_key/intent_id {error.entity_key!r}/{error.intent_id!r}, "
            f"expected {letter.entity_key!r}/{letter.intent_id!r}"
        )
    if record.key != (letter.key or b""):
        problems.append(f"record key {record.key!r}, expected {letter.key!r}")
    for what, text, digest, raw, want in (
        ("key", error.raw_key_b64, error.raw_key_digest, letter.key, False),
        ("value", error.raw_value_b64, error.raw_value_digest, letter.value, letter.digest),
    ):
        problem = _raw_problem(text, digest, raw, want_digest=want)
        if problem is not None:
            problems.append(f"raw {what}: {problem}")
    if error.raw_value_digest is not None and not (
        error.record_bytes is not None
        and error.limit_bytes is not None
        and error.record_bytes > error.limit_bytes
    ):
        problems.append(
            f"a digest without record_bytes over limit_bytes ({error.record_bytes}, {error.limit_bytes})"
        )
    return problems


def _raw_problem(
    text: str | None, digest: RawDigest | None, raw: bytes | None, *, want_digest: bool | None
) -> str | None:
    """What is wrong with how a dead letter carries ``raw`` (whole, base64; or as a digest)."""
    if raw is None:
        return None if text is None and digest is None else "carried for a null"
    if text is not None and digest is not None:
        return "carried both whole and as a digest"
    if text is not None:
        if want_digest is True:
            return f"carried whole ({len(raw)} bytes), expected a digest"
        decoded = base64.b64decode(text, validate=True)
        return None if decoded == raw else f"{len(decoded)} bytes that differ from the {len(raw)} produced"
    if digest is None:
        return "neither carried nor digested"
    if want_digest is False:
        return f"a digest of {digest.size} bytes, expected the bytes whole"
    wrong = []
    if digest.size != len(raw):
        wrong.append(f"size {digest.size} != {len(raw)}")
    if digest.sha256 != hashlib.sha256(raw).hexdigest():
        wrong.append(f"sha256 {digest.sha256} is not the produced bytes'")
    if base64.b64decode(digest.prefix_b64) != raw[:RAW_PREFIX_BYTES]:
        wrong.append(f"the prefix is not the first {RAW_PREFIX_BYTES} bytes produced")
    return "; ".join(wrong) or None


def check_answers(injected: list[Injected], results: list[TopicRecord], found: Violations) -> None:
    """An intent for a tool nobody registered is answered REJECTED, the same bytes however
    often the effector answers it."""
    for item in injected:
        if not item.bad.answered:
            continue
        answers = answers_of(item.bad, results)
        found.figures[f"answers_to_{item.bad.name}"] = len(answers)
        if not answers:
            found.add("forged intent never answered", item.bad.name)
            continue
        if len({r.value for r in answers}) > 1:
            found.add(
                "forged intent answered with different bytes", f"{item.bad.name}: {len(answers)} answers"
            )
        result = decode(answers[0].value, ToolResult)
        if result.status != "REJECTED" or "no tool named" not in (result.error or ""):
            found.add(
                "forged intent not answered REJECTED", f"{item.bad.name}: {result.status} {result.error}"
            )


def without_bad(
    state: EndState, injected: list[Injected], catalog: Catalog, errors: list[TopicRecord]
) -> EndState:
    """The end state as the good events left it: the bad records and keylane's copies of them
    (``keylane.origin``) off the input topics, and ``errors`` on agent.errors."""
    positions = {i.origin for i in injected}

    def good(records: list[TopicRecord], topic: str) -> list[TopicRecord]:
        return [
            r
            for r in records
            if (catalog.name(topic), r.partition, r.offset) not in positions
            and origin_of(r.headers) not in positions
        ]

    return dataclasses.replace(
        state, events=good(state.events, EVENTS), intents=good(state.intents, INTENTS), errors=errors
    )


# --- the run ---------------------------------------------------------------------------------


@pytest.mark.timeout(TIMEOUT_S)
async def test_kill_9_chaos_with_poison_oversize_and_forged_records_dead_letters_each_once(
    settings: Settings, catalog: Catalog, tmp_path: Path
) -> None:
    plan = Plan.build(seed=_SEED, events=_EVENTS, keys=_KEYS, kills=_KILLS, shards=None)
    bad_plan = BadPlan.build(seed=_SEED, catalog=catalog, slots=len(plan.chunks), signatures=_SIGNATURES)
    header = (
        f"bad-input chaos signatures={_SIGNATURES} {plan.describe()}; {bad_plan.describe()}\n"
        f"replay: CHAOS_SEED={plan.seed} CHAOS_EVENTS={len(plan.events)} CHAOS_KEYS={_KEYS} "
        f"CHAOS_KILLS={len(plan.kills)} CHAOS_SIGNATURES={_SIGNATURES} pytest {__file__}\n"
        f"logs: {tmp_path}; topics: {settings.topic_prefix}agent.*; group: {settings.app_id}"
    )
    print(header, flush=True)
    tool_ledger, llm_ledger = tmp_path / "tools.jsonl", tmp_path / "llm.jsonl"
    env = process_env(
        settings, TOOL_LEDGER=str(tool_ledger), LLM_LEDGER=str(llm_ledger), **signature_env(_SIGNATURES)
    )
    processes = counter_processes(env, tmp_path, config_ref=VARIANT.config_ref, tool_timeout_s=TOOL_TIMEOUT_S)
    supervisor = Supervisor(processes)
    started = time.monotonic()
    for name in processes:
        await supervisor.start(name)
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.bootstrap_list,
        acks="all",
        enable_idempotence=True,
        max_request_size=catalog[EVENTS].max_message_bytes,
    )
    await producer.start()
    injected: list[Injected] = []
    stream = PacedKcat(settings, catalog.name(EVENTS), VARIANT.partitioner, tmp_path / "kcat.log")
    try:
        for slot, chunk in enumerate(plan.chunks):
            kill = plan.kills[slot] if slot < len(plan.kills) else None
            pause = kill.pause_s if kill is not None else 2.0
            stream.flow(chunk, over_s=pause * 1.5 if kill is not None else 2.0)
            await asyncio.sleep(pause * bad_plan.at[slot])  # the schedule's instant, not a wait
            produced = [await produce_bad(producer, catalog, bad) for bad in bad_plan.in_slot(slot)]
            injected += produced
            print(
                f"{time.monotonic() - started:.1f}s slot {slot}: "
                + (
                    " ".join(f"{i.bad.name}@{i.origin[1]}/{i.origin[2]}" for i in produced)
                    or "no bad records"
                )
                + (f"; then kill -9 {kill.victim}" if kill is not None else ""),
                flush=True,
            )
            if kill is not None:
                await asyncio.sleep(pause * (1 - bad_plan.at[slot]))
                await supervisor.check_alive(restart=True)
                await supervisor.kill9_and_restart(kill.victim)
        await asyncio.to_thread(stream.finish)
    except BaseException:
        stream.kill()
        raise
    finally:
        await producer.stop()
    streamed_s = time.monotonic() - started

    keep_alive = supervisor.keep_alive  # a process that dies while the rest drains is restarted
    missing = await wait_for_outputs(settings, catalog, plan, timeout_s=OUTPUTS_TIMEOUT_S, between=keep_alive)
    unlettered = await wait_for_letters(
        settings, catalog, injected, timeout_s=LETTERS_TIMEOUT_S, between=keep_alive
    )
    groups = input_groups(settings, catalog, sharded=False)
    groups[settings.app_id].append(catalog.name(APPROVALS))  # forged approvals must not stall it
    lags = await wait_for_commits(settings, groups, timeout_s=COMMITS_TIMEOUT_S, between=keep_alive)
    await supervisor.check_alive(restart=False)
    supervisor.stop()
    state = await read_end_state(settings, catalog, tool_ledger, llm_ledger, sharded=False)
    results = await read_to_end(settings, catalog.name(RESULTS), timeout_s=120)

    letters = expected_letters(injected, results, catalog.name(RESULTS))
    found = Violations()
    others = check_letters(letters, state.errors, found)
    check_answers(injected, results, found)
    good = check(plan, without_bad(state, injected, catalog, others), lags, sharded=False)
    for kind, examples in good.kinds.items():
        for example in examples:
            found.add(kind, example)
    found.figures.update(good.figures)
    for line in supervisor.unplanned:
        found.add("process exited or hung without being killed", line)
    found.figures["bad_records"] = len(injected)
    found.figures["bad_records_off_their_key's_partition"] = sum(
        1
        for i in injected
        if i.bad.key is not None
        and i.origin[1] != expected_partition(i.bad.key, catalog[i.bad.topic].partitions)
    )
    found.figures["dead_letter_reasons"] = dict(Counter(letter.reason for letter in letters.values()))
    found.figures["events_without_output_at_deadline"] = len(missing)
    found.figures["dead_letters_missing_at_deadline"] = len(unlettered)
    found.figures["stream_and_kills_s"] = round(streamed_s, 1)
    found.figures["total_s"] = round(time.monotonic() - started, 1)
    report = found.report(header)
    print(report, flush=True)
    assert not found, report
