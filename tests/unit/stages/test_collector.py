"""A process's start-up objects are out of the garbage collector's full collections, and its
young collections run every YOUNG_COLLECTION_THRESHOLD allocations."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import faust
import pytest

from keylane.stages.collector import YOUNG_COLLECTION_THRESHOLD, collect_less_often, freeze_startup_objects


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()  # the rest of the test session collects as usual


async def test_start_up_objects_are_frozen_as_the_app_starts_and_after_its_first_rebalance(
    unfrozen: None,
) -> None:
    app = faust.App("collector-freeze", broker="kafka://127.0.0.1:1")
    freeze_startup_objects(app)
    at_start = gc.get_freeze_count()
    assert at_start > 1_000, "the imports and the app"

    made_while_starting = [[index] for index in range(2_000)]  # e.g. Faust's services and clients
    await app.on_rebalance_complete.send()
    after_first = gc.get_freeze_count()
    assert after_first >= at_start + len(made_while_starting)

    made_later = [[index] for index in range(2_000)]
    await app.on_rebalance_complete.send()
    assert gc.get_freeze_count() == after_first, "only the first rebalance freezes"
    del made_later, made_while_starting


def test_young_collections_run_less_often_and_the_older_ones_as_before() -> None:
    before = gc.get_threshold()
    try:
        collect_less_often()
        assert gc.get_threshold() == (YOUNG_COLLECTION_THRESHOLD, before[1], before[2])
        gc.collect(0)  # the young generation's count starts again from 0
        kept = [[index] for index in range(YOUNG_COLLECTION_THRESHOLD // 2)]  # past CPython's 700
        assert gc.get_count()[0] > len(kept) // 2, "no young collection ran (it resets the count)"
    finally:
        gc.set_threshold(*before)
