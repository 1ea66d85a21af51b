"""`keylane pause` / `keylane resume` against a real worker: of two keys that share a
partition, the paused one holds its events (in its state, visible to `keylane inspect`) while
the other runs them; the worker is killed with kill -9 while the key is paused and started
again, and the key is still paused; resuming runs the held events in order, each once (its
output id has one value), with the key's memory as if they had run on arrival. In the seeded
variants the kill -9 lands at a random moment after the resume instead. The commands stay on
agent.control as the audit log, and every input partition's committed offset reaches its end."""

from __future__ import annotations

import asyncio
import json
import random
import time
from pathlib import Path
from typing import Any

import pytest

from keylane.catalog import CONTROL, EVENTS, OUTPUT, Catalog
from keylane.config import Settings
from keylane.kafka.partitioner import expected_partition
from keylane.kafka.topic_reader import TopicRecord, read_to_end
from keylane.keys import shard_index
from keylane.wire import AgentEnvelope, KeyCommand, decode, encode
from tests.integration.doc_sessions import run_session
from tests.integration.test_inspect import inspect
from tests.integration.test_resume_position import commits_reach_the_end
from tests.kafka_io import produce, wait_for_records
from tests.processes import KeylaneProcess, keylane_cli, process_env, running

pytestmark = pytest.mark.kafka

AGENT = ["worker", "--agent", "tests.agents.flow:remember"]


def two_keys_on_one_partition(partitions: int) -> tuple[str, str]:
    paused = "pause-me"
    other = next(
        f"keep-going-{n}"
        for n in range(10_000)
        if expected_partition(f"keep-going-{n}".encode(), partitions)
        == expected_partition(paused.encode(), partitions)
    )
    return paused, other


def by_event(records: list[TopicRecord], key: str) -> dict[str, list[str]]:
    """Each of ``key``'s outputs: event -> the memory ring it showed; one value per output id."""
    values: dict[str, set[bytes]] = {}
    for record in records:
        values.setdefault(record.record_id, set()).add(record.value or b"")
    assert all(len(v) == 1 for v in values.values()), "an output id with two values"
    shown = [json.loads(r.value or b"") for r in records]
    return {o["event"]: o["ring"] for o in shown if o["key"] == key}


async def until(what: str, check: Any, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.5)


def cli_ok(settings: Settings, *args: str) -> str:
    done = keylane_cli(settings, *args)
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    return done.stdout


