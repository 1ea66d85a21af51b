"""Partitions that leave a live worker and come back to it, while keys' paged memory fills and
empties (tests/agents/pages.py).

The first worker runs from start to end. A second one joins three times (the partitions it
takes leave the first) and leaves again, at seeded points: by a clean stop, or by kill -9
(its next start discards its store and restores from the changelog). Each time it leaves, its
partitions come back to the first worker, whose store still holds what it wrote before they
left: their restore reads the changelog again from the last offset the first worker knows it
had read everything up to (service/keylane/kafka/restore_start.py), over records and pages of
two owners. Whatever the moves interrupted: every event has one output by id; each activation
found exactly the memory its key's previous event left (a record beside pages of another
write would show as other memory); no activation failed; and the changelog keeps no page of
memory that emptied.
"""

from __future__ import annotations

import asyncio
import random
import re
from pathlib import Path

import pytest

from keylane.catalog import EVENTS, OUTPUT, Catalog
from keylane.config import Settings
from keylane.kafka.topic_reader import read_to_end
from keylane.wire import AgentEnvelope, encode
from tests.agents.pages import fill_and_clear
from tests.integration.pages_checks import assert_paged_memory_whole
from tests.integration.stream_checks import outputs_by_id
from tests.kafka_io import produce
from tests.processes import KeylaneProcess, process_env, running

pytestmark = pytest.mark.kafka

KEYS = [f"doc-{i}".encode() for i in range(12)]
ROUNDS = 6  # fill, clear per round and key; odd keys end with one more fill
VISITS = 3  # times the second worker joins and leaves
SEED = 23


async def trickle(settings: Settings, catalog: Catalog, payloads: dict[bytes, list[str]]) -> None:
    """One event per key every 1.2 s, so work flows through every move."""
    for i in range(max(map(len, payloads.values()))):
        batch = [(k, encode(AgentEnvelope(payload=p[i]))) for k, p in payloads.items() if i < len(p)]
        await produce(settings, catalog.name(EVENTS), batch)
        await asyncio.sleep(1.2)


def assignments(log: str, topic: str) -> list[set[int]]:
    """The partitions of ``topic`` at each of a worker's rebalances, in order (from aiokafka's
    "Setting newly assigned partitions" lines, in Faust's ``topic {0-2, 4}`` notation)."""
    held: list[set[int]] = []
    for line in log.splitlines():
        if "Setting newly assigned partitions" not in line:
            continue
        found = re.search(rf"{re.escape(topic)} \{{([^}}]*)\}}", line)
        partitions: set[int] = set()
        for part in found.group(1).split(",") if found else []:
            low, _, high = part.strip().partition("-")
            partitions.update(range(int(low), int(high or low) + 1))
        held.append(partitions)
    return held


def came_back(log: str, topic: str) -> set[int]:
    """Partitions of ``topic`` a worker held, then did not, then held again."""
    held = assignments(log, topic)
    back: set[int] = set()
    for i, first in enumerate(held):
        for j in range(i + 1, len(held)):
            for later in held[j + 1 :]:
                back |= (first - held[j]) & later
    return back


@pytest.mark.timeout(300)
async def test_partitions_back_on_a_live_worker_keep_each_keys_paged_memory_whole(
    settings: Settings, catalog: Catalog, tmp_path: Path
) -> None:
    rng = random.Random(SEED)
    payloads = {key: fill_and_clear(key, ROUNDS) for key in KEYS}
    total = sum(map(len, payloads.values()))
    env = process_env(settings)
    agent = ["worker", "--agent", "tests.agents.pages:agent"]
    first = KeylaneProcess(
        agent, {**env, "KEYLANE_DATA_DIR": str(tmp_path / "first")}, tmp_path / "first.log"
    )
    second = KeylaneProcess(
        agent, {**env, "KEYLANE_DATA_DIR": str(tmp_path / "second")}, tmp_path / "second.log"
    )
    # Each visit: join once the outputs reach one seeded count, leave at a later one.
    marks = sorted(rng.sample(range(total // 10, total - total // 5), 2 * VISITS))
    # One kill -9 before the last visit (the second worker's next start discards its store),
    # the last leave either way (the first worker takes over after the session timeout).
    leaves = ["stop"] * VISITS
    leaves[rng.randrange(VISITS - 1)] = "kill9"
    leaves[-1] = rng.choice(["stop", "kill9"])

    async def count_ids() -> int:
        return len({r.record_id for r in await read_to_end(settings, catalog.name(OUTPUT))})

    async def outputs_reach(count: int) -> None:
        for _ in range(900):
            if await count_ids() >= count:
                return
            await asyncio.sleep(0.2)
        raise AssertionError(f"fewer than {count} outputs after 180 s")

    with running(first):
        producing = asyncio.create_task(trickle(settings, catalog, payloads))
        for visit, how in enumerate(leaves):
            await outputs_reach(marks[2 * visit])
            second.start()
            # Leave only once the second worker took partitions and the stream moved on a round.
            for _ in range(300):
                if any(assignments(second.log_since_start(), catalog.name(EVENTS))):
                    break
                await asyncio.sleep(0.1)
            await outputs_reach(max(marks[2 * visit + 1], await count_ids() + len(KEYS)))
            if how == "stop":
                assert second.stop() == 0
            else:
                second.kill9()
        await producing
        outputs = await outputs_by_id(settings, catalog, total, timeout_s=180)
        first.stop()

    assert came_back(first.log(), catalog.name(EVENTS)), "no partition left the first worker and came back"
    assert "did not stop cleanly" in second.log(), "the second worker's start after kill -9 kept its store"
    await assert_paged_memory_whole(settings, catalog, outputs, payloads)
