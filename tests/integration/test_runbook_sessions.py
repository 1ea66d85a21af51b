"""docs/operations.md's cancel and dead-letter sessions, run against a real worker: each
command prints what the page shows (tests/integration/doc_sessions.py). The pause session
runs in tests/integration/test_pause.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from keylane.catalog import APPROVAL_REQUESTS, EVENTS, OUTPUT, Catalog
from keylane.config import Settings
from keylane.wire import AgentEnvelope, encode
from tests.integration.doc_sessions import run_session
from tests.kafka_io import produce, wait_for_records
from tests.processes import KeylaneProcess, process_env, running

pytestmark = pytest.mark.kafka


@pytest.mark.timeout(300)
async def test_the_cancel_session_prints_what_docs_operations_shows(
    settings: Settings, catalog: Catalog, tmp_path: Path
) -> None:
    env = process_env(settings, HITL_WAIT_MS="600000")  # no deadline inside the test
    agent = [
        "worker",
        "--agent",
        "tests.agents.approval:ask_first",
        "--config",
        "tests.agents.approval:config",
    ]
    with running(KeylaneProcess(agent, env, tmp_path / "worker.log")):
        event = encode(AgentEnvelope(payload="refund order-9"))
        await produce(settings, catalog.name(EVENTS), [(b"customer-9", event)])
        await wait_for_records(settings, catalog.name(APPROVAL_REQUESTS), lambda rs: len(rs) == 1)
        await run_session("## Cancelling a key's suspension", settings, env)
        denied = await wait_for_records(settings, catalog.name(OUTPUT), lambda rs: len(rs) == 1)
    assert [r.key for r in denied] == [b"customer-9"]


@pytest.mark.timeout(300)
@pytest.mark.usefixtures("catalog")  # the deployment's topics
async def test_the_dead_letter_session_prints_what_docs_operations_shows(
    settings: Settings, tmp_path: Path
) -> None:
    env = process_env(settings, LLM_LEDGER=str(tmp_path / "llm.jsonl"))
    with running(
        KeylaneProcess(["worker", "--agent", "tests.agents.flow:remember"], env, tmp_path / "worker.log")
    ):
        await run_session("## Dead letters: list, show, re-drive", settings, env)
