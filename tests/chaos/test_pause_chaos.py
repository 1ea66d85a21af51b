"""A zombie worker must be fenced: `kill -STOP` past the session timeout, then `kill -CONT`.

Issue 21, item 5. Two workers and two effectors run as real processes while the real `kcat`
produces a steady stream over many keys. A seeded schedule freezes one of the four with
SIGSTOP for longer than its consumer session timeout (the group moves its partitions to the
other worker or effector, which redoes the frozen work), then thaws it with SIGCONT; one or
two kill -9s are mixed in. A thawed effector may have a claim on its way, which lands after
the other effector's records for the same intents (service/keylane/stages/effector/claims.py).
A thawed worker resumes in the middle of what it was doing: unless it is fenced, it finishes
its in-flight activations and writes their state and outputs after its partitions moved.

The checks are the harness's (tests/chaos/harness.py: one output per event, duplicates of an
output id byte-identical, per key a counter 1..n in order, one tool execution per event,
nothing on agent.errors, every input committed to its end), and what a zombie breaks, each
stated on its own: no duplicate effect in the tool ledger, no key whose memory counter went
backwards (in the order of its new output ids, of its tool runs, and of its state changelog,
whose last record per key, what a restart restores, must hold the key's full count and
events), and no two different outputs for one deterministic output id.

The model answers after FAKE_LLM_LATENCY_MS (50 ms here, the design's FakeLLM tier, unless
CHAOS_LLM_LATENCY_MS says otherwise), so a freeze lands on activations in flight. The session
timeout is the test processes' (KEYLANE_SESSION_TIMEOUT_S, tests/processes.py: 6 s); each
freeze lasts 2-3 times that. CHAOS_SEED, CHAOS_EVENTS (300), CHAOS_KEYS (40), CHAOS_PAUSES
(4 + events // 1000) and CHAOS_PAUSE_KILLS (2 + events // 5000) name one run; the events flow
evenly over the schedule, so more events make a faster stream. `make chaos` runs it long.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import re
import signal
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

from keylane.catalog import EVENTS, Catalog
from keylane.config import Settings
from keylane.core.pages import UnreadablePage, assembled, is_page_key
from keylane.core.state import PagedKeyState, decode_state, epoch_of
from keylane.kafka.topic_reader import TopicRecord, read_to_end
from keylane.stages.agent import STATE_TABLE
from tests.agents.counter import PAGED_BALLAST_BYTES
from tests.chaos.harness import (
    EndState,
    PacedKcat,
    Plan,
    Supervisor,
    Violations,
    check,
    counter_processes,
    input_groups,
    read_end_state,
    wait_for_commits,
    wait_for_outputs,
)
from tests.processes import KeylaneProcess, process_env

_EVENTS = int(os.environ.get("CHAOS_EVENTS", "300"))
_KEYS = int(os.environ.get("CHAOS_KEYS", "40"))
_PAUSES = int(os.environ.get("CHAOS_PAUSES", str(4 + _EVENTS // 1000)))
_KILLS = int(os.environ.get("CHAOS_PAUSE_KILLS", str(2 + _EVENTS // 5000)))
LLM_LATENCY_MS = os.environ.get("CHAOS_LLM_LATENCY_MS", "50")
TOOL_TIMEOUT_S = "5"  # the effector's claim lease is this + 30 s: a killed claim waits that long
SETTLE_S = 4.0  # after a thaw or a restart: the thawed process catches up, the group rebalances
# Per pause up to 3 session timeouts plus a rejoin; per kill a restart; then the drain.
TIMEOUT_S = 600 + 60 * _PAUSES + 40 * _KILLS + _EVENTS // 10
OUTPUTS_TIMEOUT_S = 120 + _EVENTS / 20  # a killed claim alone waits 35 s; lost work never arrives
COMMITS_TIMEOUT_S = 120.0
# What a thawed process logs when it finds itself out of the group (figures, not checks).
ZOMBIE_LINES = {
    "commit_failed_unknown_member": re.compile(r"OffsetCommit failed.*UnknownMemberId"),
    "revoked_partitions_not_committed": re.compile(r"could not commit \d+ revoked partitions"),
    "late_writes_written_over": re.compile(r"is a former owner's late write"),
}

pytestmark = [pytest.mark.kafka, pytest.mark.chaos]

PAUSE_VICTIMS = ("worker-a", "worker-b", "effector", "effector-b")
"""Every process of the run: each effector's partitions move to the other one while it is
frozen."""


@dataclass(frozen=True)
class Fault:
    kind: str  # "stop" (SIGSTOP for hold_s, then SIGCONT) or "kill9" (then restart)
    victim: str
    gap_s: float  # how long the stream flows before the fault lands
    hold_s: float  # how long a stopped process stays stopped (0 for a kill -9)

    def __str__(self) -> str:
        what = f"stop {self.hold_s}s" if self.kind == "stop" else "kill -9"
        return f"+{self.gap_s}s {what}->{self.victim}"


def schedule(seed: int, *, pauses: int, kills: int, session_s: float) -> tuple[Fault, ...]:
    """The seeded faults, in order: ``pauses`` freezes of 2-3 session timeouts each, mostly of
    a worker, and ``kills`` kill -9s, shuffled together."""
    rng = random.Random(f"pause-{seed}")
    faults = [
        Fault(
            "stop",
            rng.choices(PAUSE_VICTIMS, weights=(2, 2, 1, 1))[0],
            round(rng.uniform(1.0, 3.0), 2),
            round(rng.uniform(2.0, 3.0) * session_s, 1),
        )
        for _ in range(pauses)
    ]
    faults += [
        Fault("kill9", rng.choice(PAUSE_VICTIMS), round(rng.uniform(1.0, 3.0), 2), 0.0) for _ in range(kills)
    ]
    rng.shuffle(faults)
    return tuple(faults)


class Freezer:
    """SIGSTOP and SIGCONT by process id. Every process it stopped is continued by ``thaw_all``
    (called in a ``finally``), so a failing test never leaves a frozen process behind."""

    def __init__(self) -> None:
        self.frozen: dict[int, str] = {}

    def stop(self, name: str, process: KeylaneProcess) -> None:
        assert process.proc is not None and process.proc.poll() is None, f"{name} is not running"
        pid = process.proc.pid
        self.frozen[pid] = name
        os.kill(pid, signal.SIGSTOP)

    def cont(self, process: KeylaneProcess) -> None:
        assert process.proc is not None
        pid = process.proc.pid
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
        self.frozen.pop(pid, None)

    def thaw_all(self) -> None:
        for pid in list(self.frozen):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
            self.frozen.pop(pid, None)


@pytest.mark.timeout(TIMEOUT_S)
async def test_a_worker_stopped_past_its_session_timeout_is_fenced_when_it_resumes(
    settings: Settings, catalog: Catalog, tmp_path: Path
) -> None:
    """Issue 21 item 5, attacking docs/runtime.md's "A worker that stood still".

    Found on the code before the fencing: a thawed worker finishes activations and applies
    results from stale state after its partitions moved, so one output id carries two
    different events, seq goes backwards in the state changelog (the key restores a history
    that lost an event), and events end without output or side effect."""
    seed = int(os.environ.get("CHAOS_SEED", "1"))
    env = process_env(
        settings,
        TOOL_LEDGER=str(tmp_path / "tools.jsonl"),
        LLM_LEDGER=str(tmp_path / "llm.jsonl"),
        FAKE_LLM_LATENCY_MS=LLM_LATENCY_MS,
        COUNTER_BALLAST_BYTES=str(PAGED_BALLAST_BYTES),  # every other key's memory is paged
    )
    session_s = float(env["KEYLANE_SESSION_TIMEOUT_S"])
    faults = schedule(seed, pauses=_PAUSES, kills=_KILLS, session_s=session_s)
    plan = Plan.build(seed=seed, events=_EVENTS, keys=_KEYS, kills=len(faults), shards=None)
    header = (
        f"pause chaos seed={seed} events={len(plan.events)} keys={_KEYS} session_timeout={session_s:g}s "
        f"llm_latency={LLM_LATENCY_MS}ms; schedule: {' '.join(str(f) for f in faults)}\n"
        f"replay: CHAOS_SEED={seed} CHAOS_EVENTS={_EVENTS} CHAOS_KEYS={_KEYS} CHAOS_PAUSES={_PAUSES} "
        f"CHAOS_PAUSE_KILLS={_KILLS} pytest -m chaos {__file__}\n"
        f"logs: {tmp_path}; topics: {settings.topic_prefix}agent.*; group: {settings.app_id}"
    )
    print(header, flush=True)
    processes = counter_processes(
        env,
        tmp_path,
        config_ref="tests.agents.counter:config",
        effectors=("effector", "effector-b"),
        tool_timeout_s=TOOL_TIMEOUT_S,
    )
    supervisor = Supervisor(processes)
    freezer = Freezer()
    started = time.monotonic()
    try:
        for name in processes:
            await supervisor.start(name)
        stream = PacedKcat(settings, catalog.name(EVENTS), None, tmp_path / "kcat.log")
        try:
            for chunk, fault in zip(plan.chunks, faults, strict=False):
                stream.flow(chunk, over_s=fault.gap_s + fault.hold_s + SETTLE_S)  # flowing throughout
                await asyncio.sleep(fault.gap_s)  # the schedule's gap, not a wait for a result
                await supervisor.check_alive(restart=True)
                process = processes[fault.victim]
                at = time.monotonic() - started
                if fault.kind == "kill9":
                    await supervisor.kill9_and_restart(fault.victim)
                    print(f"{at:.1f}s kill -9 {fault.victim}, restarted", flush=True)
                    continue
                freezer.stop(fault.victim, process)
                await asyncio.sleep(fault.hold_s)  # past the session timeout: the group moves on
                freezer.cont(process)
                print(f"{at:.1f}s stopped {fault.victim} for {fault.hold_s}s, continued", flush=True)
                await asyncio.sleep(SETTLE_S)
            stream.flow(plan.chunks[-1], over_s=2.0)
            await asyncio.to_thread(stream.finish)
        except BaseException:
            stream.kill()
            raise
        streamed_s = time.monotonic() - started

        keep_alive = supervisor.keep_alive
        missing = await wait_for_outputs(
            settings, catalog, plan, timeout_s=OUTPUTS_TIMEOUT_S, between=keep_alive
        )
        groups = input_groups(settings, catalog, sharded=False)
        lags = await wait_for_commits(settings, groups, timeout_s=COMMITS_TIMEOUT_S, between=keep_alive)
        await supervisor.check_alive(restart=False)
    finally:
        freezer.thaw_all()  # before the stop: a frozen process would not act on SIGTERM
        supervisor.stop()
    state = await read_end_state(
        settings, catalog, tmp_path / "tools.jsonl", tmp_path / "llm.jsonl", sharded=False
    )
    changelog = await read_to_end(settings, f"{settings.app_id}-{STATE_TABLE}-changelog", timeout_s=120)

    found = check(plan, state, lags, sharded=False)
    check_zombie_writes(plan, state, changelog, found)
    for line in supervisor.unplanned:
        found.add("process exited or hung without being killed", line)
    for name, process in processes.items():
        log = process.log()
        for figure, pattern in ZOMBIE_LINES.items():
            found.figures[f"{name}:{figure}"] = len(pattern.findall(log))
    found.figures["events_without_output_at_deadline"] = len(missing)
    found.figures["stream_and_faults_s"] = round(streamed_s, 1)
    found.figures["total_s"] = round(time.monotonic() - started, 1)
    report = found.report(header)
    print(report, flush=True)
    assert not found, report


def check_zombie_writes(plan: Plan, state: EndState, changelog: list[TopicRecord], found: Violations) -> None:
    """What a zombie's late writes break, each named: duplicate effects, different outputs for
    one id, and a memory counter that went backwards (outputs, tool runs, state changelog)."""
    expected: dict[str, list[str]] = defaultdict(list)
    for event in plan.events:
        expected[event.physical].append(event.event_id)
    found.figures["zombie:duplicate_effects"] = found.figures.get("duplicate_side_effects", "?")
    _outputs_never_go_back(state, found)
    _tool_runs_never_go_back(state, found)
    _changelog_never_goes_back(changelog, expected, found)


def _outputs_never_go_back(state: EndState, found: Violations) -> None:
    """Per key, in the output topic's order, each new output id carries a higher count than
    every output before it, and one id never carries two different values."""
    values: dict[str, bytes | None] = {}
    highest: dict[bytes | None, tuple[int, str]] = {}
    for record in state.outputs:
        try:
            record_id = record.record_id
            body = json.loads(record.value or b"")
            count, event = int(body["count"]), str(body["event"])
        except (KeyError, ValueError, TypeError):
            continue  # reported by the harness's checks
        if record_id in values:
            if values[record_id] != record.value:
                found.add(
                    "zombie: two different outputs for one output id",
                    f"id {record_id} at p{record.partition}@{record.offset}: {record.value!r} "
                    f"after {values[record_id]!r}",
                )
            continue
        values[record_id] = record.value
        before = highest.get(record.key)
        if before is not None and count <= before[0]:
            found.add(
                "zombie: memory counter went backwards in a key's outputs",
                f"{record.key!r}: {event} count {count} at p{record.partition}@{record.offset} "
                f"after {before[1]} count {before[0]}",
            )
        if before is None or count > before[0]:
            highest[record.key] = (count, event)


def _tool_runs_never_go_back(state: EndState, found: Violations) -> None:
    """Per key, in the tool ledger's order (a key's intents are one partition's, which one
    effector at a time runs: the ledger is in order per key), every run
    of an event not run before carries a higher count than every run before it."""
    highest: dict[str, tuple[int, str]] = {}
    ran: set[str] = set()
    for line in state.ledger:
        key, event, count = line["key"], line["event"], int(line["count"])
        if event in ran:
            continue  # a duplicate effect: reported by the harness
        ran.add(event)
        before = highest.get(key)
        if before is not None and count <= before[0]:
            found.add(
                "zombie: memory counter went backwards in a key's tool runs",
                f"{key}: {event} ran with count {count} after {before[1]} with count {before[0]}",
            )
        if before is None or count > before[0]:
            highest[key] = (count, event)


def _changelog_never_goes_back(
    changelog: list[TopicRecord], expected: dict[str, list[str]], found: Violations
) -> None:
    """Per key, in the state changelog's order as a restore applies it, seq and the memory
    counter never decrease, and the restored state holds every event of the key once, in
    order. A restore skips a record whose owner epoch is below the one it applied for the key
    (a former owner's late write, docs/runtime.md): those are counted, not compared."""
    last: dict[str, tuple[int, int, list[str], TopicRecord]] = {}
    epochs: dict[str, int] = {}
    pages: dict[bytes, tuple[bytes, int]] = {}  # a paged key's memory pages, fenced alike
    skipped = 0
    paged_records = 0
    for record in changelog:
        if record.key is not None and is_page_key(record.key) and record.value is not None:
            epoch = epoch_of(record.value) or 0
            if epoch >= pages.get(record.key, (b"", 0))[1]:
                pages[record.key] = (record.value, epoch)
            continue
        key = (record.key or b"").decode(errors="replace")
        if record.value is None:
            found.add(
                "zombie: state changelog deleted a key", f"{key} at p{record.partition}@{record.offset}"
            )
            last.pop(key, None)
            epochs.pop(key, None)
            continue
        state = decode_state(record.value)
        if state.epoch < epochs.get(key, 0):
            skipped += 1
            continue
        epochs[key] = state.epoch
        memory = state.memory.entries
        if isinstance(state, PagedKeyState):
            paged_records += 1
            try:
                memory, _ = assembled(state.pages, record.key or b"", lambda k: pages.get(k, (None, 0))[0])
            except UnreadablePage as exc:
                found.add(
                    "zombie: a state record names memory pages the changelog does not hold",
                    f"{key} at p{record.partition}@{record.offset}: {exc}",
                )
                continue
        count = int(memory["count"].value) if "count" in memory else 0
        events = [str(e) for e in memory["events"].value] if "events" in memory else []
        before = last.get(key)
        if before is not None and (count < before[0] or state.seq < before[1]):
            found.add(
                "zombie: memory counter or seq went backwards in the state changelog",
                f"{key}: count {before[0]} seq {before[1]} at p{before[3].partition}@{before[3].offset}, "
                f"then count {count} seq {state.seq} at p{record.partition}@{record.offset}",
            )
        last[key] = (count, state.seq, events, record)
    found.figures["changelog_records"] = len(changelog)
    found.figures["changelog_late_writes_a_restore_skips"] = skipped
    found.figures["changelog_paged_state_records"] = paged_records
    if not paged_records:
        found.add("the run paged no key's memory", "COUNTER_BALLAST_BYTES did not reach the workers")
    for key, want in sorted(expected.items()):
        if key not in last:
            found.add("zombie: state changelog ends without the key", key)
            continue
        count, _seq, events, record = last[key]
        if count != len(want) or events != want[len(want) - len(events) :] or not events:
            found.add(
                "zombie: the state a restart restores is not the key's whole history",
                f"{key} at p{record.partition}@{record.offset}: count {count} events {events} "
                f"!= count {len(want)} events {want}",
            )
