"""Signatures through real topics: under `require`, a forged intent never runs and an unsigned
approval never resumes; what keylane itself signed goes through."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from keylane.catalog import APPROVAL_REQUESTS, APPROVALS, ERRORS, EVENTS, INTENTS, OUTPUT, Catalog
from keylane.config import Settings
from keylane.signing import Keyring
from keylane.wire import AgentEnvelope, Approval, ApprovalRequest, ErrorRecord, ToolIntent, decode, encode
from tests.broker import REPO
from tests.kafka_io import kcat_produce, produce, wait_for_records
from tests.processes import KeylaneProcess, process_env, running

pytestmark = pytest.mark.kafka

KEYS = "2026-11:current-secret,2026-10:previous-secret"


def forged(intent_id: str, key: str) -> ToolIntent:
    return ToolIntent(
        intent_id=intent_id,
        entity_key=key,
        seq=0,
        step_index=0,
        tool="record_event",
        args_json=f'{{"key": "{key}", "event": "forged"}}',
        created_at_ms=1,
        expires_at_ms=2**62,
    )


async def test_under_require_a_forged_intent_never_runs(
    settings: Settings, catalog: Catalog, tmp_path: Path
) -> None:
    ledger = tmp_path / "tools.jsonl"
    env = process_env(
        settings,
        KEYLANE_SIGNING_KEYS=KEYS,
        KEYLANE_INTENT_SIGNATURES="require",
        LLM_LEDGER=str(tmp_path / "llm.jsonl"),
        TOOL_LEDGER=str(ledger),
    )
    worker = KeylaneProcess(
        ["worker", "--agent", "tests.agents.flow:act_then_complete"], env, tmp_path / "w.log"
    )
    effector = KeylaneProcess(["effector", "--tools", "tests.agents.flow"], env, tmp_path / "e.log")

    with running(effector, worker):
        await produce(
            settings,
            catalog.name(INTENTS),
            [
                (b"mallory", encode(forged("f-unsigned", "mallory"))),
                (b"mallory", encode(Keyring.parse("2026-11:guessed").sign(forged("f-badsig", "mallory")))),
            ],
        )
        await produce(settings, catalog.name(EVENTS), [(b"alice", encode(AgentEnvelope(payload="genuine")))])
        await wait_for_records(settings, catalog.name(OUTPUT), lambda rs: len(rs) >= 1, timeout_s=60)
        errors = await wait_for_records(settings, catalog.name(ERRORS), lambda rs: len(rs) >= 2, timeout_s=60)

    refused = sorted(
        (e.reason, e.intent_id, e.detail.split(":")[0])
        for e in (decode(r.value, ErrorRecord) for r in errors)
    )
    assert refused == [
        ("unsigned_intent", "f-badsig", "bad_signature"),
        ("unsigned_intent", "f-unsigned", "unsigned"),
    ]
    assert ledger.read_text().splitlines() == ['{"event": "genuine", "key": "alice"}'], (
        "only the signed intent ran"
    )


async def test_under_require_only_signed_approvals_resume(
    settings: Settings, catalog: Catalog, tmp_path: Path
) -> None:
    env = process_env(
        settings, KEYLANE_SIGNING_KEYS=KEYS, KEYLANE_APPROVAL_SIGNATURES="require", HITL_WAIT_MS="60000"
    )
    worker = KeylaneProcess(["worker", "--agent", "tests.agents.approval:ask_first"], env, tmp_path / "w.log")
    with running(worker):
        await produce(settings, catalog.name(EVENTS), [(b"acct-9", encode(AgentEnvelope(payload="refund")))])
        [record] = await wait_for_records(settings, catalog.name(APPROVAL_REQUESTS), lambda rs: len(rs) >= 1)
        request = decode(record.value, ApprovalRequest)
        unsigned = Approval(
            intent_id=request.intent_id, entity_key="acct-9", approved=True, approver="mallory"
        )
        kcat_produce(settings, catalog.name(APPROVALS), b"acct-9|" + encode(unsigned) + b"\n")
        await wait_for_records(settings, catalog.name(ERRORS), lambda rs: len(rs) >= 1, timeout_s=60)
        approve = await asyncio.to_thread(
            subprocess.run,
            [
                sys.executable,
                "-m",
                "keylane.cli",
                "approve",
                "--key",
                "acct-9",
                "--intent",
                request.intent_id,
                "--approver",
                "ann",
            ],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert approve.returncode == 0 and "signed with key 2026-11" in approve.stdout, approve.stderr
        outputs = await wait_for_records(
            settings, catalog.name(OUTPUT), lambda rs: len(rs) >= 1, timeout_s=60
        )
        errors = await wait_for_records(settings, catalog.name(ERRORS), lambda rs: len(rs) >= 1)

    [error] = [decode(r.value, ErrorRecord) for r in errors]
    assert (error.reason, error.detail.split(":")[0]) == ("unsigned_approval", "unsigned")
    assert [r.value for r in outputs] == [b"approved by ann"]
