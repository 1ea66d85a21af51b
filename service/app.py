"""Builds the faust.App for a worker from Settings and the topic catalog; wiring only."""

from __future__ import annotations

import faust

from service.catalog import EVENTS, Catalog
from service.config import Settings


def faust_broker_url(settings: Settings) -> str:
    """Faust's broker URL list for the settings' bootstrap servers."""
    return ";".join(f"kafka://{server}" for server in settings.bootstrap_list)


def build_app(settings: Settings, catalog: Catalog, *, partitions: int | None = None) -> faust.App:
    """A Faust app whose internal topics match the catalog's co-partitioning.

    Faust creates changelog topics with ``topic_partitions`` partitions and writes a table
    entry into the partition of the current event, so that count must equal the source
    topics' count; it is taken from the catalog, never from Faust's default of 8.
    """
    co_partitions = partitions or catalog[EVENTS].partitions
    return faust.App(
        settings.app_id,
        broker=faust_broker_url(settings),
        store="rocksdb://",  # runs on rocksdict when it is installed; "rocksdict://" is broken
        datadir=str(settings.data_dir),
        topic_partitions=co_partitions,
        topic_replication_factor=catalog[EVENTS].replication_factor,
        broker_session_timeout=settings.session_timeout_s,
        broker_heartbeat_interval=min(3.0, settings.session_timeout_s / 3),
        web_enabled=False,
        autodiscover=False,
    )
