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

import asyncio
import random
import shutil
from collections import defaultdict
from pathlib import Path

import pytest

from keylane.catalog import ERRORS, EVENTS, OUTPUT, Catalog
from keylane.config import Settings
from keylane.core.pages import decode_page, is_page_key, page_owner
from keylane.core.state import state_changelog
from keylane.kafka.topic_reader import read_to_end
from keylane.wire import AgentEnvelope, encode
from tests.agents.pages import expected_found, found_by_event
from tests.integration.stream_checks import outputs_by_id
from tests.kafka_io import produce
from tests.processes import KeylaneProcess, process_env, running

pytestmark = pytest.mark.kafka

KEYS = [f"doc-{i}".encode() for i in range(12)]
ROUNDS = 4  # fill, clear, fill, clear, ... per key
SEED = 11


def events_of(key: bytes) -> list[str]:
    """fill:<r>, clear:<r> for each round (each event unique); odd keys end filled (one more fill)."""
    events = [e for r in range(ROUNDS) for e in (f"fill:{key.decode()}-{r}", f"clear:{key.decode()}-{r}")]
    return events + ([f"fill:{key.decode()}-last"] if int(key.decode().split("-")[1]) % 2 else [])


@pytest.mark.timeout(300)
async def test_memory_that_empties_survives_kill_9_and_leaves_no_page_behind(
    settings: Settings, catalog: Catalog, tmp_path: Path
) -> None:
    rng = random.Random(SEED)
    payloads = {key: events_of(key) for key in KEYS}
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

    async def wait_for_outputs(count: int) -> None:
        for _ in range(600):
            if len({r.record_id for r in await read_to_end(settings, catalog.name(OUTPUT))}) >= count:
                return
            await asyncio.sleep(0.2)
        raise AssertionError(f"fewer than {count} outputs after 120 s")

    with running(worker):
        await produce(settings, catalog.name(EVENTS), events)
        for number, after in enumerate(kills, start=1):
            await wait_for_outputs(after)
            worker.kill9()
            if number == len(kills):
                shutil.rmtree(settings.data_dir / "v1")  # restore from the changelog alone
            worker.start()
        outputs = await outputs_by_id(settings, catalog, total, timeout_s=180)
        worker.stop()

    assert len(outputs) == total and all(len(values) == 1 for values in outputs.values())
    found = found_by_event(outputs)
    for key, key_events in payloads.items():
        want = expected_found(key_events)
        got = [found[(key.decode(), event)] for event in key_events]
        assert got == want, f"{key!r}: an activation found other memory than its previous event left"
    errors = await read_to_end(settings, catalog.name(ERRORS))
    assert errors == [], f"no activation failed (poison_state is a missing or torn page): {errors[:3]}"

    last_page: dict[bytes, bytes] = {}
    for record in await read_to_end(settings, state_changelog(settings.app_id)):
        if record.key is not None and is_page_key(record.key) and record.value is not None:
            last_page[record.key] = record.value
    emptied = {key for key, key_events in payloads.items() if key_events[-1].startswith("clear:")}
    assert emptied and len(emptied) < len(KEYS)
    kept: dict[bytes, int] = defaultdict(int)
    for page, value in last_page.items():
        owner = page_owner(page)[0]
        if owner in emptied:
            assert decode_page(value, "") == {}, f"{owner!r} emptied its memory; page {page!r} holds some"
        kept[owner] += len(value)
    assert all(kept[key] < 4096 for key in emptied)
    assert all(kept[key] > 20_000 for key in set(KEYS) - emptied), "a filled key keeps its pages"
