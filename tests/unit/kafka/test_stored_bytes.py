"""The worker reads and writes a key's state record with the store's own read and write
(service/keylane/kafka/app.py, ``stored_bytes`` and ``stored_bytes_writer``): on a real RocksDB
store of a bytes-to-bytes table the reader returns what the store's public get returns,
present or absent, in the current event's partition, and the writer does what
``table[key] = value`` does: the changelog record first, then the store's value."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import faust
import pytest

from keylane.catalog import load_catalog
from keylane.config import Settings
from keylane.kafka.app import build_app, stored_bytes, stored_bytes_writer
from keylane.kafka.lane_feed import event_context


class Event:
    """What the store and the table read of Faust's current event: its message's partition and
    topic."""

    def __init__(self, partition: int) -> None:
        self.message = SimpleNamespace(partition=partition, topic=SOURCE)


def event_on(partition: int) -> Event:
    return Event(partition)


SOURCE = "r.agent.events"


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


async def test_the_writer_does_what_setting_an_item_does(app: faust.App) -> None:
    written, by_item = (
        app.Table(name, default=None, partitions=4, key_type=bytes, value_type=bytes)
        for name in ("written", "by-item")
    )
    calls: dict[str, list[tuple[str, object, bytes, bytes]]] = {"written": [], "by-item": []}
    for table in (written, by_item):

        def send_changelog(
            partition: object, key: bytes, value: bytes, *_: object, name: str = table.name
        ) -> object:
            # the store must not hold the value yet: the changelog record goes first
            calls[name].append(("changelog", partition, key, value))
            assert stored_bytes(app.tables[name])(key) != value
            return SimpleNamespace(message=SimpleNamespace(partition=partition))

        table.send_changelog = send_changelog  # as track_changelog wraps it
        # Faust checks the source's partition count against the changelog's on the broker
        # once per topic: there is none here.
        table._verified_source_topics_for_partitions.add(SOURCE)
    put = stored_bytes_writer(written)
    with event_context(event_on(1)):
        put(b"key", b"\x00value")
        by_item[b"key"] = b"\x00value"
        for table in (written, by_item):
            assert stored_bytes(table)(b"key") == b"\x00value"
    assert calls["written"] == calls["by-item"] == [("changelog", 1, b"key", b"\x00value")]
    with event_context(event_on(2)):
        assert stored_bytes(written)(b"key") is None, "written in the current event's partition only"


async def test_a_table_with_a_codec_is_refused(app: faust.App) -> None:
    table = app.Table("json-values", default=None, partitions=4, key_type=bytes, value_type=dict)
    with pytest.raises(TypeError, match="key_type and value_type bytes"):
        stored_bytes(table)
    with pytest.raises(TypeError, match="key_type and value_type bytes"):
        stored_bytes_writer(table)
