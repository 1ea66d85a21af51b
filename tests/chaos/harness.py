"""The chaos run's pieces: a seeded plan, a paced kcat stream, and the checks of the end state.

Everything random comes from one ``random.Random(seed)``, drawn in a fixed order (first the
events, then the kill schedule), so a seed names one stream and one schedule. What the
processes do in between is up to the scheduler; the checks hold for every interleaving.

The checks are what a user of keylane can see, and each violation is reported, not just the
first: one output per event by deterministic id (duplicates byte-identical), per physical key
a counter that went 1, 2, …, n in the key's order, one tool execution per event, nothing
on agent.errors, and every consumer group committed up to the end of its inputs.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
import re
import shutil
import subprocess
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from keylane.catalog import ERRORS, EVENTS, EVENTS_SHARDED, INTENTS, OUTPUT, RESULTS, Catalog
from keylane.config import Settings
from keylane.kafka.topic_admin import admin_client
from keylane.kafka.topic_reader import TopicRecord, partition_ids, read_to_end
from keylane.keys import shard_key
from keylane.wire import AgentEnvelope, ErrorRecord, MalformedRecord, ToolIntent, decode
from tests.processes import KeylaneProcess, ProcessFailed

VICTIMS = ("worker-a", "worker-b", "effector")
Poll = Callable[[], Awaitable[None]] | None
EXAMPLES = 3  # examples shown per kind of violation


@dataclass(frozen=True)
class Variant:
    """How the stream is produced and how the agent is configured."""

    name: str
    partitioner: str | None  # kcat's topic.partitioner; None: librdkafka's consistent_random
    shards: int | None  # AgentConfig.shards (the counter agent's `sharded4` config)

    @property
    def config_ref(self) -> str:
        return "tests.agents.counter:sharded4" if self.shards else "tests.agents.counter:config"


VARIANTS = (
    Variant("librdkafka", None, None),
    Variant("murmur2", "murmur2_random", None),
    Variant("librdkafka-shards4", None, 4),
)


@dataclass(frozen=True)
class Kill:
    pause_s: float  # how long the stream flows before this kill
    victim: str


@dataclass(frozen=True)
class Event:
    key: str  # the logical key
    event_id: str  # f"{key}-e{i}", i counting the key's events from 0
    value: bytes  # the AgentEnvelope as produced
    physical: str  # the key the agent sees: the logical key, or key#i behind ShardKeys


@dataclass(frozen=True)
class Plan:
    seed: int
    events: tuple[Event, ...]
    kills: tuple[Kill, ...]
    chunks: tuple[tuple[Event, ...], ...]  # chunk k flows during pause k; the last one after

    @classmethod
    def from_env(cls, variant: Variant, env: dict[str, str] | None = None) -> Plan:
        """CHAOS_SEED (default 1), CHAOS_EVENTS (300), CHAOS_KEYS (40), CHAOS_KILLS (10)."""
        env = dict(os.environ) if env is None else env
        return cls.build(
            seed=int(env.get("CHAOS_SEED", "1")),
            events=int(env.get("CHAOS_EVENTS", "300")),
            keys=int(env.get("CHAOS_KEYS", "40")),
            kills=int(env.get("CHAOS_KILLS", "10")),
            shards=variant.shards,
        )

    @classmethod
    def build(cls, *, seed: int, events: int, keys: int, kills: int, shards: int | None) -> Plan:
        rng = random.Random(seed)
        names = [f"acct-{i:03d}" for i in range(keys)]
        per_key: Counter[str] = Counter()
        stream: list[Event] = []
        for _ in range(events):
            key = rng.choice(names)
            event_id = f"{key}-e{per_key[key]}"
            per_key[key] += 1
            # The envelope as any producer writes it (service/keylane/wire.py AgentEnvelope).
            value = json.dumps({"v": 1, "payload": event_id}, separators=(",", ":")).encode()
            physical = key if shards is None else shard_key(key.encode(), shards, payload=value).decode()
            stream.append(Event(key, event_id, value, physical))
        schedule = tuple(Kill(round(rng.uniform(0.5, 4.0), 2), rng.choice(VICTIMS)) for _ in range(kills))
        bounds = [round(i * events / (kills + 1)) for i in range(kills + 2)]
        chunks = tuple(tuple(stream[a:b]) for a, b in itertools.pairwise(bounds))
        return cls(seed, tuple(stream), schedule, chunks)

    def by_id(self) -> dict[str, Event]:
        return {e.event_id: e for e in self.events}

    def describe(self) -> str:
        victims = Counter(k.victim for k in self.kills)
        return (
            f"seed={self.seed} events={len(self.events)} keys={len({e.key for e in self.events})} "
            f"physical_keys={len({e.physical for e in self.events})} kills={len(self.kills)} "
            f"({', '.join(f'{v}: {victims[v]}' for v in VICTIMS)}); "
            f"schedule: {' '.join(f'{k.pause_s}s->{k.victim}' for k in self.kills)}"
        )


class PacedKcat:
    """One `kcat -P` process fed through stdin, line by line, at the pace each chunk asks for.

    ``flow(chunk, over_s)`` queues a chunk to be written evenly over ``over_s`` seconds (after
    the chunks queued before it); ``finish`` closes stdin and waits for kcat to deliver all.
    kcat runs with idempotence on, so any duplicate on the topic is not the producer's.
    """

    def __init__(self, settings: Settings, topic: str, partitioner: str | None, log_path: Path) -> None:
        kcat = shutil.which("kcat")
        assert kcat is not None, "kcat is not installed: run 'make install' (it apt-get installs kcat)"
        argv = [kcat, "-P", "-b", settings.bootstrap_servers, "-t", topic, "-K", "\t"]
        argv += ["-X", "enable.idempotence=true"]
        if partitioner is not None:
            argv += ["-X", f"topic.partitioner={partitioner}"]
        self.argv = argv
        self._log = log_path.open("ab")
        self._proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=self._log, stderr=self._log)
        self._queue: list[tuple[tuple[Event, ...], float]] = []
        self._closing = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._write, name="paced-kcat", daemon=True)
        self._error: Exception | None = None
        self.written = 0
        self._thread.start()

    def flow(self, chunk: tuple[Event, ...], over_s: float) -> None:
        with self._cond:
            self._queue.append((chunk, over_s))
            self._cond.notify()

    def finish(self, timeout_s: float = 120.0) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), "the kcat feeder did not finish writing"
        assert self._error is None, f"feeding kcat failed: {self._error!r}"
        try:
            code = self._proc.wait(timeout=timeout_s)
        finally:
            self._log.close()
        assert code == 0, f"kcat exited with {code}: {' '.join(self.argv)}"

    def kill(self) -> None:
        """For a test that fails half-way: never leave kcat behind."""
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._log.close()

    def _write(self) -> None:
        stdin = self._proc.stdin
        assert stdin is not None
        try:
            while True:
                with self._cond:
                    while not self._queue and not self._closing:
                        self._cond.wait()
                    if not self._queue:
                        break
                    chunk, over_s = self._queue.pop(0)
                self._write_chunk(stdin, chunk, over_s)
        except Exception as exc:  # noqa: BLE001 - reported by finish()
            self._error = exc
        finally:
            stdin.close()

    def _write_chunk(self, stdin: IO[bytes], chunk: tuple[Event, ...], over_s: float) -> None:
        start = time.monotonic()
        for i, event in enumerate(chunk):
            stdin.write(event.key.encode() + b"\t" + event.value + b"\n")
            stdin.flush()
            self.written += 1
            due = start + over_s * (i + 1) / len(chunk)
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)


class Supervisor:
    """Starts, kills and restarts the run's processes. A process that dies on its own, or
    fails to start, is recorded with the exception its log ends with, and started again:
    the run goes on, and the crash is reported with everything else."""

    def __init__(self, processes: dict[str, KeylaneProcess], *, attempts: int = 3) -> None:
        self.processes = processes
        self.attempts = attempts
        self.unplanned: list[str] = []

    async def start(self, name: str) -> None:
        process = self.processes[name]
        for attempt in range(1, self.attempts + 1):
            try:
                await asyncio.to_thread(process.start)
                return
            except ProcessFailed:
                assert process.proc is not None
                if process.proc.poll() is None:
                    process.kill9()
                    self.unplanned.append(f"{name} was not ready in time (start attempt {attempt})")
                else:
                    self.unplanned.append(
                        f"{name} exited with {process.proc.returncode} while starting: {self.reason(name)}"
                    )
        raise AssertionError(f"{name} did not start in {self.attempts} attempts; see {process.log_path}")

    async def kill9_and_restart(self, name: str) -> None:
        self.processes[name].kill9()
        await self.start(name)

    async def keep_alive(self) -> None:
        await self.check_alive(restart=True)

    async def check_alive(self, *, restart: bool) -> None:
        """Record every process that exited by itself; start it again if ``restart``."""
        for name, process in self.processes.items():
            if process.proc is not None and process.proc.poll() is not None:
                self.unplanned.append(
                    f"{name} exited by itself with {process.proc.returncode}: {self.reason(name)}"
                )
                if restart:
                    await self.start(name)

    def stop(self) -> None:
        for process in self.processes.values():
            if process.proc is not None:
                process.stop()

    def reason(self, name: str) -> str:
        """The last exception line logged since the process was last started."""
        process = self.processes[name]
        text = process.log_since_start()
        errors = re.findall(r"^(?:\w+\.)*\w*(?:Error|Exception)\b.*$", text, flags=re.MULTILINE)
        return errors[-1].strip() if errors else f"no exception in its log ({process.log_path})"


# --- reading the end state -------------------------------------------------------------------


@dataclass
class EndState:
    """Everything the checks look at, read after the run."""

    outputs: list[TopicRecord]
    errors: list[TopicRecord]
    intents: list[TopicRecord]
    events: list[TopicRecord]
    sharded: list[TopicRecord]
    ledger: list[dict[str, Any]]
    ledger_unreadable: list[str]
    llm_calls: int


def read_ledger(path: Path) -> tuple[list[dict[str, Any]], list[str]]:
    if not path.exists():
        return [], []
    lines, unreadable = [], []
    for line in path.read_text().splitlines():
        try:
            lines.append(json.loads(line))
        except json.JSONDecodeError:
            unreadable.append(line)
    return lines, unreadable


async def read_end_state(
    settings: Settings, catalog: Catalog, tool_ledger: Path, llm_ledger: Path, *, sharded: bool
) -> EndState:
    async def topic(name: str) -> list[TopicRecord]:
        return await read_to_end(settings, catalog.name(name), timeout_s=120)

    ledger, unreadable = read_ledger(tool_ledger)
    return EndState(
        outputs=await topic(OUTPUT),
        errors=await topic(ERRORS),
        intents=await topic(INTENTS),
        events=await topic(EVENTS),
        sharded=await topic(EVENTS_SHARDED) if sharded else [],
        ledger=ledger,
        ledger_unreadable=unreadable,
        llm_calls=len(llm_ledger.read_text().splitlines()) if llm_ledger.exists() else 0,
    )


async def wait_for_outputs(
    settings: Settings, catalog: Catalog, plan: Plan, *, timeout_s: float, between: Poll = None
) -> set[str]:
    """Poll agent.output until every event of the plan has an output; returns the events still
    without one when the deadline passed (empty: all arrived). ``between`` runs between polls."""
    wanted = {e.event_id for e in plan.events}
    deadline = time.monotonic() + timeout_s
    while True:
        seen = set()
        for record in await read_to_end(settings, catalog.name(OUTPUT), timeout_s=120):
            try:
                seen.add(json.loads(record.value or b"")["event"])
            except (ValueError, KeyError, TypeError):
                continue  # an unreadable output is reported by the checks
        missing = wanted - seen
        if not missing or time.monotonic() > deadline:
            return missing
        await asyncio.sleep(1.0)
        if between is not None:
            await between()


@dataclass(frozen=True)
class Lag:
    group: str
    topic: str
    partition: int
    committed: int | None
    end: int

    def __str__(self) -> str:
        return f"group {self.group}: {self.topic}/{self.partition} committed {self.committed}, end {self.end}"


async def committed_lags(settings: Settings, groups: dict[str, list[str]]) -> list[Lag]:
    """Every (group, partition) whose committed offset is short of the log end. Committed
    offsets are read before the end offsets: a record produced by processing that was then
    committed is then always counted in the ends."""
    tps = {
        group: [TopicPartition(t, p) for t in topics for p in await partition_ids(settings, t)]
        for group, topics in groups.items()
    }
    committed: dict[str, dict[TopicPartition, int | None]] = {}
    async with admin_client(settings) as client:
        for group, parts in tps.items():
            offsets = await client.list_consumer_group_offsets(group, partitions=parts)
            committed[group] = {
                tp: (offsets[tp].offset if tp in offsets and offsets[tp].offset >= 0 else None)
                for tp in parts
            }
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.bootstrap_list, enable_auto_commit=False)
    await consumer.start()
    try:
        ends = await consumer.end_offsets([tp for parts in tps.values() for tp in parts])
    finally:
        await consumer.stop()
    return [
        Lag(group, tp.topic, tp.partition, offset, ends[tp])
        for group, by_tp in committed.items()
        for tp, offset in by_tp.items()
        if (offset or 0) < ends[tp]
    ]


async def wait_for_commits(
    settings: Settings, groups: dict[str, list[str]], *, timeout_s: float, between: Poll = None
) -> list[Lag]:
    """Poll until every group committed up to the end of every input partition; returns the
    partitions still lagging when the deadline passed (empty: all caught up). ``between``
    runs between polls."""
    deadline = time.monotonic() + timeout_s
    while True:
        lags = await committed_lags(settings, groups)
        if not lags or time.monotonic() > deadline:
            return lags
        await asyncio.sleep(1.0)
        if between is not None:
            await between()


# --- the checks ------------------------------------------------------------------------------


@dataclass
class Violations:
    """Violations by kind, each with its examples; ``figures`` are facts shown either way."""

    kinds: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    figures: dict[str, object] = field(default_factory=dict)

    def add(self, kind: str, example: str) -> None:
        self.kinds[kind].append(example)

    def __bool__(self) -> bool:
        return any(self.kinds.values())

    def counts(self) -> dict[str, int]:
        return {kind: len(examples) for kind, examples in self.kinds.items() if examples}

    def report(self, header: str) -> str:
        lines = [header, "figures: " + ", ".join(f"{k}={v}" for k, v in self.figures.items())]
        if not self:
            lines.append("no violations")
        for kind, examples in self.kinds.items():
            if not examples:
                continue
            lines.append(f"VIOLATION {kind}: {len(examples)}")
            lines.extend(f"    e.g. {example}" for example in examples[:EXAMPLES])
        return "\n".join(lines)


def _where(record: TopicRecord) -> str:
    return f"p{record.partition}@{record.offset}"


def _show(record: TopicRecord) -> str:
    return f"{_where(record)} key={record.key!r} value={(record.value or b'').decode(errors='replace')}"


def check(plan: Plan, state: EndState, lags: Iterable[Lag], *, sharded: bool) -> Violations:
    """Every user-visible guarantee of the run, each violation collected."""
    found = Violations()
    events = plan.by_id()
    physical_events: dict[str, list[str]] = defaultdict(list)  # in production order
    for event in plan.events:
        physical_events[event.physical].append(event.event_id)

    _check_inputs(plan, state, found)
    outputs = _check_outputs(state, events, found)
    _check_counts(outputs, physical_events, found, sharded=sharded)
    _check_ledger(state, events, found)
    _check_errors(state, found)
    for lag in lags:
        found.add("offsets not committed to the log end", str(lag))
    found.figures["model_calls"] = state.llm_calls
    return found


def _check_inputs(plan: Plan, state: EndState, found: Violations) -> None:
    """Figures on the input topics (copies keylane re-produced), and a harness self-check:
    kcat delivered every event exactly once (an original has no headers)."""
    originals = Counter(decode(r.value, AgentEnvelope).payload for r in state.events if not r.headers)
    assert originals == Counter(e.event_id for e in plan.events), (
        "harness: agent.events does not hold each planned event exactly once as kcat produced it"
    )
    copies = [r for r in state.events if r.headers]
    found.figures["events_recopied_on_agent.events"] = len(copies)
    if state.sharded:
        per_event = Counter(decode(r.value, AgentEnvelope).payload for r in state.sharded if not _rerouted(r))
        found.figures["sharded_records"] = len(state.sharded)
        found.figures["events_sharded_more_than_once"] = sum(1 for n in per_event.values() if n > 1)
    intents_per_event: dict[str, set[str]] = defaultdict(set)
    for record in state.intents:
        intent = decode(record.value, ToolIntent)
        intents_per_event[json.loads(intent.args_json)["event"]].add(intent.intent_id)
    found.figures["intent_records"] = len(state.intents)
    found.figures["events_with_several_intent_ids"] = sum(1 for s in intents_per_event.values() if len(s) > 1)


def _rerouted(record: TopicRecord) -> bool:
    return any("reroute" in name for name in record.headers)


@dataclass(frozen=True)
class Output:
    record_id: str
    record: TopicRecord
    body: dict[str, Any]


def _check_outputs(state: EndState, events: dict[str, Event], found: Violations) -> dict[str, Output]:
    """One output per event by deterministic id; duplicates of an id byte-identical. Returns
    one output per distinct id."""
    by_id: dict[str, list[TopicRecord]] = defaultdict(list)
    for record in state.outputs:
        try:
            by_id[record.record_id].append(record)
        except KeyError:
            found.add("output without a keylane.id header", _show(record))
    distinct: dict[str, Output] = {}
    ids_per_event: dict[str, list[str]] = defaultdict(list)
    for record_id, records in by_id.items():
        values = {r.value for r in records}
        if len(values) > 1:
            found.add(
                "output id with different values",
                f"id {record_id}: " + " | ".join(_show(r) for r in records),
            )
        first = records[0]
        try:
            body = json.loads(first.value or b"")
            event_id = body["event"]
        except (ValueError, KeyError, TypeError):
            found.add("unreadable output", _show(first))
            continue
        distinct[record_id] = Output(record_id, first, body)
        ids_per_event[event_id].append(record_id)
    found.figures["output_records"] = len(state.outputs)
    found.figures["output_ids"] = len(by_id)
    found.figures["output_records_repeating_an_id"] = len(state.outputs) - len(by_id)

    for event_id, record_ids in ids_per_event.items():
        if event_id not in events:
            found.add("output for an event never produced", f"{event_id}: {record_ids}")
            continue
        if len(record_ids) > 1:
            shown = "; ".join(f"id {i}: {_show(distinct[i].record)}" for i in record_ids)
            found.add("event with several output ids", f"{event_id}: {shown}")
        for record_id in record_ids:
            output = distinct[record_id]
            want = events[event_id].physical
            if output.body.get("key") != want or output.record.key != want.encode():
                found.add(
                    "output under another physical key than its event's",
                    f"{event_id} belongs to {want}: {_show(output.record)}",
                )
            if output.body.get("status") != "OK":
                found.add("output with a tool status other than OK", _show(output.record))
    for event_id in sorted(set(events) - set(ids_per_event)):
        found.add("event without an output", f"{event_id} (key {events[event_id].physical})")
    return distinct


def _check_counts(
    outputs: dict[str, Output], physical_events: dict[str, list[str]], found: Violations, *, sharded: bool
) -> None:
    """Per physical key, the counts over its distinct outputs are exactly 1..n (n = the key's
    events), and the events ordered by count are the key's events in production order."""
    per_key: dict[str, list[Output]] = defaultdict(list)
    for output in outputs.values():
        per_key[str(output.body.get("key"))].append(output)
    for key, expected in sorted(physical_events.items()):
        got = sorted(per_key.get(key, []), key=lambda o: (int(o.body.get("count", 0)), o.record.offset))
        counts = [int(o.body.get("count", 0)) for o in got]
        repeated = sorted(c for c, n in Counter(counts).items() if n > 1)
        gaps = sorted(set(range(1, len(expected) + 1)) - set(counts))
        beyond = sorted(c for c in set(counts) if not 1 <= c <= len(expected))
        if repeated:
            shown = "; ".join(
                f"count {c}: "
                + ", ".join(f"{o.body['event']} ({_where(o.record)})" for o in got if o.body["count"] == c)
                for c in repeated[:3]
            )
            found.add("count repeated on a physical key", f"{key}: repeats {repeated}; {shown}")
        if gaps:
            found.add("count gap on a physical key", f"{key}: missing counts {gaps} of 1..{len(expected)}")
        if beyond:
            found.add(
                "count beyond the key's number of events",
                f"{key}: counts {beyond} but only {len(expected)} events",
            )
        if not (repeated or gaps or beyond):
            order = [o.body["event"] for o in got]
            if order != expected:
                found.add("events counted out of the key's order", f"{key}: {order} != {expected}")
    if sharded:
        logical: dict[str, set[str]] = defaultdict(set)
        expected_logical: dict[str, set[str]] = defaultdict(set)
        for key, event_ids in physical_events.items():
            expected_logical[key.rpartition("#")[0]].update(event_ids)
        for output in outputs.values():
            logical[str(output.body.get("key")).rpartition("#")[0]].add(output.body["event"])
        for key, want in sorted(expected_logical.items()):
            if logical.get(key, set()) != want:
                found.add(
                    "a logical key's shards hold other events than its own",
                    f"{key}: missing {sorted(want - logical.get(key, set()))}, "
                    f"extra {sorted(logical.get(key, set()) - want)}",
                )


