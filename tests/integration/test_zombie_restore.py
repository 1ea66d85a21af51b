"""A worker that stood still past its session timeout with a state write on its way, and then
gets the partition back, restores what its successor wrote: the ack of its own late write does
not move its restore past the successor's records (service/keylane/kafka/restore_start.py).

Worker A (tests/integration/held_changelog_probe.py) writes e2's state for a key, and its
producer holds that changelog record, as a record is on its way when a process stops. A is
frozen with SIGSTOP past its session timeout; worker B takes the partitions over, redoes e2
and runs e3, and stops. A is thawed: its held record lands after B's, and its ack is A's
newest changelog offset. A holds every partition again and runs e4: its output must show e3 in the
key's memory (a restore from A's own offset would have skipped B's records, and the key's
memory would have gone back to A's e2 state).
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections import Counter
from pathlib import Path

import msgspec
import pytest

from keylane.catalog import EVENTS, OUTPUT, Catalog
from keylane.config import Settings
from keylane.kafka.topic_reader import TopicRecord, read_to_end
from keylane.stages.agent import STATE_TABLE
from keylane.wire import AgentEnvelope, encode
from tests.integration.test_resume_position import commits_reach_the_end
from tests.kafka_io import produce, wait_for_records
from tests.processes import KeylaneProcess, process_env, running

pytestmark = pytest.mark.kafka

KEY = b"zombie-restore"
AGENT = ["worker", "--agent", "tests.agents.flow:remember"]


def event(n: int) -> tuple[bytes, bytes]:
    return KEY, encode(AgentEnvelope(payload=f"e{n}"))


def rings(records: list[TopicRecord]) -> dict[str, list[str]]:
    """Each output's event -> the key's memory ring it showed (one value per event: a redone
    event must show what the first run showed)."""
    seen: dict[str, list[str]] = {}
    for record in records:
        output = json.loads(record.value or b"")
        assert seen.setdefault(output["event"], output["ring"]) == output["ring"], output
    return seen


def epochs(records: list[TopicRecord]) -> list[int]:
    mine = [r.value for r in records if r.key == KEY and r.value]
    return [msgspec.msgpack.decode(value).get("epoch", 0) for value in mine]


async def wait_until(what: str, check: object, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.3)


@pytest.mark.timeout(420)
async def test_a_thawed_worker_restores_its_successors_writes_not_past_them(
    settings: Settings, catalog: Catalog, tmp_path: Path
) -> None:
    hold, release, held_log = tmp_path / "hold", tmp_path / "release", tmp_path / "held.log"
    env = process_env(
        settings,
        LLM_LEDGER=str(tmp_path / "llm.jsonl"),
        HOLD_CHANGELOG=str(hold),
        RELEASE_CHANGELOG=str(release),
        HELD_CHANGELOG_LOG=str(held_log),
    )
    changelog = f"{settings.app_id}-{STATE_TABLE}-changelog"
    outputs = catalog.name(OUTPUT)
    a = KeylaneProcess(
        AGENT,
        {**env, "KEYLANE_DATA_DIR": str(tmp_path / "volume-a")},
        tmp_path / "a.log",
        module="tests.integration.held_changelog_probe",
    )
    b = KeylaneProcess(AGENT, {**env, "KEYLANE_DATA_DIR": str(tmp_path / "volume-b")}, tmp_path / "b.log")
    with running(a):
        for n in (0, 1):
            await produce(settings, catalog.name(EVENTS), [event(n)])
            await wait_for_records(settings, outputs, lambda rs, n=n: len(rings(rs)) == n + 1)
        await commits_reach_the_end(settings, catalog)

        hold.touch()
        await produce(settings, catalog.name(EVENTS), [event(2)])

        async def holding() -> bool:
            return held_log.exists() and str(KEY) in held_log.read_text()

        await wait_until("A to hold e2's state write", holding)
        a.proc.send_signal(signal.SIGSTOP)
        try:
            with running(b):
                await wait_for_records(settings, outputs, lambda rs: "e2" in rings(rs), timeout_s=120)
                await produce(settings, catalog.name(EVENTS), [event(3)])
                await wait_for_records(settings, outputs, lambda rs: "e3" in rings(rs))
                await commits_reach_the_end(settings, catalog)  # no one runs e2 or e3 again
                successor = epochs(await read_to_end(settings, changelog))[-1]
            # B stopped first, so no restore of B's can meet A's late write and write the key
            # over it: only A's own restore decides what the key holds.
            release.touch()
            a.proc.send_signal(signal.SIGCONT)

            async def late_write_landed() -> bool:
                return epochs(await read_to_end(settings, changelog))[-1] < successor

            await wait_until("A's held write to land after B's", late_write_landed)
        finally:
            if a.running:
                a.proc.send_signal(signal.SIGCONT)
        # A rejoins alone: it holds every partition again and restores the key's.
        await produce(settings, catalog.name(EVENTS), [event(4)])
        seen = rings(await wait_for_records(settings, outputs, lambda rs: "e4" in rings(rs), timeout_s=120))
        assert seen["e4"] == ["e0", "e1", "e2", "e3", "e4"], (
            f"the key's memory went back to the thawed worker's own late write: {seen}"
        )
        await commits_reach_the_end(settings, catalog)
    # A's restore read its own late write and skipped it by epoch, then A wrote the key again:
    # the restore did not start after that write, whether A's ack came before it noticed the
    # revocation (the restore started at its last accepted commit) or after (the ack moved
    # nothing).
    assert "the last changelog record of b'zombie-restore'" in a.log()
    calls = Counter(
        json.loads(line)["messages"][0] for line in (tmp_path / "llm.jsonl").read_text().splitlines()
    )
    assert calls == {"e0": 1, "e1": 1, "e2": 2, "e3": 1, "e4": 1}, f"only e2 runs twice (B redid it): {calls}"
