"""Records go through the real broker with key and value intact, whoever produced them."""

from __future__ import annotations

import pytest

from keylane.catalog import EVENTS, Catalog
from keylane.config import Settings
from tests.kafka_io import consume, kcat_produce, produce

pytestmark = pytest.mark.kafka


async def test_produce_consume_round_trip(settings: Settings, catalog: Catalog) -> None:
    topic = catalog.name(EVENTS)
    sent = [(f"key-{i}".encode(), f"value-{i}".encode() + bytes([0, 255, i])) for i in range(20)]
    await produce(settings, topic, sent)

    received = await consume(settings, topic, len(sent))

    assert sorted(received) == sorted(sent)


async def test_record_produced_by_kcat_is_consumed_intact(settings: Settings, catalog: Catalog) -> None:
    topic = catalog.name(EVENTS)

    kcat_produce(
        settings, topic, b'order-17|{"amount": 42, "note": "caf\xc3\xa9"}\ncustomer:9|second value\n'
    )

    received = await consume(settings, topic, 2)
    assert sorted(received) == sorted(
        [
            (b"customer:9", b"second value"),
            (b"order-17", b'{"amount": 42, "note": "caf\xc3\xa9"}'),
        ]
    )
