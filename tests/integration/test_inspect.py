"""`keylane inspect` shows what a key's activations put into its state, read from the state
changelog as a restore reads it: for a plain key, and for each shard of a sharded one, with
the workers stopped (it needs none of them)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from keylane.catalog import EVENTS, OUTPUT, Catalog
from keylane.config import Settings
from keylane.kafka.partitioner import expected_partition
from keylane.keys import shard_key
from keylane.wire import AgentEnvelope, encode
from tests.kafka_io import produce, wait_for_records
from tests.processes import KeylaneProcess, keylane_cli, process_env, running

pytestmark = pytest.mark.kafka


def inspect(settings: Settings, *args: str) -> list[dict[str, Any]]:
    """`keylane inspect ... --json` as an operator runs it, each key's object."""
    done = keylane_cli(settings, "inspect", *args, "--json")
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


async def test_inspect_shows_a_plain_and_a_sharded_keys_memory_and_bookkeeping(
    settings: Settings, catalog: Catalog, tmp_path: Path
) -> None:
    env = process_env(settings, LLM_LEDGER=str(tmp_path / "llm.jsonl"))
    plain = KeylaneProcess(["worker", "--agent", "tests.agents.flow:remember"], env, tmp_path / "plain.log")
    plain_events = [f"plain-{i}" for i in range(3)]
    with running(plain):
        await produce(
            settings,
            catalog.name(EVENTS),
            [(b"plain", encode(AgentEnvelope(payload=e))) for e in plain_events],
        )
        await wait_for_records(settings, catalog.name(OUTPUT), lambda rs: len(rs) >= 3, timeout_s=90)

    (shown,) = inspect(settings, "plain")
    assert shown["key"] == "plain" and shown["seq"] == 3
    assert shown["memory"]["events"]["ring"] is True
    assert shown["memory"]["events"]["items"] == plain_events
    assert shown["replay_cache"]["entries"] == 0, "each activation completed: its model call cannot hit again"
    assert shown["continuation"] is None and shown["buffered_events"] == []
    events_applied = [offset for stream, offset in shown["applied"].items() if "agent.events/" in stream]
    assert events_applied == [2], "the third event's offset on its partition"
    assert inspect(settings, "nobody") == [
        {
            "key": "nobody",
            "changelog_partition": expected_partition(b"nobody", catalog[EVENTS].partitions),
            "changelog_offset": None,
            "state": None,
        }
    ]

    sharded = KeylaneProcess(
        ["worker", "--agent", "tests.agents.flow:remember", "--config", "tests.agents.flow:sharded2"],
        env,
        tmp_path / "sharded.log",
    )
    hot = {f"hot-{i}": encode(AgentEnvelope(payload=f"hot-{i}")) for i in range(8)}
    with running(sharded):
        await produce(settings, catalog.name(EVENTS), [(b"hot", value) for value in hot.values()])
        await wait_for_records(
            settings, catalog.name(OUTPUT), lambda rs: len(rs) >= 3 + len(hot), timeout_s=90
        )

    shards = inspect(settings, "hot", "--logical")
    expected = {shard_key(b"hot", 2, payload=value).decode(): [] for value in hot.values()}
    for event, value in hot.items():
        expected[shard_key(b"hot", 2, payload=value).decode()].append(event)
    assert len(expected) == 2, "the payloads were chosen to use both shards"
    assert {s["key"]: s["memory"]["events"]["items"] for s in shards} == expected
    assert [s["key"] for s in shards] == sorted(expected)
    assert inspect(settings, shards[0]["key"]) == [shards[0]]


@pytest.mark.parametrize(
    "command",
    [
        ["inspect", "k"],
        ["inspect", "k", "--logical"],
        ["pause", "k", "--operator", "ann", "--reason", "r"],
        ["resume", "k", "--shards", "2", "--operator", "ann", "--reason", "r"],
    ],
)
def test_an_app_id_no_worker_ran_under_gets_one_line_not_a_wait(
    settings: Settings, command: list[str]
) -> None:
    app_id = f"{settings.app_id}-never-ran"
    done = keylane_cli(settings, *command, KEYLANE_APP_ID=app_id)
    changelog = f"{app_id}-keylane-state-changelog"
    assert done.returncode == 1 and done.stdout == "", done.stdout[-2000:]
    assert done.stderr.splitlines() == [
        f"keylane: {changelog} does not exist on {settings.bootstrap_servers}: no worker of app id "
        f"{app_id!r} has written state there; check KEYLANE_APP_ID (--app-id) and KEYLANE_TOPIC_PREFIX "
        "(--topic-prefix)"
    ], done.stderr[-2000:]
