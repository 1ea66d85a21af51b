"""Static group membership (KEYLANE_GROUP_INSTANCE_ID, KIP-345): a worker that stops cleanly
and comes back with the same instance id and data dir within the session timeout gets its
partitions back without a rebalance of the group.

Two workers, "w-0" (the group leader: it starts first) and "w-1", with a 30 s session
timeout. One of them is stopped with SIGTERM (a static member sends no LeaveGroup) and
started again with the same id and data dir. The group coordinator hands the returning
member its old assignment in the same generation, so the other one logs nothing of it: no
aiokafka "Heartbeat failed ... because it is rebalancing", "(Re-)joining group", "Joined
group" or "Revoking previously assigned partitions" line, no "Setting newly assigned
partitions". The events produced while the member is away wait on its partitions, and every
event runs exactly once, on the worker that owned its partition before the restart.

With dynamic membership the same restart logs "LeaveGroup request succeeded" and costs the
group two rebalances (two new generations in the other worker's log).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import defaultdict
from itertools import count
from pathlib import Path

import pytest

from keylane.catalog import EVENTS, OUTPUT, Catalog
from keylane.config import Settings
from keylane.kafka.partitioner import expected_partition
from keylane.kafka.topic_reader import read_to_end
from keylane.wire import AgentEnvelope, encode
from tests.integration.stream_checks import wait_until
from tests.kafka_io import produce
from tests.processes import KeylaneProcess, process_env

pytestmark = pytest.mark.kafka

SESSION_TIMEOUT_S = 30  # longer than a worker's restart, even on a loaded machine
HEARTBEAT_S = 3.0  # build_app: min(3, session timeout / 3); a rebalance reaches a member by then
KEYS_PER_PARTITION = 2

# aiokafka's group coordinator (aiokafka/consumer/group_coordinator.py), at INFO.
JOINING = "(Re-)joining group"
JOINED = re.compile(r"Joined group '[^']+' \(generation (\d+)\) with member_id (\S+)")
REVOKING = "Revoking previously assigned partitions"
ASSIGNED = "Setting newly assigned partitions"
# Faust renders a set of topic-partitions as a table, which the worker logs on one line:
# "Setting newly assigned partitions t.agent.events {0-2,4}, t.agent.results {1} for group g".
TABLE_ROW = re.compile(r"(\S+) \{([0-9,-]*)\}")


def keys_on_every_partition(partitions: int) -> list[bytes]:
    """KEYS_PER_PARTITION keys for each partition (by the murmur2 partitioner), so both
    workers own some."""
    per_partition: dict[int, list[bytes]] = defaultdict(list)
    for i in count():
        key = f"static-{i}".encode()
        slot = per_partition[expected_partition(key, partitions)]
        if len(slot) < KEYS_PER_PARTITION:
            slot.append(key)
        if len(per_partition) == partitions and all(
            len(v) == KEYS_PER_PARTITION for v in per_partition.values()
        ):
            return [key for p in sorted(per_partition) for key in per_partition[p]]
    raise AssertionError("unreachable")


def assignments(log: str) -> list[set[tuple[str, int]]]:
    """Each assignment aiokafka logged, as (topic, partition)."""
    found = []
    for chunk in log.split(ASSIGNED)[1:]:
        table = chunk.split(" for group ", 1)[0]
        found.append({(topic, p) for topic, spec in TABLE_ROW.findall(table) for p in _numbers(spec)})
    return found


def _numbers(spec: str) -> list[int]:
    """``0-2,4`` -> [0, 1, 2, 4]."""
    numbers: list[int] = []
    for part in filter(None, spec.split(",")):
        low, _, high = part.partition("-")
        numbers.extend(range(int(low), int(high or low) + 1))
    return numbers


def ledger_events(path: Path) -> list[str]:
    """The events whose model call reached this worker's FakeLLM (tests/agents/flow.py)."""
    if not path.exists():
        return []
    return [message for line in path.read_text().splitlines() for message in json.loads(line)["messages"]]


async def outputs_per_key(
    settings: Settings, catalog: Catalog, total: int
) -> dict[str, list[dict[str, object]]]:
    """Each event's output per key, in the order the key ran them, once ``total`` events have
    one. An event's output may be on the topic more than once (a redelivery re-emits it under
    the same id), but only ever with the same value."""
    deadline = asyncio.get_running_loop().time() + 120
    while True:
        values: dict[str, set[bytes]] = defaultdict(set)
        for record in await read_to_end(settings, catalog.name(OUTPUT)):
            assert record.value is not None
            values[record.record_id].add(record.value)
        if len(values) >= total:
            break
        assert asyncio.get_running_loop().time() < deadline, f"only {len(values)} of {total} outputs"
        await asyncio.sleep(0.5)
    assert all(len(v) == 1 for v in values.values()), f"an output with two values: {values}"
    per_key: dict[str, list[dict[str, object]]] = defaultdict(list)
    for (value,) in values.values():
        output = json.loads(value)
        per_key[output["key"]].append(output)
    return {key: sorted(outputs, key=lambda o: int(str(o["seq"]))) for key, outputs in per_key.items()}