@pytest.mark.timeout(420)
@pytest.mark.parametrize("seed", [0, 1, 2])
async def test_a_paused_key_holds_its_events_through_a_kill_9_and_resume_runs_them_in_order(
    settings: Settings, catalog: Catalog, tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    paused, other = two_keys_on_one_partition(catalog[EVENTS].partitions)
    env = process_env(
        settings, LLM_LEDGER=str(tmp_path / "llm.jsonl"), KEYLANE_DATA_DIR=str(tmp_path / "data")
    )
    outputs = catalog.name(OUTPUT)

    async def send(key: str, event: str) -> None:
        await produce(settings, catalog.name(EVENTS), [(key.encode(), encode(AgentEnvelope(payload=event)))])

    worker = KeylaneProcess(AGENT, env, tmp_path / "worker.log").start()
    for key in (paused, other):
        await send(key, f"{key}:0")
    await wait_for_records(settings, outputs, lambda rs: len(rs) >= 2)

    refused = keylane_cli(settings, "resume", paused, "--operator", "ann", "--reason", "nothing yet")
    assert refused.returncode == 1 and refused.stderr.splitlines() == [
        f"keylane: {paused} is not paused ('keylane inspect {paused}' shows its state); "
        "--force sends it anyway"
    ]
    said = cli_ok(settings, "pause", paused, "--operator", "ann", "--reason", "it loops on refunds")
    assert said.startswith("pause ") and f"sent for {paused} by ann" in said
    await until("the pause", lambda: inspect(settings, paused)[0]["paused"] is not None)

    for n in (1, 2):
        await send(paused, f"{paused}:{n}")
        await send(other, f"{other}:{n}")
    await wait_for_records(settings, outputs, lambda rs: len(by_event(rs, other)) == 3)
    await until("two held events", lambda: len(inspect(settings, paused)[0]["held_inputs"]) == 2)
    assert list(by_event(await read_to_end(settings, outputs), paused)) == [f"{paused}:0"]

    worker.kill9()  # while paused: the pause is in the key's state
    worker = KeylaneProcess(AGENT, env, tmp_path / "worker-again.log").start()
    await send(paused, f"{paused}:3")
    await until("a third held event", lambda: len(inspect(settings, paused)[0]["held_inputs"]) == 3)
    (shown,) = inspect(settings, paused)
    assert shown["paused"]["by"] == "ann" and shown["paused"]["reason"] == "it loops on refunds"
    assert list(by_event(await read_to_end(settings, outputs), paused)) == [f"{paused}:0"]

    refused = keylane_cli(settings, "pause", paused, "--operator", "bob", "--reason", "again")
    assert refused.returncode == 1 and "is paused already, by ann: it loops on refunds" in refused.stderr
    said = cli_ok(settings, "resume", paused, "--operator", "bob", "--reason", "fixed the prompt")
    assert "its 3 held inputs run in order" in said
    if seed:
        await asyncio.sleep(rng.uniform(0, 2.0))
        worker.kill9()
        worker = KeylaneProcess(AGENT, env, tmp_path / "worker-third.log").start()
    await send(paused, f"{paused}:4")

    done = await wait_for_records(settings, outputs, lambda rs: len(by_event(rs, paused)) == 5)
    events = [f"{paused}:{n}" for n in range(5)]
    assert by_event(done, paused) == {e: events[: i + 1] for i, e in enumerate(events)}
    await until("the resume", lambda: inspect(settings, paused)[0]["paused"] is None)
    assert inspect(settings, paused)[0]["held_inputs"] == []
    await commits_reach_the_end(settings, catalog)
    worker.stop()

    audit = [decode(r.value, KeyCommand) for r in await read_to_end(settings, catalog.name(CONTROL))]
    assert [(c.action, c.operator, c.reason) for c in audit] == [
        ("pause", "ann", "it loops on refunds"),
        ("resume", "bob", "fixed the prompt"),
    ]


@pytest.mark.timeout(300)
async def test_the_runbooks_pause_session_prints_what_docs_operations_shows(
    settings: Settings, catalog: Catalog, tmp_path: Path
) -> None:
    env = process_env(settings, LLM_LEDGER=str(tmp_path / "llm.jsonl"))
    key = "customer-7"
    outputs = catalog.name(OUTPUT)
    with running(KeylaneProcess(AGENT, env, tmp_path / "worker.log")):
        await produce(
            settings, catalog.name(EVENTS), [(key.encode(), encode(AgentEnvelope(payload="hello")))]
        )
        await wait_for_records(settings, outputs, lambda rs: len(rs) == 1)
        await run_session("## Pausing and resuming a key", settings, env)
        done_records = await wait_for_records(settings, outputs, lambda rs: len(rs) == 2)
    assert [json.loads(r.value or b"")["ring"] for r in done_records][-1] == ["hello", "refund again"]


@pytest.mark.timeout(300)
async def test_a_sharded_key_is_paused_and_resumed_through_its_shards(
    settings: Settings, catalog: Catalog, tmp_path: Path
) -> None:
    """Behind ShardKeys(4) a logical key's inputs reach its shards KEY#i, never KEY: a pause of
    KEY itself would hold nothing, so the CLI refuses it in one line naming the shards, and
    ``--shards 4`` pauses (and resumes) every shard."""
    env = process_env(settings, LLM_LEDGER=str(tmp_path / "llm.jsonl"))
    key, outputs = "hot-customer", catalog.name(OUTPUT)
    # Two events per shard, chosen by the shard their payload hashes to.
    events = [f"e{n}" for n in range(200)]
    per_shard = {
        i: [e for e in events if shard_index(encode(AgentEnvelope(payload=e)), 4) == i][:2] for i in range(4)
    }
    first, second = [e[0] for e in per_shard.values()], [e[1] for e in per_shard.values()]

    async def send(payloads: list[str]) -> None:
        values = [(key.encode(), encode(AgentEnvelope(payload=p))) for p in payloads]
        await produce(settings, catalog.name(EVENTS), values)

    worker = KeylaneProcess([*AGENT, "--config", "tests.agents.flow:sharded4"], env, tmp_path / "worker.log")
    with running(worker):
        await send(first)
        await wait_for_records(settings, outputs, lambda rs: len(rs) == 4)

        refused = keylane_cli(settings, "pause", key, "--operator", "ann", "--reason", "it loops")
        assert refused.returncode == 1 and len(refused.stderr.splitlines()) == 1, refused.stderr
        assert (
            f"keylane: {key} has no state, but its shards {key}#0, {key}#1, {key}#2, {key}#3 do"
            in refused.stderr
        )
        assert "--shards N" in refused.stderr

        said = cli_ok(settings, "pause", key, "--shards", "4", "--operator", "ann", "--reason", "it loops")
        assert [line.split()[4:] for line in said.splitlines()[:4]] == [
            [f"{key}#{i}", "by", "ann"] for i in range(4)
        ]
        assert said.splitlines()[4].startswith(f"pause sent to 4 of the 4 shards of {key}")
        await until(
            "every shard paused", lambda: all(v["paused"] for v in inspect(settings, key, "--logical"))
        )

        await send(second)
        await until(
            "an event held by each shard",
            lambda: [len(v["held_inputs"]) for v in inspect(settings, key, "--logical")] == [1, 1, 1, 1],
        )
        assert len(await read_to_end(settings, outputs)) == 4

        again = keylane_cli(
            settings, "pause", key, "--shards", "4", "--operator", "bob", "--reason", "me too"
        )
        assert again.returncode == 1, again.stdout
        assert [line.split(": skipped,")[0] for line in again.stdout.splitlines()] == [
            f"{key}#{i}" for i in range(4)
        ]
        assert again.stderr.splitlines() == [
            f"keylane: no shard of {key} took the pause: each was skipped, as listed above"
        ]

        said = cli_ok(settings, "resume", key, "--shards", "4", "--operator", "ann", "--reason", "fixed")
        assert said.splitlines()[-1].startswith(f"resume sent to 4 of the 4 shards of {key}")
        done = await wait_for_records(settings, outputs, lambda rs: len(rs) == 8)
    rings = {json.loads(r.value or b"")["key"]: json.loads(r.value or b"")["ring"] for r in done}
    assert rings == {f"{key}#{i}": per_shard[i] for i in range(4)}


def test_shards_must_be_at_least_one(settings: Settings) -> None:
    done = keylane_cli(settings, "pause", "k", "--shards", "0", "--operator", "ann", "--reason", "r")
    assert done.returncode == 1 and done.stderr.splitlines() == [
        "keylane: --shards must be at least 1 (the agent's AgentConfig.shards), got 0"
    ]
