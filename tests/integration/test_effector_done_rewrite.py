"""A Done claim the effector finds in its local store is written again, and confirmed by
Kafka, before its result is republished: a kill -9 between the local Done put and its
changelog record must not leave a changelog that still ends at "claimed".

The first effector is frozen right after its local Done put, before the changelog record
leaves the producer (tests/integration/done_kill_probe.py), and killed with SIGKILL. Restarted
on the same data dir it finds Done locally and republishes the result. Then the partition
moves to an effector with a fresh data dir, which restores the claim table from the
changelog, and a copy of the intent arrives: it must be answered from Done.

Before the fix the restarted effector republished without writing Done again; the new owner
restored "claimed", waited out the lease, found the intent in doubt and, for this
``in_doubt="rerun"`` tool, ran it a second time with a second, different result.
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
from tests.integration.test_effector_rebalance import fresh_intent
from tests.kafka_io import produce
from tests.processes import KeylaneProcess, process_env, running

pytestmark = pytest.mark.kafka

TOOL_TIMEOUT_S = 2  # a lease of 32 s: the new owner's wait for an in-doubt claim stays short


@tool("stamp_invoice", side_effect=True, in_doubt="rerun", timeout_s=TOOL_TIMEOUT_S)
def stamp_invoice(args: dict[str, Any]) -> dict[str, Any]:
    """Each run is one ledger line and a result of its own (the run number)."""
    append_ledger("TOOL_LEDGER", args)
    return {"stamped": args["invoice"], "run": tool_runs(Path(os.environ["TOOL_LEDGER"]))}


async def answers(settings: Settings, catalog: Catalog, intent_id: str, count: int) -> list[bytes]:
    """The results published for ``intent_id``, once there are at least ``count``."""
    deadline = asyncio.get_running_loop().time() + 90
    while True:
        found = [
            r.value
            for r in await read_to_end(settings, catalog.name(RESULTS))
            if r.record_id == intent_id and r.value is not None
        ]
        if len(found) >= count:
            return found
        assert asyncio.get_running_loop().time() < deadline, f"{len(found)} of {count} answers"
        await asyncio.sleep(0.3)


@pytest.mark.timeout(300)
async def test_a_done_found_locally_is_rewritten_before_it_is_republished(
    settings: Settings, catalog: Catalog, tmp_path: Path
) -> None:
    ledger = tmp_path / "tools.jsonl"
    marker = tmp_path / "frozen"
    env = process_env(settings, TOOL_LEDGER=str(ledger), DONE_FREEZE_MARKER=str(marker))
    args = ["effector", "--tools", "tests.integration.test_effector_done_rewrite"]
    probe = "tests.integration.done_kill_probe"
    volume = {"KEYLANE_DATA_DIR": str(tmp_path / "volume")}
    intent = fresh_intent("stamp-1", "inv-1#0", "stamp_invoice", {"invoice": 1})
    record = (intent.entity_key.encode(), encode(intent))

    first = KeylaneProcess(args, {**env, **volume}, tmp_path / "first.log", module=probe).start()
    try:
        await produce(settings, catalog.name(INTENTS), [record])
        await wait_until(marker.exists, timeout_s=60, what="the local Done put")
    finally:
        first.kill9()
    assert tool_runs(ledger) == 1

    restarted = KeylaneProcess(args, {**env, **volume}, tmp_path / "restarted.log", module=probe)
    with running(restarted):  # same volume: Done is found locally and republished
        republished = (await answers(settings, catalog, intent.intent_id, 1))[0]
        assert tool_runs(ledger) == 1, "found Done locally: not run again"

    fresh = {"KEYLANE_DATA_DIR": str(tmp_path / "fresh")}
    owner = KeylaneProcess(args, {**env, **fresh}, tmp_path / "owner.log", module=probe)
    with running(owner):  # the partition's next owner restores the claim table from the changelog
        await produce(settings, catalog.name(INTENTS), [record])  # a copy of the intent
        every = await answers(settings, catalog, intent.intent_id, 2)

    assert tool_runs(ledger) == 1, "the tool's ledger holds one run"
    assert set(every) == {republished}, "the copy got the recorded answer, byte for byte"
    assert decode(republished, ToolResult).status == "OK"
