"""kill -9 of the worker, at seeded points, while keys' paged memory fills and empties again
(tests/agents/pages.py), the last restart without its local RocksDB.

A key whose paged memory empties goes back to one record and its pages are emptied after it,
and again by the key's next write (service/keylane/core/key_states.py): a kill between the
record and its empty pages is mended by the input run again. Whatever the kills interrupted:
every event has one output by id; each activation found exactly the memory its key's previous
event left (never a half-written or missing page: no poison_state); and once the stream is
done, the changelog keeps no page of memory that emptied: every page of a key whose last
event cleared it is an empty page, so compaction keeps a few bytes of it, not its memory.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest

from keylane.catalog import EVENTS, Catalog
from keylane.config import Settings
from keylane.wire import AgentEnvelope, encode
from tests.agents.pages import fill_and_clear
from tests.integration.pages_checks import assert_paged_memory_whole
from tests.integration.stream_checks import outputs_by_id
from tests.kafka_io import produce
from tests.processes import KeylaneProcess, process_env, running

pytestmark = pytest.mark.kafka

KEYS = [f"doc-{i}".encode() for i in range(12)]
ROUNDS = 4  # fill, clear, fill, clear, ... per key
SEED = 11


@pytest.mark.timeout(300)
async def test_memory_that_empties_survives_kill_9_and_leaves_no_page_behind(
    settings: Settings, catalog: Catalog, tmp_path: Path
) -> None:
    rng = random.Random(SEED)
    payloads = {key: fill_and_clear(key, ROUNDS) for key in KEYS}
    events = [
        (key, encode(AgentEnvelope(payload=payloads[key][i])))
        for i in range(max(map(len, payloads.values())))
        for key in KEYS
        if i < len(payloads[key])
    ]
    total = len(events)
    kills = sorted(rng.sample(range(total // 6, total - total // 6), 3))
    env = process_env(settings)
    worker = KeylaneProcess(["worker", "--agent", "tests.agents.pages:agent"], env, tmp_path / "worker.log")

    with running(worker):
        await produce(settings, catalog.name(EVENTS), events)
        for number, after in enumerate(kills, start=1):
            await outputs_by_id(settings, catalog, after, timeout_s=120, poll_s=0.2)
            worker.kill9()
            if number == len(kills):
                shutil.rmtree(settings.data_dir / "v1")  # restore from the changelog alone
            worker.start()
        outputs = await outputs_by_id(settings, catalog, total, timeout_s=180)
        worker.stop()

    await assert_paged_memory_whole(settings, catalog, outputs, payloads)
