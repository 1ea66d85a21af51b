"""`keylane cancel` against a real worker: the key's suspension ends through its HITL policy
(the agent's Deny output), the event queued behind it then runs (and suspends again), and
the command stays on agent.control as the audit record. The worker is killed with kill -9
at a seeded moment around the cancel and started again: the outcome is the same, once per
deterministic id. In the other variant the worker is down when the cancel is sent (the CLI
reads the changelog, not a worker) and applies it when it comes back."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import pytest

from keylane import ids
from keylane.catalog import APPROVAL_REQUESTS, CONTROL, EVENTS, OUTPUT, Catalog
from keylane.config import Settings
from keylane.kafka.topic_reader import read_to_end
from keylane.wire import AgentEnvelope, KeyCommand, decode, encode
from tests.integration.test_inspect import inspect
from tests.kafka_io import produce, wait_for_records
from tests.processes import KeylaneProcess, keylane_cli, process_env

pytestmark = pytest.mark.kafka

KEY = "cancel-me"
WORKER = ["worker", "--agent", "tests.agents.approval:ask_first", "--config", "tests.agents.approval:config"]


async def until(check: object, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.5)


@pytest.mark.parametrize(("seed", "kill"), [(1, "after the cancel"), (2, "before the cancel")])
async def test_cancel_ends_a_suspension_through_the_policy_once_through_a_kill_9(
    settings: Settings, catalog: Catalog, tmp_path: Path, seed: int, kill: str
) -> None:
    rng = random.Random(seed)
    env = process_env(settings, HITL_WAIT_MS="600000")  # no deadline inside the test
    worker = KeylaneProcess(WORKER, env, tmp_path / "worker.log").start()

    refused = keylane_cli(settings, "cancel", KEY, "--operator", "ann", "--reason", "too early")
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert refused.stderr.splitlines() == [
        f"keylane: {KEY} is not suspended, so there is nothing to cancel ('keylane inspect {KEY}' shows its "
        "state; a sharded key's suspensions are on its shards KEY#i); --force sends it anyway"
    ]

    await produce(settings, catalog.name(EVENTS), [(KEY.encode(), encode(AgentEnvelope(payload="first")))])
    await wait_for_records(settings, catalog.name(APPROVAL_REQUESTS), lambda rs: len(rs) >= 1)
    await produce(settings, catalog.name(EVENTS), [(KEY.encode(), encode(AgentEnvelope(payload="second")))])
    await until(lambda: len(inspect(settings, KEY)[0]["buffered_events"]) == 1)

    if kill == "before the cancel":  # it reads the changelog: no worker needed
        worker.kill9()
    sent = keylane_cli(settings, "cancel", KEY, "--operator", "ann", "--reason", "customer called")
    assert (sent.returncode, sent.stderr) == (0, ""), sent.stderr
    assert f"sent for {KEY} by ann: its suspension at seq 0 ends" in sent.stdout
    if kill == "after the cancel":
        await asyncio.sleep(rng.uniform(0, 1.5))
        worker.kill9()
    worker = KeylaneProcess(WORKER, env, tmp_path / "worker-again.log").start()

    timeout_output = ids.output_id(KEY.encode(), 0)
    outputs = await wait_for_records(
        settings, catalog.name(OUTPUT), lambda rs: any(r.record_id == timeout_output for r in rs)
    )
    requests = await wait_for_records(settings, catalog.name(APPROVAL_REQUESTS), lambda rs: len(rs) >= 2)
    await until(lambda: inspect(settings, KEY)[0]["buffered_events"] == [])
    worker.stop()

    assert {(r.record_id, r.value) for r in outputs} == {(timeout_output, b"__hitl_timeout__")}
    assert len({r.record_id for r in requests}) == 2, "the queued event ran and suspended again, once"
    (shown,) = inspect(settings, KEY)
    assert shown["continuation"]["seq"] == 1 and shown["seq"] == 2
    (audit,) = [decode(r.value, KeyCommand) for r in await read_to_end(settings, catalog.name(CONTROL))]
    assert (audit.entity_key, audit.action, audit.operator, audit.reason) == (
        KEY,
        "cancel",
        "ann",
        "customer called",
    )
