"""Garbage on every input topic becomes an agent.errors record with its raw bytes and origin;
the worker goes on with the next good record; the metric identities hold."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path

import pytest

from keylane.catalog import APPROVALS, ERRORS, EVENTS, INTENTS, OUTPUT, RESULTS, Catalog
from keylane.config import Settings
from keylane.kafka.topic_reader import read_to_end
from keylane.testing.processes import free_port
from keylane.wire import AgentEnvelope, Approval, ErrorRecord, ToolResult, decode, encode
from tests.integration.test_worker import http_get
from tests.kafka_io import produce, wait_for_records
from tests.processes import KeylaneProcess, process_env, running

pytestmark = pytest.mark.kafka

BAD_VALUES = {
    b"\x00\xffnot json at all": "not a valid",
    b'{"v":1,"payload":"trunc': "truncated",
    b'{"v":99,"payload":"from the future","intent_id":"x","entity_key":"bad","status":"OK"}': (
        "unknown schema version 99"
    ),
}


def metric_total(body: str, name: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in body.splitlines()
        if line.startswith(name + "{") or line.startswith(name + " ")
    )


async def test_malformed_records_are_dead_lettered_and_the_worker_goes_on(
    settings: Settings, catalog: Catalog, tmp_path: Path
) -> None:
    port = free_port()
    env = process_env(
        settings, LLM_LEDGER=str(tmp_path / "llm.jsonl"), TOOL_LEDGER=str(tmp_path / "tools.jsonl")
    )
    worker = KeylaneProcess(
        ["worker", "--agent", "tests.agents.flow:act_then_complete"],
        {**env, "KEYLANE_METRICS_PORT": str(port)},
        tmp_path / "worker.log",
    )
    effector = KeylaneProcess(["effector", "--tools", "tests.agents.flow"], env, tmp_path / "effector.log")
    good = {
        EVENTS: (b"good-1", encode(AgentEnvelope(payload="fine"))),
        RESULTS: (b"nobody", encode(ToolResult(intent_id="i-1", entity_key="nobody", status="OK"))),
        APPROVALS: (
            b"nobody",
            encode(Approval(intent_id="i-2", entity_key="nobody", approved=True, approver="ann")),
        ),
    }

    with running(effector, worker):
        for topic in (EVENTS, RESULTS, APPROVALS):
            await produce(settings, catalog.name(topic), [(b"bad", value) for value in BAD_VALUES])
            await produce(settings, catalog.name(topic), [good[topic]])
        await produce(settings, catalog.name(EVENTS), [(None, b'{"v":1,"payload":"keyless"}')])
        expected_errors = 3 * len(BAD_VALUES) + 2 + 1  # malformed, two orphans, the keyless event
        errors = await wait_for_records(
            settings, catalog.name(ERRORS), lambda rs: len(rs) >= expected_errors, timeout_s=90
        )
        outputs = await wait_for_records(
            settings, catalog.name(OUTPUT), lambda rs: len(rs) >= 1, timeout_s=60
        )
        _, body = await asyncio.to_thread(http_get, f"http://127.0.0.1:{port}/metrics")
        intents = await read_to_end(settings, catalog.name(INTENTS))

    assert [r.key for r in outputs] == [b"good-1"], "the good event after the garbage was processed"
    records = [decode(r.value, ErrorRecord) for r in errors]
    assert len(records) == expected_errors
    malformed = [e for e in records if e.reason == "malformed_record"]
    for topic in (EVENTS, RESULTS, APPROVALS):
        on_topic = [
            e for e in malformed if e.origin and e.origin.topic == catalog.name(topic) and e.raw_key_b64
        ]
        kept = {base64.b64decode(e.raw_value_b64 or "") for e in on_topic}
        assert kept == set(BAD_VALUES), f"raw bytes of every bad record on {topic} are kept"
        for error in on_topic:
            value = base64.b64decode(error.raw_value_b64 or "")
            assert error.origin is not None and error.origin.offset >= 0
            if value.startswith(b'{"v":99'):
                assert error.detail == "unknown schema version 99"
    keyless = [e for e in malformed if e.raw_key_b64 is None]
    assert [e.detail for e in keyless] == ["record has no key (the entity key)"]
    orphans = sorted(
        (e.origin.topic if e.origin else "", e.detail) for e in records if e.reason == "orphaned_result"
    )
    assert orphans == [
        (catalog.name(APPROVALS), "no_continuation"),
        (catalog.name(RESULTS), "no_continuation"),
    ]

    assert metric_total(body, "keylane_intents_emitted_total") == len(intents) == 1
    dead_letters = metric_total(body, "keylane_agent_errors_total") + metric_total(
        body, "keylane_orphaned_results_total"
    )
    assert dead_letters == len(errors)
