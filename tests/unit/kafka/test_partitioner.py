"""expected_partition is the partition aiokafka's (Kafka's default) partitioner picks, for any
partition count, with or without the kept hashes; KeptHashPartitioner, the worker's producer
partitioner, picks what aiokafka's default does."""

from __future__ import annotations

import random
from pathlib import Path

from aiokafka.partitioner import DefaultPartitioner

from keylane.catalog import load_catalog
from keylane.config import Settings
from keylane.kafka.app import build_app
from keylane.kafka.partitioner import KEPT_HASHES, KeptHashPartitioner, _key_hash, expected_partition


def test_it_is_the_partition_the_default_partitioner_picks() -> None:
    rng = random.Random(24)
    partitioner = DefaultPartitioner()
    keys = [rng.randbytes(rng.randint(1, 40)) for _ in range(2_000)] + [b"hot-entity#3", b"\xff" * 7]
    for partitions in (1, 3, 6, 12, 64):
        every = list(range(partitions))
        for key in keys:
            assert expected_partition(key, partitions) == partitioner(key, every, every)
    # again from the kept hashes, and after they were dropped
    assert _key_hash.cache_info().hits > 0
    _key_hash.cache_clear()
    for key in keys[:100]:
        assert expected_partition(key, 12) == partitioner(key, list(range(12)), list(range(12)))


def test_the_kept_hashes_are_bounded() -> None:
    for i in range(KEPT_HASHES + 10):
        expected_partition(b"k%d" % i, 6)
    assert _key_hash.cache_info().currsize <= KEPT_HASHES


def test_the_producer_partitioner_places_a_record_where_the_default_one_does() -> None:
    rng = random.Random(7)
    ours, default = KeptHashPartitioner(), DefaultPartitioner()
    keys = [rng.randbytes(rng.randint(0, 40)) for _ in range(2_000)] + [b"hot-entity#3"]
    for partitions in ([0], [0, 1, 2], list(range(6)), [0, 2, 5, 9]):  # sorted, not always dense
        for key in keys:
            assert ours(key, partitions, partitions[:1]) == default(key, partitions, partitions[:1])


def test_a_record_without_a_key_goes_to_an_available_partition_else_any() -> None:
    partitioner = KeptHashPartitioner()
    assert {partitioner(None, [0, 1, 2, 3], [2]) for _ in range(50)} == {2}
    assert {partitioner(None, [0, 1, 2], []) for _ in range(200)} == {0, 1, 2}


def test_the_worker_producer_uses_it(tmp_path: Path) -> None:
    app = build_app(Settings.from_env({}, data_dir=tmp_path, app_id="partitioner"), load_catalog(prefix="p."))
    assert isinstance(app.producer.partitioner, KeptHashPartitioner)
    assert app.producer._settings_default()["partitioner"] is app.producer.partitioner
