"""The worker reads a key's state record with the store's own read (service/keylane/kafka/
app.py, ``stored_bytes``): on a real RocksDB store of a bytes-to-bytes table it returns what
the store's public get returns, present or absent, in the current event's partition."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import faust
import pytest

from keylane.catalog import load_catalog
from keylane.config import Settings
from keylane.kafka.app import build_app, stored_bytes
from keylane.kafka.lane_feed import event_context


class Event:
    """What the store reads of Faust's current event: its message's partition."""

    def __init__(self, partition: int) -> None:
        self.message = SimpleNamespace(partition=partition)


def event_on(partition: int) -> Event:
    return Event(partition)


@pytest.fixture
def app(tmp_path: Path) -> faust.App:
    return build_app(Settings.from_env({}, data_dir=tmp_path, app_id="reads"), load_catalog(prefix="r."))


async def test_the_reader_returns_what_the_stores_get_returns(app: faust.App) -> None:
    table = app.Table("states", default=None, partitions=4, key_type=bytes, value_type=bytes)
    read = stored_bytes(table)
    on_2, on_3 = event_on(2), event_on(3)
    with event_context(on_2):
        table.data[b"written"] = b"\x00record\xff"
        table.data[b"empty"] = b""
    for event in (on_2, on_3):
        with event_context(event):
            for key in (b"written", b"empty", b"absent"):
                assert read(key) == table.data.get(key)
    with event_context(on_2):
        assert (read(b"written"), read(b"empty"), read(b"absent")) == (b"\x00record\xff", b"", None)
    with event_context(on_3):
        assert read(b"written") is None  # another partition's store


async def test_a_table_with_a_codec_is_refused(app: faust.App) -> None:
    table = app.Table("json-values", default=None, partitions=4, key_type=bytes, value_type=dict)
    with pytest.raises(TypeError, match="key_type and value_type bytes"):
        stored_bytes(table)