def settled(worker: KeylaneProcess) -> bool:
    """Whether the worker finished recovering after its latest assignment (Faust's log)."""
    return "[^---Recovery]: Worker ready" in worker.log().rsplit(ASSIGNED, 1)[-1]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("restarted", ["w-1", "w-0"], ids=["a-follower", "the-group-leader"])
async def test_a_static_member_restarts_without_a_rebalance(
    settings: Settings, catalog: Catalog, tmp_path: Path, restarted: str
) -> None:
    env = process_env(settings, KEYLANE_SESSION_TIMEOUT_S=str(SESSION_TIMEOUT_S))
    args = ["worker", "--agent", "tests.agents.flow:remember"]
    workers = {
        name: KeylaneProcess(
            args,
            {
                **env,
                "KEYLANE_GROUP_INSTANCE_ID": name,
                "KEYLANE_DATA_DIR": str(tmp_path / name),
                "LLM_LEDGER": str(tmp_path / f"{name}.llm.jsonl"),
            },
            tmp_path / f"{name}.log",
        )
        for name in ("w-0", "w-1")
    }
    (stays,) = set(workers) - {restarted}
    back, other = workers[restarted], workers[stays]
    partitions = catalog[EVENTS].partitions
    keys = keys_on_every_partition(partitions)
    events = catalog.name(EVENTS)
    rounds = 4
    payloads = {key: [f"{key.decode()}-e{n}" for n in range(rounds)] for key in keys}

    async def produce_round(n: int) -> None:
        await produce(settings, events, [(k, encode(AgentEnvelope(payload=payloads[k][n]))) for k in keys])

    try:
        workers["w-0"].start()  # alone: the group leader
        workers["w-1"].start()  # a rebalance: w-0 gives up half of the partitions
        await wait_until(
            lambda: len(assignments(workers["w-0"].log())) >= 2 and settled(workers["w-0"]),
            timeout_s=60,
            what="w-0 ready after its second assignment",
        )
        await produce_round(0)
        await outputs_per_key(settings, catalog, len(keys))
        before = back.log()
        *_, owned_before = assignments(before)
        *_, (generation, old_member) = JOINED.findall(before)
        mark = len(other.log())

        assert back.stop() == 0  # SIGTERM: a static member sends no LeaveGroup
        await produce_round(1)  # while it is away: its partitions wait for it
        back.launch()
        await produce_round(2)  # while it starts
        back.wait_ready()
        await produce_round(3)  # after
        await outputs_per_key(settings, catalog, rounds * len(keys))
        await asyncio.sleep(2 * HEARTBEAT_S)  # a rebalance would have reached the other by now
        per_key = await outputs_per_key(settings, catalog, rounds * len(keys))
        other_after = other.log()[mark:]
        back_after = back.log_since_start()
        first_run = back.log()[: back.start_offset]  # its first start, up to its stop
    finally:
        for worker in workers.values():
            worker.stop()

    assert "Elected group leader" in workers["w-0"].log().split(JOINING)[1], "w-0 led the group"
    assert "LeaveGroup" not in first_run, first_run[-3000:]  # aiokafka: "LeaveGroup request succeeded"
    # The member that stayed saw nothing: no new generation, no revocation, no new assignment.
    for line in (JOINING, REVOKING, ASSIGNED, "because it is rebalancing"):
        assert line not in other_after, (
            f"{stays} logged {line!r} after {restarted}'s restart:\n{other_after[-3000:]}"
        )
    assert not JOINED.search(other_after), other_after[-3000:]
    # The restarted one came back into the same generation, as a new member id, with its partitions.
    ((rejoined_generation, new_member),) = JOINED.findall(back_after)
    assert rejoined_generation == generation, f"a new generation: {back_after[-3000:]}"
    assert new_member != old_member
    assert assignments(back_after) == [owned_before]

    # Every event ran exactly once, in order per key, on the owner of its partition.
    owned = {p for topic, p in owned_before if topic == events}
    assert owned and len(owned) < partitions, f"{restarted} owns some partitions, not all: {owned}"
    for key, key_events in payloads.items():
        outputs = per_key[key.decode()]
        assert [o["event"] for o in outputs] == key_events, f"one output per event, in order: {outputs}"
        assert [o["seq"] for o in outputs] == list(range(rounds))
        assert [o["ring"] for o in outputs] == [key_events[: n + 1] for n in range(rounds)]
    ran = {name: ledger_events(tmp_path / f"{name}.llm.jsonl") for name in workers}
    assert sorted(ran["w-0"] + ran["w-1"]) == sorted(e for v in payloads.values() for e in v), (
        "each model call once"
    )
    on_back = {e for key, v in payloads.items() if expected_partition(key, partitions) in owned for e in v}
    assert set(ran[restarted]) == on_back, f"{restarted}'s events ran on it, before and after its restart"
