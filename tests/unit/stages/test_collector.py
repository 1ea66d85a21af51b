"""A process's start-up objects are out of the garbage collector's full collections."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import faust
import pytest

from keylane.stages.collector import freeze_startup_objects


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
