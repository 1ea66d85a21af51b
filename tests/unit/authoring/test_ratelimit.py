"""Token buckets: a key's calls are paced by its own bucket; a hot key cannot spend others'."""

from __future__ import annotations

import asyncio

import pytest

from keylane.authoring.ratelimit import ProviderLimiter, RateLimit, TokenBucket


async def test_a_bucket_allows_its_burst_then_paces_at_its_rate() -> None:
    bucket = TokenBucket(rate=20, burst=2)
    loop = asyncio.get_running_loop()

    started = loop.time()
    waits = [await bucket.acquire() for _ in range(4)]

    assert waits[:2] == [0.0, 0.0], "the burst is free"
    assert all(w > 0 for w in waits[2:])
    assert loop.time() - started >= 2 / 20 * 0.9, "two paced calls at 20/s take about 0.1 s"


async def test_a_hot_key_waits_on_its_own_bucket_and_does_not_delay_another_key() -> None:
    limiter = ProviderLimiter(RateLimit(per_key_per_s=5, per_key_burst=1, global_per_s=1000))
    await limiter.acquire(b"hot")

    hot = asyncio.create_task(limiter.acquire(b"hot"))
    await asyncio.sleep(0)
    cold_wait = await limiter.acquire(b"cold")
    hot_wait = await hot

    assert cold_wait < 0.01
    assert hot_wait > 0.1


async def test_the_global_ceiling_paces_all_keys_together() -> None:
    limiter = ProviderLimiter(RateLimit(per_key_per_s=1000, per_key_burst=10, global_per_s=20))

    waits = [await limiter.acquire(f"k{i}".encode()) for i in range(3)]

    assert waits[0] == 0.0 and all(w > 0 for w in waits[1:])


@pytest.mark.parametrize(
    "kwargs",
    [{"per_key_per_s": 0}, {"per_key_per_s": 1, "per_key_burst": 0}, {"per_key_per_s": 1, "global_per_s": 0}],
)
def test_bad_limits_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="RateLimit"):
        RateLimit(**kwargs)  # type: ignore[arg-type]