def _check_ledger(state: EndState, events: dict[str, Event], found: Violations) -> None:
    """Exactly one tool execution per event. Duplicates are told apart by what ran: one
    intent twice (the effector re-ran it), or several intents for one event (the event was
    activated more than once: no idempotency key can save that)."""
    intents_by_args: dict[tuple[str, str, int], set[str]] = defaultdict(set)
    for record in state.intents:
        intent = decode(record.value, ToolIntent)
        args = json.loads(intent.args_json)
        intents_by_args[(args["key"], args["event"], args["count"])].add(intent.intent_id)
    runs: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for line in state.ledger:
        runs[line["event"]].append(line)
    for raw in state.ledger_unreadable:
        found.add("unreadable tool ledger line", repr(raw))
    found.figures["tool_executions"] = len(state.ledger)
    found.figures["tool_got_intent_id"] = any(line.get("intent_id") for line in state.ledger)
    duplicates = 0
    for event_id, lines in sorted(runs.items()):
        if event_id not in events:
            found.add("side effect for an event never produced", json.dumps(lines[0]))
            continue
        if len(lines) == 1:
            continue
        duplicates += len(lines) - 1
        intents = [
            line.get("intent_id")
            or "|".join(sorted(intents_by_args.get((line["key"], line["event"], line["count"]), {"?"})))
            for line in lines
        ]
        shown = "; ".join(
            f"count={line['count']} key={line['key']} intent={intent} pid={line.get('pid')}"
            for line, intent in zip(lines, intents, strict=True)
        )
        kind = (
            "side effect ran twice for one intent"
            if len(set(intents)) == 1
            else "side effect ran for several intents of one event"
        )
        found.add(kind, f"{event_id} x{len(lines)}: {shown}")
    for event_id in sorted(set(events) - set(runs)):
        found.add("event whose side effect never ran", event_id)
    found.figures["duplicate_side_effects"] = duplicates


