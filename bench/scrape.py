"""A worker's Prometheus /metrics, read during a benchmark."""

from __future__ import annotations

import asyncio
import contextlib
import http.client

from bench.harness import BenchFailure


def scrape(port: int) -> dict[str, float]:
    """Every sample of ``http://127.0.0.1:<port>/metrics`` by its name with labels."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        connection.request("GET", "/metrics")
        text = connection.getresponse().read().decode()
    finally:
        connection.close()
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            with contextlib.suppress(ValueError):
                samples[name] = float(value)
    return samples


async def mean_activation_ms(port: int) -> tuple[float, int]:
    """E[activation_ms] (in milliseconds, from the seconds of
    ``keylane_activation_duration_seconds``) and the activation count, from a worker's /metrics."""
    samples = await asyncio.to_thread(scrape, port)
    count = samples.get("keylane_activation_duration_seconds_count", 0.0)
    if not count:
        raise BenchFailure(f"/metrics on port {port} shows no activations")
    return samples["keylane_activation_duration_seconds_sum"] * 1000 / count, int(count)
