"""Provider-call rate limits: a token bucket per physical key under one global ceiling.

A key waits for its own bucket first, so a hot key spends only its own rate and cannot
drain the global ceiling that the other keys share; the global bucket serves waiters in
arrival order. Cache hits are not limited: they never reach the provider.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from dataclasses import dataclass

MAX_TRACKED_KEYS = 10_000


@dataclass(frozen=True, kw_only=True)
class RateLimit:
    """``per_key_per_s`` calls per second per physical key (bursts of ``per_key_burst``),
    and at most ``global_per_s`` per worker (None: no global ceiling)."""

    per_key_per_s: float
    per_key_burst: int = 1
    global_per_s: float | None = None

    def __post_init__(self) -> None:
        if self.per_key_per_s <= 0:
            raise ValueError(f"RateLimit.per_key_per_s must be positive, got {self.per_key_per_s}")
        if self.per_key_burst < 1:
            raise ValueError(f"RateLimit.per_key_burst must be >= 1, got {self.per_key_burst}")
        if self.global_per_s is not None and self.global_per_s <= 0:
            raise ValueError(f"RateLimit.global_per_s must be None or positive, got {self.global_per_s}")


class TokenBucket:
    """``rate`` tokens per second, holding at most ``burst``; waiters are served in order."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate
        self.burst = burst
        self._tokens = float(burst)
        self._updated = time.monotonic()
        self._lock = asyncio.Lock()

    async def acquire(self) -> float:
        """Take one token, waiting for it if needed; returns the seconds waited."""
        async with self._lock:
            now = time.monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._updated) * self.rate)
            self._updated = now
            wait = 0.0 if self._tokens >= 1 else (1 - self._tokens) / self.rate
            if wait:
                await asyncio.sleep(wait)
                self._tokens = min(self.burst, self._tokens + wait * self.rate)
                self._updated = time.monotonic()
            self._tokens -= 1
            return wait


class ProviderLimiter:
    """The buckets of one worker: one per physical key (the least recently used are forgotten
    beyond MAX_TRACKED_KEYS, which only ever lets a key start with a full burst) and one global."""

    def __init__(self, limit: RateLimit) -> None:
        self.limit = limit
        self._keys: OrderedDict[bytes, TokenBucket] = OrderedDict()
        self._global = TokenBucket(limit.global_per_s, 1) if limit.global_per_s else None

    async def acquire(self, key: bytes) -> float:
        """Wait until ``key`` may call the provider; returns the seconds waited."""
        bucket = self._keys.get(key)
        if bucket is None:
            bucket = self._keys[key] = TokenBucket(self.limit.per_key_per_s, self.limit.per_key_burst)
            if len(self._keys) > MAX_TRACKED_KEYS:
                self._keys.popitem(last=False)
        else:
            self._keys.move_to_end(key)
        waited = await bucket.acquire()
        if self._global is not None:
            waited += await self._global.acquire()
        return waited
