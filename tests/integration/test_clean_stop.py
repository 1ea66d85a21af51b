"""A worker keeps its table stores across a stop by signal, and restores every partition from
its changelog alone after a kill -9 (service/keylane/kafka/clean_stop.py): a killed worker's
store can hold writes its changelog never got.

Paged memory is what such a store would tear (a record only the store holds, beside pages a
restore read took back), so the agent here pages its memory; tests/integration/
test_emptied_memory_crash.py attacks the same with kills at seeded points.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from keylane.catalog import EVENTS, Catalog
from keylane.config import Settings
from keylane.kafka.clean_stop import CLEAN_STOP_MARKER
from keylane.wire import AgentEnvelope, encode
from tests.agents.pages import digest, filled
from tests.integration.stream_checks import outputs_by_id
from tests.kafka_io import produce
from tests.processes import KeylaneProcess, process_env, running

pytestmark = pytest.mark.kafka

KEYS = [f"doc-{i}".encode() for i in range(6)]
UNCLEAN = "did not stop cleanly"


def fills(round_: int) -> list[tuple[bytes, bytes]]:
    return [(key, encode(AgentEnvelope(payload=f"fill:{key.decode()}-{round_}"))) for key in KEYS]


@pytest.mark.timeout(240)
async def test_a_stop_keeps_the_stores_and_a_kill_9_restores_them_from_the_changelog(
    settings: Settings, catalog: Catalog, tmp_path: Path
) -> None:
    marker = settings.data_dir / CLEAN_STOP_MARKER
    stores = settings.data_dir / "v1" / "tables"
    worker = KeylaneProcess(
        ["worker", "--agent", "tests.agents.pages:agent"], process_env(settings), tmp_path / "worker.log"
    )
    with running(worker):
        await produce(settings, catalog.name(EVENTS), fills(0))
        await outputs_by_id(settings, catalog, len(KEYS), timeout_s=90)
        assert not marker.exists(), "a running worker has no clean-stop marker"
        assert worker.stop() == 0
        assert marker.exists(), "a stop by signal, everything confirmed, marks the stores clean"
        kept = {path.name: path.stat().st_ino for path in stores.glob("*.db")}
        assert kept

        worker.start()
        assert UNCLEAN not in worker.log_since_start()
        assert {path.name: path.stat().st_ino for path in stores.glob("*.db")} == kept, "the stores were kept"
        await produce(settings, catalog.name(EVENTS), fills(1))
        await outputs_by_id(settings, catalog, 2 * len(KEYS), timeout_s=90)
        worker.kill9()
        assert not marker.exists()

        worker.start()
        assert UNCLEAN in worker.log_since_start(), "a killed worker's stores are not kept"
        await produce(settings, catalog.name(EVENTS), fills(2))
        outputs = await outputs_by_id(settings, catalog, 3 * len(KEYS), timeout_s=90)
        worker.stop()

    found = {}
    for values in outputs.values():
        assert len(values) == 1
        output = msgspec.json.decode(next(iter(values)))
        found[(output["key"], output["event"])] = output["found"]
    for key in KEYS:  # each fill found the memory the one before it left, across both restarts
        name = key.decode()
        assert found[(name, f"fill:{name}-1")] == digest(filled(f"{name}-0"))
        assert found[(name, f"fill:{name}-2")] == digest(filled(f"{name}-1"))
