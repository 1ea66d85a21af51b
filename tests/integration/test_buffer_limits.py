"""The per-key queue behind a suspension, through real topics: what does not fit is a dead
letter on agent.errors, what fits runs in order once the approval comes.

The worker runs this module's agent and config (``--agent tests.integration.test_buffer_limits:ask_first``).
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from keylane import ActivationContext, AgentConfig, Complete, Suspend
from keylane.catalog import APPROVAL_REQUESTS, APPROVALS, ERRORS, EVENTS, OUTPUT, Catalog
from keylane.config import Settings
from keylane.wire import AgentEnvelope, Approval, ApprovalRequest, ErrorRecord, decode, encode
from tests.kafka_io import produce, wait_for_records
from tests.processes import KeylaneProcess, process_env, running

pytestmark = pytest.mark.kafka

config = AgentConfig(max_buffered_events=3)


async def ask_first(ctx: ActivationContext) -> Complete | Suspend:
    """Asks for an approval on "ask"; echoes any other event."""
    if ctx.is_resume:
        return Complete(b"approved")
    if ctx.event == b"ask":
        ctx.request_approval(json.dumps({"why": "test"}))
        return Suspend()
    return Complete(b"ran " + ctx.event)


async def test_events_past_the_queue_cap_are_dead_lettered_and_the_queued_ones_run_after_the_approval(
    settings: Settings, catalog: Catalog, tmp_path: Path
) -> None:
    key = b"queue-1"
    events = [encode(AgentEnvelope(payload=p)) for p in ["ask", "e1", "e2", "e3", "e4", "e5"]]
    agent = ["worker", "--agent", "tests.integration.test_buffer_limits:ask_first"]
    with running(KeylaneProcess(agent, process_env(settings), tmp_path / "worker.log")):
        await produce(settings, catalog.name(EVENTS), [(key, events[0])])
        [request_record] = await wait_for_records(
            settings, catalog.name(APPROVAL_REQUESTS), lambda rs: len(rs) >= 1, timeout_s=60
        )
        request = decode(request_record.value, ApprovalRequest)
        await produce(settings, catalog.name(EVENTS), [(key, value) for value in events[1:]])
        error_records = await wait_for_records(
            settings, catalog.name(ERRORS), lambda rs: len(rs) >= 2, timeout_s=60
        )
        approval = Approval(
            intent_id=request.intent_id, entity_key=key.decode(), approved=True, approver="ops"
        )
        await produce(settings, catalog.name(APPROVALS), [(key, encode(approval))])
        outputs = await wait_for_records(
            settings, catalog.name(OUTPUT), lambda rs: len(rs) >= 4, timeout_s=60
        )

    assert [r.value for r in outputs] == [b"approved", b"ran e1", b"ran e2", b"ran e3"]
    errors = [decode(r.value, ErrorRecord) for r in error_records]
    assert [e.reason for e in errors] == ["buffer_full", "buffer_full"]
    assert [base64.b64decode(e.raw_value_b64 or "") for e in errors] == events[4:]
    assert all("max_buffered_events=3" in e.detail for e in errors)
    assert all(e.origin is not None and e.origin.topic == catalog.name(EVENTS) for e in errors)
