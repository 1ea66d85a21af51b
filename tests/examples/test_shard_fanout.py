"""docs/sharding.md's fan-out example, run verbatim against a real broker.

The doc's Python block becomes an agent module; a worker runs it; the test produces the
doc's eight events and holds the doc's sentence ("land on shards …") to what happened.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

from keylane.catalog import EVENTS, OUTPUT, Catalog
from keylane.config import Settings
from tests.kafka_io import consume, produce
from tests.processes import KeylaneProcess, process_env, running

pytestmark = pytest.mark.kafka

DOC = Path(__file__).resolve().parents[2] / "docs" / "sharding.md"


def doc_example() -> str:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.DOTALL)
    assert len(blocks) == 1, "docs/sharding.md should hold exactly one Python block, the fan-out example"
    return blocks[0]


def doc_shards() -> list[int]:
    match = re.search(r'The eight events for b"hot-entity" land on shards ([\d, ]+):', DOC.read_text())
    assert match, "docs/sharding.md no longer states where the eight events land"
    return [int(s) for s in match.group(1).split(",")]


def load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_fan_out_example_lands_where_the_doc_says(
    settings: Settings, catalog: Catalog, tmp_path: Path
) -> None:
    module_dir = tmp_path / "doc_module"
    module_dir.mkdir()
    (module_dir / "fanout_doc.py").write_text(doc_example())
    doc = load(module_dir / "fanout_doc.py")
    env = process_env(settings, PYTHONPATH=str(module_dir))
    worker = KeylaneProcess(
        ["worker", "--agent", "fanout_doc:stateless_scorer"], env, tmp_path / "worker.log"
    )

    with running(worker):
        await produce(settings, catalog.name(EVENTS), [(doc.HOT_KEY, value) for value in doc.events()])
        outputs = [value for _, value in await consume(settings, catalog.name(OUTPUT), 8, timeout_s=90)]

    shard_of_event = {}
    for output in outputs:
        physical_key, event, verdict = output.split(b"|")
        assert verdict == doc.VERDICT
        shard_of_event[event] = int(physical_key.rsplit(b"#", 1)[1])
    payloads = [f"event-{i}".encode() for i in range(8)]
    assert [shard_of_event[p] for p in payloads] == doc_shards()
    grouped = doc.regroup(outputs)
    assert list(grouped) == [doc.HOT_KEY]
    assert sorted(r.split(b"|")[0] for r in grouped[doc.HOT_KEY]) == sorted(payloads)
