"""A tool result too large for a Kafka record is answered as an ERROR, once, and the effector
keeps going.

The effector records each intent's answer (Done, holding the signed result) in its claim
table and publishes it to agent.results. A tool that returned more than a record may carry
made the Done record fail its changelog send: the effector stopped (a record it could not
produce), restarted into an in-doubt claim, and a tool declared ``in_doubt="rerun"`` ran again
on every restart. The answer is now an ERROR result naming the sizes, recorded as Done: the
tool ran once, the agent learns why it got no value, and a copy of the intent gets the same
answer without running anything.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from keylane import tool
from keylane.catalog import INTENTS, Catalog
from keylane.config import Settings
from keylane.testing.processes import free_port
from keylane.wire import ToolIntent, ToolResult, decode, encode
from tests.agents.flow import append_ledger
from tests.integration.stream_checks import tool_runs, wait_until
from tests.integration.test_effector_rebalance import fresh_intent, wait_results
from tests.integration.test_redelivery import metric
from tests.kafka_io import produce
from tests.processes import KeylaneProcess, process_env, running

pytestmark = pytest.mark.kafka

REPORT_BYTES = 3 * 1024 * 1024  # over agent.results' 2 MiB max_message_bytes


@tool("huge_report", side_effect=True, in_doubt="rerun")
def huge_report(args: dict[str, Any]) -> dict[str, Any]:
    append_ledger("TOOL_LEDGER", args)
    return {"report": "x" * REPORT_BYTES}


def report_intent(key: str) -> ToolIntent:
    return fresh_intent(f"report-{key}", key, "huge_report", {"for": key})


@pytest.mark.timeout(240)
async def test_a_result_too_large_for_a_record_is_answered_as_an_error_once(
    settings: Settings, catalog: Catalog, tmp_path: Path
) -> None:
    ledger = tmp_path / "tools.jsonl"
    env = process_env(settings, TOOL_LEDGER=str(ledger), KEYLANE_DATA_DIR=str(tmp_path / "effector"))
    args = ["effector", "--tools", "tests.integration.test_oversize_result"]
    intent = report_intent("acct-1")
    record = (intent.entity_key.encode(), encode(intent))

    first = KeylaneProcess(args, env, tmp_path / "first.log")
    with running(first):
        await produce(settings, catalog.name(INTENTS), [record])
        results = await wait_results(settings, catalog, {intent.intent_id}, timeout_s=60)
        await wait_until(lambda: tool_runs(ledger) == 1, timeout_s=10, what="the tool ran")
        assert first.running, f"the effector kept going:\n{first.tail()}"

    answer = decode(results[intent.intent_id], ToolResult)
    assert answer.status == "ERROR"
    assert answer.error is not None and "bytes" in answer.error and "limit" in answer.error, answer.error

    port = free_port()
    second = KeylaneProcess(args, {**env, "KEYLANE_METRICS_PORT": str(port)}, tmp_path / "second.log")
    with running(second):  # a copy of the intent: the recorded answer again, nothing run
        await produce(settings, catalog.name(INTENTS), [record])
        deadline = time.monotonic() + 60
        while await metric(port, "keylane_effector_republished_total") < 1:
            assert time.monotonic() < deadline, f"the copy was never answered:\n{second.tail()}"
            await asyncio.sleep(0.5)
    assert tool_runs(ledger) == 1, "the tool ran once"
