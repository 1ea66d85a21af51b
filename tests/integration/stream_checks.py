"""The end state a flowing stream of act_then_complete events must reach, whatever happened
to the workers on the way (kills, rebalances)."""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from keylane.catalog import OUTPUT, Catalog
from keylane.config import Settings
from keylane.kafka.topic_reader import read_to_end


def tool_runs(ledger: Path) -> int:
    """How many times the test tool ran (its ledger's lines)."""
    return len(ledger.read_text().splitlines()) if ledger.exists() else 0


async def wait_until(condition: Callable[[], bool], *, timeout_s: float, what: str) -> None:
    """Poll ``condition`` until it holds; fail after ``timeout_s`` naming ``what``."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def outputs_by_id(
    settings: Settings, catalog: Catalog, total: int, timeout_s: float, *, poll_s: float = 0.5
) -> dict[str, set[bytes]]:
    """Every output value per deterministic id, once ``total`` distinct ids are there (read
    again every ``poll_s``)."""
    outputs: dict[str, set[bytes]] = defaultdict(set)
    deadline = asyncio.get_running_loop().time() + timeout_s
    while len(outputs) < total:
        assert asyncio.get_running_loop().time() < deadline, f"only {len(outputs)} of {total} outputs"
        for record in await read_to_end(settings, catalog.name(OUTPUT)):
            assert record.value is not None
            outputs[record.record_id].add(record.value)
        await asyncio.sleep(poll_s)
    return outputs


def assert_exactly_once_in_effect(
    outputs: dict[str, set[bytes]], payloads: dict[bytes, list[str]], tool_ledger: Path
) -> None:
    """One output per event (by id, duplicates identical); each output's memory ring holds exactly
    its key's events up to it, in order; each intent executed once."""
    total = sum(len(events) for events in payloads.values())
    assert len(outputs) == total, "exactly one output per event, deduplicated by id"
    assert all(len(values) == 1 for values in outputs.values()), "duplicates of an output are identical"
    seen: dict[str, list[str]] = defaultdict(list)
    for values in outputs.values():
        output = json.loads(next(iter(values)))
        key_events = payloads[output["key"].encode()]
        index = key_events.index(output["event"])
        assert output["ring"] == key_events[: index + 1], f"memory is exactly the events so far: {output}"
        assert output["seq"] == 2 * index, "two committed activations (start, resume) per event"
        assert output["status"] == "OK"
        seen[output["key"]].append(output["event"])
    assert {k: sorted(v) for k, v in seen.items()} == {k.decode(): sorted(v) for k, v in payloads.items()}
    ledger_lines = tool_ledger.read_text().splitlines()
    assert len(ledger_lines) == total and len(set(ledger_lines)) == total, "each intent executed once"
