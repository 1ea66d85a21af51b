"""A tool intent leaves only once Kafka confirmed the state that waits for its result
(service/keylane/stages/agent.py, step 5).

The worker (tests/integration/held_changelog_probe.py, holding at the delivery) writes the
state of an activation that suspends on a tool: its changelog record is handed to the producer
and not confirmed, as a record is while its partition's leader moves. The intent must not be in
Kafka meanwhile. The worker is then killed -9, so that record never lands. Had the intent left,
the effector would have run it and answered, and the restarted worker, which restores the
state from before the activation, could read that answer before it re-runs the event: an
``orphaned_result`` (``no_continuation``) on agent.errors, as the broker failover chaos saw.
Checked at the end: the event's tool ran once, its output is there once, and nothing is on
agent.errors.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from keylane.catalog import ERRORS, EVENTS, INTENTS, Catalog
from keylane.config import Settings
from keylane.kafka.topic_reader import read_to_end
from keylane.wire import AgentEnvelope, encode
from tests.integration.stream_checks import outputs_by_id, tool_runs, wait_until
from tests.integration.test_resume_position import commits_reach_the_end
from tests.kafka_io import produce
from tests.processes import KeylaneProcess, process_env, running

pytestmark = pytest.mark.kafka

KEY = b"waits-for-its-state"
AGENT = ["worker", "--agent", "tests.agents.flow:act_then_complete"]
UNCONFIRMED_FOR_S = 3.0
"""How long the state stays unconfirmed before the kill: an intent sent beside it would be in
Kafka, and run by the effector, well within it."""


def event(name: str) -> tuple[bytes, bytes]:
    return KEY, encode(AgentEnvelope(payload=name))


@pytest.mark.timeout(300)
async def test_no_intent_leaves_before_the_state_that_waits_for_its_result(
    settings: Settings, catalog: Catalog, tmp_path: Path
) -> None:
    hold, release, held_log = tmp_path / "hold", tmp_path / "release", tmp_path / "held.log"
    tool_ledger = tmp_path / "tools.jsonl"
    env = process_env(
        settings,
        LLM_LEDGER=str(tmp_path / "llm.jsonl"),
        TOOL_LEDGER=str(tool_ledger),
        HOLD_CHANGELOG=str(hold),
        RELEASE_CHANGELOG=str(release),
        HELD_CHANGELOG_LOG=str(held_log),
        HELD_CHANGELOG_AT="delivery",
    )
    effector = KeylaneProcess(["effector", "--tools", "tests.agents.flow"], env, tmp_path / "effector.log")
    held = KeylaneProcess(
        AGENT,
        {**env, "KEYLANE_DATA_DIR": str(tmp_path / "volume-held")},
        tmp_path / "held-worker.log",
        module="tests.integration.held_changelog_probe",
    )
    successor = KeylaneProcess(
        AGENT, {**env, "KEYLANE_DATA_DIR": str(tmp_path / "volume-successor")}, tmp_path / "successor.log"
    )
    intents = catalog.name(INTENTS)
    with running(effector):
        held.start()
        try:
            await produce(settings, catalog.name(EVENTS), [event("first")])  # the worker is ready
            await wait_until(lambda: tool_runs(tool_ledger) == 1, timeout_s=90, what="the first tool run")
            await outputs_by_id(settings, catalog, 1, timeout_s=60)
            sent_before = len(await read_to_end(settings, intents))

            hold.touch()
            await produce(settings, catalog.name(EVENTS), [event("second")])
            await wait_until(
                lambda: held_log.exists() and repr(KEY) in held_log.read_text(),
                timeout_s=60,
                what="the suspending activation's state write to be held",
            )
            await asyncio.sleep(UNCONFIRMED_FOR_S)
            early = await read_to_end(settings, intents)
            assert len(early) == sent_before, (
                "an intent left while the state that waits for its result was unconfirmed: "
                f"{[r.value for r in early[sent_before:]]}"
            )
            assert tool_runs(tool_ledger) == 1
            held.kill9()  # the held state write dies with it
        finally:
            if held.running:
                held.kill9()

        with running(successor):
            outputs = await outputs_by_id(settings, catalog, 2, timeout_s=120)
            await wait_until(lambda: tool_runs(tool_ledger) >= 2, timeout_s=60, what="the second tool run")
            await commits_reach_the_end(settings, catalog)

    events = sorted(json.loads(next(iter(values)))["event"] for values in outputs.values())
    assert events == ["first", "second"]
    assert all(len(values) == 1 for values in outputs.values())
    ledger = [json.loads(line)["event"] for line in tool_ledger.read_text().splitlines()]
    assert ledger == ["first", "second"], "each intent ran once"
    errors = await read_to_end(settings, catalog.name(ERRORS))
    assert errors == [], [r.value for r in errors]
