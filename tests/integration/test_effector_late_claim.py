"""A claim from a former owner of an intents partition never replaces its successor's Done.

An effector that stood still past its session timeout keeps its producer: a claim it had on
its way lands in the claims changelog after the next owner recorded Done for the intent.
Restored without owner epochs, the late claim would be the intent's state: a copy of the
intent would find it in doubt, and this ``in_doubt="rerun"`` tool would run a second time
with a second answer. The late claim is put on the changelog the way the former owner's
producer would (a claim under the epoch before the owner's); an effector with a fresh volume
restores the table, answers the copy from Done, counts the skipped write and writes the
intent's Done again, so compaction keeps it.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import msgspec
import pytest

from keylane.catalog import INTENTS, Catalog
from keylane.config import Settings
from keylane.kafka.topic_reader import TopicRecord, read_to_end
from keylane.stages.effector.claims import ClaimRecord
from keylane.stages.effector.service import CLAIMS_TABLE
from keylane.testing.processes import free_port
from keylane.wire import ToolResult, decode, encode
from tests.integration.stream_checks import tool_runs
from tests.integration.test_effector_done_rewrite import answers
from tests.integration.test_effector_rebalance import fresh_intent
from tests.integration.test_redelivery import metric
from tests.kafka_io import produce
from tests.processes import KeylaneProcess, process_env, running

pytestmark = pytest.mark.kafka

ARGS = ["effector", "--tools", "tests.integration.test_effector_done_rewrite"]


def claims_of(records: list[TopicRecord], key: bytes) -> list[ClaimRecord]:
    """The claim records of ``key`` in a claims changelog, in order."""
    return [msgspec.msgpack.decode(r.value, type=ClaimRecord) for r in records if r.key == key and r.value]


@pytest.mark.timeout(300)
async def test_a_former_owners_late_claim_never_replaces_the_successors_done(
    settings: Settings, catalog: Catalog, tmp_path: Path
) -> None:
    ledger = tmp_path / "tools.jsonl"
    env = process_env(settings, TOOL_LEDGER=str(ledger))
    volume = tmp_path / "volume"
    changelog = f"{settings.app_id}-effector-{CLAIMS_TABLE}-changelog"
    intent = fresh_intent("stamp-late", "inv-9#0", "stamp_invoice", {"invoice": 9})
    record = (intent.entity_key.encode(), encode(intent))
    key = intent.intent_id.encode()

    owner = KeylaneProcess(ARGS, {**env, "KEYLANE_DATA_DIR": str(volume)}, tmp_path / "owner.log")
    with running(owner):
        await produce(settings, catalog.name(INTENTS), [record])
        (answer,) = await answers(settings, catalog, intent.intent_id, 1)
    assert tool_runs(ledger) == 1

    written = claims_of(await read_to_end(settings, changelog), key)
    assert [c.state for c in written] == ["claimed", "done"]
    owners_epoch = written[-1].epoch
    assert owners_epoch >= 1 and written[0].epoch == owners_epoch
    # The former owner's claim, on its way while it stood still: its lease long over.
    now_ms = time.time_ns() // 1_000_000
    late = ClaimRecord(
        state="claimed",
        claimed_at_ms=now_ms - 600_000,
        lease_until_ms=now_ms - 500_000,
        epoch=owners_epoch - 1,
    )
    await produce(settings, changelog, [(key, msgspec.msgpack.encode(late))])
    shutil.rmtree(volume)  # the next effector restores the partition from the changelog

    port = free_port()
    successor = KeylaneProcess(
        ARGS,
        {**env, "KEYLANE_DATA_DIR": str(volume), "KEYLANE_METRICS_PORT": str(port)},
        tmp_path / "successor.log",
    )
    with running(successor):
        await produce(settings, catalog.name(INTENTS), [record])  # a copy of the intent
        every = await answers(settings, catalog, intent.intent_id, 2)
        assert tool_runs(ledger) == 1, "the tool's ledger holds one run"
        assert set(every) == {answer}, "the copy got the recorded answer, byte for byte"
        # Written again once the successor's recovery is done, and counted.
        await _until_counted(port)
        after = claims_of(await read_to_end(settings, changelog), key)

    assert tool_runs(ledger) == 1
    assert decode(answer, ToolResult).status == "OK"
    # After the late claim: the copy's Done (republished from the store) and the rewrite, in
    # either order; both the successor's, so the record compaction keeps is a Done.
    assert [(c.state, c.result) for c in after[3:]] == [("done", answer)] * 2
    assert all(c.epoch >= owners_epoch for c in after[3:])
    assert "is a former owner's late write" in (tmp_path / "successor.log").read_text()


async def _until_counted(port: int) -> None:
    """Until the successor counted the skipped late claim it wrote over."""
    deadline = asyncio.get_running_loop().time() + 60
    while await metric(port, "keylane_stale_state_writes_total") < 1:
        assert asyncio.get_running_loop().time() < deadline, "the late claim was never written over"
        await asyncio.sleep(0.3)
    assert await metric(port, "keylane_stale_state_writes_total") == 1
