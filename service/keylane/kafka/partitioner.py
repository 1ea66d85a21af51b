"""Kafka's default partitioner (Java client, aiokafka, Faust): murmur2 on the key bytes.

``expected_partition`` recomputes it to spot records a client with another partitioner
(librdkafka's default, as used by kcat) put on a different partition than their key's. It
runs for every input record, and aiokafka's murmur2 is pure Python (about 4 µs for a short
key), so the hashes of recent keys are kept. ``KeptHashPartitioner`` is aiokafka's default
partitioner on those kept hashes: the worker's producer places each keyed record it sends
(outputs, intents, dead letters) where Kafka's default partitioner would, without hashing a
key it hashed for the key's input.
"""

from __future__ import annotations

import random
from functools import lru_cache

from aiokafka.partitioner import murmur2

KEPT_HASHES = 65_536


@lru_cache(maxsize=KEPT_HASHES)
def _key_hash(key: bytes) -> int:
    hashed: int = murmur2(key)
    return hashed & 0x7FFFFFFF


def expected_partition(key: bytes, partitions: int) -> int:
    """The partition Kafka's default (murmur2) partitioner assigns to ``key``."""
    return _key_hash(key) % partitions


class KeptHashPartitioner:
    """aiokafka's DefaultPartitioner (``partitioner(key, all_partitions, available)``) with
    the hashes of recent keys kept: murmur2 for a key, a random available partition (else any)
    for a record without one."""

    def __call__(self, key: bytes | None, all_partitions: list[int], available: list[int]) -> int:
        if key is None:
            return random.choice(available or all_partitions)  # noqa: S311 (placement, not secrecy)
        return all_partitions[expected_partition(key, len(all_partitions))]
