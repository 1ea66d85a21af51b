"""The end state a stream of tests/agents/pages.py events must reach, whatever happened to the
workers on the way (kills, rebalances): each key's paged memory whole at every step."""

from __future__ import annotations

from collections import defaultdict

from keylane.catalog import ERRORS, Catalog
from keylane.config import Settings
from keylane.core.pages import decode_page, is_page_key, page_owner
from keylane.core.state import state_changelog
from keylane.kafka.topic_reader import read_to_end
from tests.agents.pages import expected_found, found_by_event


async def assert_paged_memory_whole(
    settings: Settings, catalog: Catalog, outputs: dict[str, set[bytes]], payloads: dict[bytes, list[str]]
) -> None:
    """One output per event by id; each activation found exactly the memory its key's previous
    event left (a missing or torn page would show as other memory, or as poison_state); and the
    changelog keeps no page of memory that emptied, while a key that ends filled keeps its pages."""
    total = sum(map(len, payloads.values()))
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
    assert emptied and len(emptied) < len(payloads), "some keys end emptied, some filled"
    kept: dict[bytes, int] = defaultdict(int)
    for page, value in last_page.items():
        owner = page_owner(page)[0]
        if owner in emptied:
            assert decode_page(value, "") == {}, f"{owner!r} emptied its memory; page {page!r} holds some"
        kept[owner] += len(value)
    assert all(kept[key] < 4096 for key in emptied)
    assert all(kept[key] > 20_000 for key in set(payloads) - emptied), "a filled key keeps its pages"
