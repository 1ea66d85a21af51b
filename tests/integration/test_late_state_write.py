"""A state write from a partition's former owner that lands after its successor's (a worker
paused past its session timeout, or a job cancelled at a revocation with its write on the way)
never becomes the restored state: the restore skips it by owner epoch, counts it, and the
owner writes the key again so the changelog's last record for it is the owner's.

The late write is put on the changelog the way a former owner's producer would: the key's
state as it stood one input earlier, under an epoch below the owner's.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import msgspec
import pytest

from keylane.catalog import EVENTS, OUTPUT, Catalog
from keylane.config import Settings
from keylane.kafka.topic_reader import read_to_end
from keylane.stages.agent import STATE_TABLE
from keylane.testing.processes import free_port
from keylane.wire import AgentEnvelope, encode
from tests.integration.test_redelivery import by_id, metric
from tests.integration.test_resume_position import commits_reach_the_end
from tests.kafka_io import produce, wait_for_records
from tests.processes import KeylaneProcess, process_env, running

pytestmark = pytest.mark.kafka

KEY = b"late-write"
AGENT = ["worker", "--agent", "tests.agents.flow:remember"]


def event(n: int) -> tuple[bytes, bytes]:
    return KEY, encode(AgentEnvelope(payload=f"e{n}"))


@pytest.mark.timeout(300)
async def test_a_former_owners_late_state_write_never_becomes_the_restored_state(
    settings: Settings, catalog: Catalog, tmp_path: Path
) -> None:
    env = process_env(settings, LLM_LEDGER=str(tmp_path / "llm.jsonl"))
    volume = tmp_path / "volume"
    changelog = f"{settings.app_id}-{STATE_TABLE}-changelog"
    owner = KeylaneProcess(AGENT, {**env, "KEYLANE_DATA_DIR": str(volume)}, tmp_path / "owner.log")
    with running(owner):
        for n in (0, 1):  # one at a time: each gets its own state record
            await produce(settings, catalog.name(EVENTS), [event(n)])
            await wait_for_records(settings, catalog.name(OUTPUT), lambda rs, n=n: len(by_id(rs)) == n + 1)
        await commits_reach_the_end(settings, catalog)

    writes = [r for r in await read_to_end(settings, changelog) if r.key == KEY]
    assert len(writes) == 2
    after_e0 = msgspec.msgpack.decode(writes[0].value or b"")
    owners_epoch = msgspec.msgpack.decode(writes[1].value or b"").get("epoch", 1)
    # The former owner's write: the state after e0 only, under the epoch before the owner's.
    late = {**after_e0, "epoch": owners_epoch - 1}
    await produce(settings, changelog, [(KEY, msgspec.msgpack.encode(late))])
    shutil.rmtree(volume)  # the next worker restores the partition from the changelog

    port = free_port()
    successor = KeylaneProcess(
        AGENT,
        {**env, "KEYLANE_DATA_DIR": str(volume), "KEYLANE_METRICS_PORT": str(port)},
        tmp_path / "successor.log",
    )
    with running(successor):
        await produce(settings, catalog.name(EVENTS), [event(2)])
        outputs = await wait_for_records(settings, catalog.name(OUTPUT), lambda rs: len(by_id(rs)) == 3)
        by_event = {json.loads(r.value or b"")["event"]: json.loads(r.value or b"")["ring"] for r in outputs}
        assert by_event["e2"] == ["e0", "e1", "e2"], "the key's memory went back to the late write's"
        await commits_reach_the_end(settings, catalog)
        # Counted when the owner writes the key again, its first timer scan after recovery.
        after = await wait_for_records(
            settings, changelog, lambda rs: len([r for r in rs if r.key == KEY]) == 5
        )
        assert await metric(port, "keylane_stale_state_writes_total") == 1
        after = [r for r in after if r.key == KEY]

    # After the late write: the owner's rewrite of its restored state and e2's commit, in
    # either order, so the last record (what compaction keeps) is the owner's newest state.
    assert len(after) == 5
    assert all(msgspec.msgpack.decode(r.value or b"")["epoch"] >= owners_epoch for r in after[3:])
    assert msgspec.msgpack.decode(after[-1].value or b"")["seq"] == 3
    assert "is a former owner's late write" in (tmp_path / "successor.log").read_text()
