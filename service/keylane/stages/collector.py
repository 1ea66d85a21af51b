"""The garbage collector's full collections skip what a process made while it started.

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
"""

from __future__ import annotations

import gc
import logging

from keylane.kafka.app import App, on_rebalance_complete

log = logging.getLogger(__name__)


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
