"""Physical shard keys: fan one hot logical key out over N serial lanes ``key#0 … key#N-1``.

The assignment is a correctness input, not load balancing: intent ids and the replay-cache
key both contain the physical key, so a redelivered record must land on the same shard it
did the first time. Hence ``hash`` assignment (the default) is a pure function of the
record's bytes: ``int.from_bytes(sha256(payload).digest()[:8], "big") % n``. SHA-256, not
``hash()``, which is salted per process.

``round_robin`` spreads byte-identical payloads evenly but forfeits that determinism: a
redelivery may land on another shard, mint new intent ids (the effector no longer
suppresses the duplicate side effect) and miss the replay cache. Use it only for agents
that emit no intents and accept duplicate model calls on a retry. It is never the default.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from typing import Literal

Assignment = Literal["hash", "round_robin"]

_SHARD_SUFFIX = re.compile(rb"#(\d+)\Z")


def shard_index(payload: bytes, n: int) -> int:
    """The shard a payload hashes to: first 8 bytes of its SHA-256, big-endian, mod n."""
    if n < 1:
        raise ValueError(f"shard count must be >= 1, got {n}")
    return int.from_bytes(hashlib.sha256(payload).digest()[:8], "big") % n


def shard_key(key: bytes, n: int, *, payload: bytes) -> bytes:
    """``key#i`` with i = :func:`shard_index` (payload, n). n = 1 still suffixes ``#0``, so the
    shape of a physical key never depends on the shard count."""
    return key + b"#" + str(shard_index(payload, n)).encode()


def unshard_key(physical_key: bytes) -> bytes:
    """Strip exactly one trailing ``#<digits>``; raise ValueError when there is none.

    A logical key that itself ends in ``#<digits>`` cannot be told apart from a sharded
    one: do not shard such keys.
    """
    match = _SHARD_SUFFIX.search(physical_key)
    if match is None:
        raise ValueError(f"{physical_key!r} is not a shard key (no trailing #<digits>)")
    return physical_key[: match.start()]


class ShardAssigner:
    """Chooses the physical key for each record of one logical key space.

    ``hash`` (default) is deterministic; ``round_robin`` counts per worker process and is
    not (see the module docstring for what that costs).
    """

    def __init__(self, n: int, *, assignment: Assignment = "hash") -> None:
        if n < 1:
            raise ValueError(f"ShardKeys needs n >= 1, got {n}")
        if assignment not in ("hash", "round_robin"):
            raise ValueError(f"assignment must be 'hash' or 'round_robin', got {assignment!r}")
        self.n = n
        self.assignment: Assignment = assignment
        self._counter = itertools.count()

    def physical_key(self, key: bytes, payload: bytes) -> bytes:
        """The shard key for one record (its key and its raw value bytes)."""
        if self.assignment == "hash":
            return shard_key(key, self.n, payload=payload)
        return key + b"#" + str(next(self._counter) % self.n).encode()
