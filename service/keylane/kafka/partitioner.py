"""Kafka's default partitioner (Java client, aiokafka, Faust): murmur2 on the key bytes.

``expected_partition`` recomputes it to spot records a client with another partitioner
(librdkafka's default, as used by kcat) put on a different partition than their key's.
"""

from __future__ import annotations

from aiokafka.partitioner import murmur2


def expected_partition(key: bytes, partitions: int) -> int:
    """The partition Kafka's default (murmur2) partitioner assigns to ``key``."""
    hashed: int = murmur2(key)
    return (hashed & 0x7FFFFFFF) % partitions
