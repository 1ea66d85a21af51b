"""expected_partition is the partition aiokafka's (Kafka's default) partitioner picks, for any
partition count, with or without the kept hashes."""

from __future__ import annotations

import random

from aiokafka.partitioner import DefaultPartitioner

from keylane.kafka.partitioner import KEPT_HASHES, _key_hash, expected_partition


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
