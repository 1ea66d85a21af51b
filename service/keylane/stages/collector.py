"""How a worker's or an effector's process uses the garbage collector: start-up's objects are
frozen out of the full collections, and young collections run less often than CPython's default.

A running worker holds some 80,000 long-lived objects: modules, the Faust app, its services,
consumers and producers. CPython's full collection (generation 2) walks every one of them.
On the development machine that took 30-54 ms, every few seconds under load, with the event
loop and the consumer's fetch thread stopped (the collector holds the GIL): a pause longer
than the whole e2e p99 goal, for every record that arrives during it.

``gc.freeze()`` moves every object alive at that moment into a permanent generation that no
collection walks; objects made later are collected as before. A process freezes twice: as it
starts (the imports, the app) and after its first rebalance (what starting the app made). A
frozen object that becomes cyclic garbage is never collected, so only start-up's objects are
frozen, which live as long as the process anyway.

A young collection runs every YOUNG_COLLECTION_THRESHOLD container allocations (net of
deallocations), where CPython runs one every 700. Each record's futures, callbacks and
batches live for a few milliseconds: a young collection every 700 allocations catches many
of them alive, walks them, and promotes them, so that they fill the older generations and
set off their collections too. In the state-growth benchmark's workers (bench/state_growth.py,
8,000 activations each, measured with a ``gc.callbacks`` timer, two runs of each threshold) the
collector took 136 to 214 ms with CPython's threshold and 85 to 101 ms with this one: 6 µs
(1 KiB of memory per key) to 14 µs (512 KiB) less CPU per activation, 2 to 5% of it. A young
collection then takes about 2 ms, far inside the e2e p99 goal; what cyclic garbage waits for
it is at most that many objects.
"""

from __future__ import annotations

import gc
import logging

from keylane.kafka.app import App, on_rebalance_complete

log = logging.getLogger(__name__)

YOUNG_COLLECTION_THRESHOLD = 10_000
"""Net container allocations between two young collections (CPython's default: 700)."""


def collect_less_often() -> None:
    """Young collections every YOUNG_COLLECTION_THRESHOLD allocations; the older generations'
    thresholds (how many younger collections set theirs off) stay CPython's."""
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, older, oldest)


def freeze_startup_objects(app: App) -> None:
    """Freeze what exists now, and again once ``app``'s first rebalance completed."""
    _freeze("the imports and the app")
    first = True

    async def after_first_rebalance() -> None:
        nonlocal first
        if first:
            first = False
            _freeze("starting the app")

    on_rebalance_complete(app, after_first_rebalance)


def _freeze(made_by: str) -> None:
    frozen = gc.get_freeze_count()
    gc.collect()  # garbage is collected, not frozen
    gc.freeze()
    log.info(
        "%s objects made by %s are out of the garbage collector's full collections",
        gc.get_freeze_count() - frozen,
        made_by,
    )
