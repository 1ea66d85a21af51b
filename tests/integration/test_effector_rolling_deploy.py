"""A rolling deploy: an intent for a tool only the new effector knows reaches an old one.

The old effector (its registry without the tool) must not answer REJECTED at once: the agent
reads a REJECTED first and settles the intent, so a newer effector could never run it without
taking effect behind an answer that says nothing ran. It holds the intent instead; the new
effector joins, the old one is stopped (the deploy replacing it), the partition moves, and
the new effector runs the tool: one run, one answer, OK.

Before the fix the old effector answered REJECTED and recorded it Done, and the new effector
republished that REJECTED: the tool could never run.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from keylane import tool
from keylane.catalog import INTENTS, RESULTS, Catalog
from keylane.config import Settings
from keylane.kafka.topic_reader import read_to_end
from keylane.wire import ToolResult, decode, encode
from tests.agents.flow import append_ledger
from tests.integration.stream_checks import tool_runs, wait_until
from tests.integration.test_effector_done_rewrite import answers
from tests.integration.test_effector_rebalance import fresh_intent
from tests.kafka_io import produce
from tests.processes import KeylaneProcess, process_env, running

pytestmark = pytest.mark.kafka


@tool("open_ticket", side_effect=True)
def open_ticket(args: dict[str, Any]) -> dict[str, Any]:
    append_ledger("TOOL_LEDGER", {**args, "pid": os.getpid()})
    return {"ticket": args["subject"]}


async def old_effector_decided(
    settings: Settings, catalog: Catalog, old: KeylaneProcess, intent_id: str
) -> None:
    """Wait until the old effector holds the intent (its log says so) or answered it."""
    deadline = asyncio.get_running_loop().time() + 60
    while "'open_ticket'" not in old.log_since_start():
        results = await read_to_end(settings, catalog.name(RESULTS))
        if any(r.record_id == intent_id for r in results):
            return
        assert asyncio.get_running_loop().time() < deadline, f"the intent never reached it:\n{old.tail()}"
        await asyncio.sleep(0.3)


@pytest.mark.timeout(240)
async def test_an_intent_an_old_effector_cannot_run_is_run_by_the_new_one(
    settings: Settings, catalog: Catalog, tmp_path: Path
) -> None:
    ledger = tmp_path / "tools.jsonl"
    env = process_env(settings, TOOL_LEDGER=str(ledger))
    old = KeylaneProcess(
        ["effector", "--tools", "tests.agents.flow"],  # a registry without open_ticket
        {**env, "KEYLANE_DATA_DIR": str(tmp_path / "old")},
        tmp_path / "old.log",
    )
    new = KeylaneProcess(
        ["effector", "--tools", "tests.integration.test_effector_rolling_deploy"],
        {**env, "KEYLANE_DATA_DIR": str(tmp_path / "new")},
        tmp_path / "new.log",
    )
    intent = fresh_intent("ticket-1", "cust-9#0", "open_ticket", {"subject": "refund"})

    old.start()
    try:
        await produce(settings, catalog.name(INTENTS), [(intent.entity_key.encode(), encode(intent))])
        await old_effector_decided(settings, catalog, old, intent.intent_id)
        with running(new):
            old.stop()  # the deploy replaces the old effector: its partitions move to the new one
            answer = (await answers(settings, catalog, intent.intent_id, 1))[0]
            result = decode(answer, ToolResult)
            assert (result.status, result.error) == ("OK", None), old.tail()
            await wait_until(lambda: tool_runs(ledger) >= 1, timeout_s=30, what="the tool's run")
            every = await answers(settings, catalog, intent.intent_id, 1)
    finally:
        old.stop()

    assert set(every) == {answer}, "one answer for the intent id (a redelivery republishes it)"
    assert tool_runs(ledger) == 1
