"""Kafka's default partitioner (Java client, aiokafka, Faust): murmur2 on the key bytes.

``expected_partition`` recomputes it to spot records a client with another partitioner
(librdkafka's default, as used by kcat) put on a different partition than their key's. It
runs for every input record, and aiokafka's murmur2 is pure Python (about 4 µs for a short
key), so the hashes of recent keys are kept.
"""

from __future__ import annotations

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