def _check_errors(state: EndState, found: Violations) -> None:
    reasons: Counter[str] = Counter()
    for record in state.errors:
        try:
            error = decode(record.value, ErrorRecord)
        except MalformedRecord:
            found.add("record on agent.errors", _show(record))
            continue
        reasons[error.reason] += 1
        origin = (
            f"{error.origin.topic}/{error.origin.partition}@{error.origin.offset}" if error.origin else "-"
        )
        found.add(
            "record on agent.errors",
            f"{error.reason}: {error.detail} (key {error.entity_key}, origin {origin})",
        )
    found.figures["error_reasons"] = dict(reasons) or "none"


def input_groups(settings: Settings, catalog: Catalog, *, sharded: bool) -> dict[str, list[str]]:
    """The consumer groups and the input topics they must commit to the end. The workers'
    group is the app id; behind ShardKeys it reads agent.events (the ShardKeys stage) and
    agent.events.sharded (the agent). The effector's group is ``<app id>-effector``."""
    worker_topics = [EVENTS, EVENTS_SHARDED, RESULTS] if sharded else [EVENTS, RESULTS]
    return {
        settings.app_id: [catalog.name(t) for t in worker_topics],
        f"{settings.app_id}-effector": [catalog.name(INTENTS)],
    }


def counter_processes(
    env: dict[str, str],
    tmp_path: Path,
    *,
    config_ref: str,
    workers: Iterable[str] = ("worker-a", "worker-b"),
    effectors: Iterable[str] = ("effector",),
    tool_timeout_s: str | None = None,
) -> dict[str, KeylaneProcess]:
    """The chaos runs' processes: ``effectors`` and ``workers`` running the counter agent
    (tests/agents/counter.py) with ``config_ref``, each worker and each effector after the
    first with its own data dir, every log in ``tmp_path``. Not started."""
    effector = ["effector", "--tools", "tests.agents.counter"]
    if tool_timeout_s is not None:
        effector += ["--tool-timeout", tool_timeout_s]
    worker = ["worker", "--agent", "tests.agents.counter:agent", "--config", config_ref]
    first, *more = effectors
    return {
        first: KeylaneProcess(effector, env, tmp_path / f"{first}.log"),
        **{
            name: KeylaneProcess(
                effector, {**env, "KEYLANE_DATA_DIR": str(tmp_path / name)}, tmp_path / f"{name}.log"
            )
            for name in more
        },
        **{
            name: KeylaneProcess(
                worker, {**env, "KEYLANE_DATA_DIR": str(tmp_path / name)}, tmp_path / f"{name}.log"
            )
            for name in workers
        },
    }
