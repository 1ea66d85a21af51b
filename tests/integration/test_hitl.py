"""Approvals, denials and fail-closed timeouts through real topics, with the real CLI and kcat."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
from pathlib import Path

import pytest

from keylane.catalog import APPROVAL_REQUESTS, APPROVALS, ERRORS, EVENTS, OUTPUT, Catalog
from keylane.config import Settings
from keylane.kafka.topic_reader import TopicRecord, read_to_end
from keylane.wire import AgentEnvelope, Approval, ApprovalRequest, ErrorRecord, decode, encode
from tests.kafka_io import kcat_produce, produce, wait_for_records
from tests.processes import KeylaneProcess, keylane_cli, process_env, running

pytestmark = pytest.mark.kafka

AGENT = ["worker", "--agent", "tests.agents.approval:ask_first"]


keylane = keylane_cli


def by_key(records: list[TopicRecord]) -> dict[bytes, list[bytes]]:
    grouped: dict[bytes, list[bytes]] = {}
    for record in records:
        assert record.key is not None and record.value is not None
        grouped.setdefault(record.key, []).append(record.value)
    return grouped


async def requests_for(settings: Settings, catalog: Catalog, count: int) -> dict[str, ApprovalRequest]:
    records = await wait_for_records(
        settings, catalog.name(APPROVAL_REQUESTS), lambda rs: len(rs) >= count, timeout_s=60
    )
    requests = [decode(r.value, ApprovalRequest) for r in records]
    return {r.entity_key: r for r in requests}


async def test_approve_deny_kcat_and_every_timeout_fallback(
    settings: Settings, catalog: Catalog, tmp_path: Path
) -> None:
    keys = ["approve-1", "reject-1", "kcat-1", "deny-timeout-1", "drop-1", "escalate-1"]
    env = process_env(settings, HITL_WAIT_MS="5000")
    with running(KeylaneProcess(AGENT, env, tmp_path / "worker.log")):
        await produce(
            settings, catalog.name(EVENTS), [(k.encode(), encode(AgentEnvelope(payload=k))) for k in keys]
        )
        requests = await requests_for(settings, catalog, len(keys))

        listed = keylane(settings, "approvals", "list")
        assert listed.returncode == 0, listed.stderr
        assert f"{len(keys)} pending of {len(keys)} requests" in listed.stdout
        assert requests["approve-1"].intent_id in listed.stdout

        approved = keylane(
            settings,
            "approve",
            "--key",
            "approve-1",
            "--intent",
            requests["approve-1"].intent_id,
            "--approver",
            "ann",
        )
        denied = keylane(
            settings,
            "approve",
            "--key",
            "reject-1",
            "--intent",
            requests["reject-1"].intent_id,
            "--approver",
            "bob",
            "--deny",
            "--reason",
            "too much",
        )
        assert approved.returncode == 0 and approved.stdout.startswith("approved "), approved.stderr
        assert denied.returncode == 0 and denied.stdout.startswith("denied "), denied.stderr
        # kcat's default partitioner is not murmur2: the worker must re-route this one.
        kcat_approval = Approval(
            intent_id=requests["kcat-1"].intent_id, entity_key="kcat-1", approved=True, approver="kcat"
        )
        kcat_produce(settings, catalog.name(APPROVALS), b"kcat-1|" + encode(kcat_approval) + b"\n")

        outputs = await wait_for_records(
            settings, catalog.name(OUTPUT), lambda rs: len(rs) >= 4, timeout_s=60
        )
        await requests_for(settings, catalog, len(keys) + 1)
        second = [
            r
            for r in (
                decode(x.value, ApprovalRequest)
                for x in await read_to_end(settings, catalog.name(APPROVAL_REQUESTS))
            )
            if r.channel == "managers"
        ]
        assert [r.entity_key for r in second] == ["escalate-1"], "escalate-1 was escalated once"
        escalated = keylane(
            settings,
            "approve",
            "--key",
            "escalate-1",
            "--intent",
            second[0].intent_id,
            "--approver",
            "manager",
        )
        assert escalated.returncode == 0, escalated.stderr
        outputs = await wait_for_records(
            settings, catalog.name(OUTPUT), lambda rs: len(rs) >= 5, timeout_s=60
        )
        errors = await wait_for_records(settings, catalog.name(ERRORS), lambda rs: len(rs) >= 1, timeout_s=60)
    assert requests["escalate-1"].channel == "approval"

    assert by_key(outputs) == {
        b"approve-1": [b"approved by ann"],
        b"reject-1": [b"denied by bob"],
        b"kcat-1": [b"approved by kcat"],
        b"deny-timeout-1": [b"__hitl_timeout__"],
        b"escalate-1": [b"approved by manager"],
    }
    [dropped] = [decode(r.value, ErrorRecord) for r in errors]
    assert (dropped.reason, dropped.entity_key) == ("hitl_timeout", "drop-1")


async def test_a_deadline_survives_kill_9_and_fires_once(
    settings: Settings, catalog: Catalog, tmp_path: Path
) -> None:
    env = process_env(settings, HITL_WAIT_MS="8000")
    first = KeylaneProcess(AGENT, env, tmp_path / "first.log").start()
    await produce(settings, catalog.name(EVENTS), [(b"lonely-1", encode(AgentEnvelope(payload="x")))])
    await requests_for(settings, catalog, 1)
    changelog = f"{settings.app_id}-keylane-state-changelog"
    await wait_for_records(
        settings, changelog, lambda rs: len(rs) >= 1, timeout_s=30
    )  # suspension is durable
    first.kill9()

    with running(KeylaneProcess(AGENT, env, tmp_path / "second.log")):
        outputs = await wait_for_records(
            settings, catalog.name(OUTPUT), lambda rs: len(rs) >= 1, timeout_s=90
        )
        await asyncio.sleep(3)  # any second fire would be applied within this scan period
        outputs = await read_to_end(settings, catalog.name(OUTPUT))

    assert {r.record_id for r in outputs} == {outputs[0].record_id}, "one fallback, however often it was sent"
    assert outputs[0].value == b"__hitl_timeout__"


def refused(result: subprocess.CompletedProcess[str]) -> str:
    """The one line a refused `keylane` command printed: exit 1, nothing on stdout, no traceback."""
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    assert (result.returncode, result.stdout) == (1, ""), result
    [line] = result.stderr.splitlines()
    return line


async def test_approve_refuses_what_resumes_nothing_and_the_list_shows_what_the_agent_saw(
    settings: Settings, catalog: Catalog, tmp_path: Path
) -> None:
    """Issue 22: a wrong intent, a wrong key, a decided request and a timed-out one are each
    refused in one line; --force sends anyway; `approvals list --all` shows the first decision
    before the deadline, not the last one sent."""
    env = process_env(settings, HITL_WAIT_MS="3000")
    with running(KeylaneProcess(AGENT, env, tmp_path / "worker.log")):
        keys = ["approve-1", "late-1"]  # approve-1 waits two minutes, late-1 three seconds
        await produce(
            settings, catalog.name(EVENTS), [(k.encode(), encode(AgentEnvelope(payload=k))) for k in keys]
        )
        requests = await requests_for(settings, catalog, len(keys))
        asked, late = requests["approve-1"].intent_id, requests["late-1"].intent_id

        def approve(key: str, intent: str, *args: str) -> subprocess.CompletedProcess[str]:
            return keylane(settings, "approve", "--key", key, "--intent", intent, *args)

        assert refused(approve("approve-1", "not-a-uuid", "--approver", "me")) == (
            "keylane: no approval request for intent not-a-uuid on key approve-1; 'keylane approvals "
            "list' shows the waiting ones, --force sends the decision anyway"
        )
        assert refused(approve("approve-2", asked, "--approver", "me")).startswith(
            f"keylane: intent {asked} was requested on key approve-1, not approve-2: run again with "
            "--key approve-1"
        )
        approved = approve("approve-1", asked, "--approver", "ann")
        assert approved.returncode == 0, approved.stderr
        assert approved.stdout.startswith(f"approved {asked} for approve-1 by ann, ")
        assert approved.stdout.rstrip().endswith("before its deadline")
        again = refused(approve("approve-1", asked, "--approver", "bob", "--deny"))
        assert again.startswith(f"keylane: request {asked} on key approve-1 was already approved by ann at ")
        forced = approve("approve-1", asked, "--approver", "bob", "--deny", "--force")
        assert (forced.returncode, forced.stdout) == (0, f"denied {asked} for approve-1 by bob\n"), forced

        outputs = await wait_for_records(settings, catalog.name(OUTPUT), lambda rs: len(rs) >= 2)
        timed_out = refused(approve("late-1", late, "--approver", "carl"))
        assert timed_out.startswith(f"keylane: the deadline of request {late} on key late-1 passed at ")
        assert timed_out.endswith(
            "the agent already took its timeout path (its HITL policy), so this decision would be "
            "ignored; --force sends the decision anyway"
        )
        assert approve("late-1", late, "--approver", "carl", "--force").returncode == 0
        errors = await wait_for_records(settings, catalog.name(ERRORS), lambda rs: len(rs) >= 1)

        listed = keylane(settings, "approvals", "list", "--all")
        as_json = keylane(settings, "approvals", "list", "--all", "--json")

    assert by_key(outputs) == {b"approve-1": [b"approved by ann"], b"late-1": [b"__hitl_timeout__"]}
    [orphan] = [decode(r.value, ErrorRecord) for r in errors]
    assert (orphan.reason, orphan.detail, orphan.intent_id) == ("orphaned_result", "no_continuation", late)

    assert listed.returncode == 0, listed.stderr
    rows = {line.split()[0]: line for line in listed.stdout.splitlines()[1:-1]}
    assert rows["approve-1"].split()[3] == "approved"
    assert "by ann; later denial by bob ignored" in rows["approve-1"]
    assert rows["late-1"].split()[3] == "expired"
    assert re.search(r"approved by carl [\d.]+ s after the deadline: ignored", rows["late-1"])
    assert listed.stdout.splitlines()[-1] == "0 pending of 2 requests"

    assert as_json.returncode == 0, as_json.stderr
    shown = {o["key"]: o for o in map(json.loads, as_json.stdout.splitlines())}
    assert shown["approve-1"]["status"] == "approved"
    assert shown["approve-1"]["decision"]["approver"] == "ann"
    assert shown["approve-1"]["notes"] == ["by ann", "later denial by bob ignored"]
    assert (shown["late-1"]["status"], shown["late-1"]["decision"]) == ("expired", None)


def test_approve_without_the_topics_says_how_to_create_them(settings: Settings) -> None:
    result = keylane(settings, "approve", "--key", "k", "--intent", "i", "--approver", "me")

    assert refused(result) == (
        f"keylane: topic {settings.topic_prefix}agent.approval-requests does not exist: 'keylane topics "
        "apply' creates it (or set the --topic-prefix / KEYLANE_TOPIC_PREFIX the agent runs with)"
    )
