"""keylane's lock-free metric types (service/keylane/metric_types.py) expose exactly what
prometheus_client's own types expose for the same writes: bucket boundaries (an observation
equal to a bound counts in that bound's bucket), +Inf, labelled children, and the errors
prometheus_client raises."""

from __future__ import annotations

import random

import prometheus_client
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from keylane import metric_types

BUCKETS = (0.0001, 0.00025, 0.001, 0.5, 1.0, 60.0)


Pair = tuple[CollectorRegistry, object, CollectorRegistry, object]


def both(kind: str, *args: object, **kwargs: object) -> Pair:
    """prometheus_client's metric and keylane's, each in a registry of its own."""
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    return (
        theirs,
        getattr(prometheus_client, kind)(*args, registry=theirs, **kwargs),
        ours,
        getattr(metric_types, kind)(*args, registry=ours, **kwargs),
    )


def test_a_histogram_exposes_what_prometheus_clients_exposes() -> None:
    theirs, reference, ours, metric = both("Histogram", "h_seconds", "h", ["kind"], buckets=BUCKETS)
    rng = random.Random(7)
    amounts = [*BUCKETS, 0.0, -1.0, 61.0, float("inf"), *(rng.uniform(0, 70) for _ in range(500))]
    amounts += [rng.choice(BUCKETS) * rng.choice((0.999999, 1.0, 1.000001)) for _ in range(200)]
    for amount in amounts:
        for histogram in (reference, metric):
            histogram.labels("start").observe(amount)  # type: ignore[attr-defined]
            histogram.labels("resume").observe(amount / 2)  # type: ignore[attr-defined]
    assert generate_latest(ours) == generate_latest(theirs)


def test_a_counter_and_a_gauge_expose_what_prometheus_clients_expose() -> None:
    theirs, reference, ours, metric = both("Counter", "c", "c", ["reason"])
    g_theirs, g_reference, g_ours, g_metric = both("Gauge", "g", "g")
    for n in range(100):
        for counter in (reference, metric):
            counter.labels(str(n % 3)).inc(n)  # type: ignore[attr-defined]
        for gauge in (g_reference, g_metric):
            gauge.inc(n)  # type: ignore[attr-defined]
            gauge.dec(n / 3)  # type: ignore[attr-defined]
    for gauge in (g_reference, g_metric):
        gauge.set(4.5)  # type: ignore[attr-defined]
    assert generate_latest(ours) == generate_latest(theirs)
    assert generate_latest(g_ours) == generate_latest(g_theirs)


def test_unlabelled_metrics_expose_what_prometheus_clients_expose() -> None:
    theirs, reference, ours, metric = both("Counter", "c", "c")
    h_theirs, h_reference, h_ours, h_metric = both("Histogram", "h_seconds", "h", buckets=BUCKETS)
    for n in range(50):
        for counter in (reference, metric):
            counter.inc(n)  # type: ignore[attr-defined]
        for histogram in (h_reference, h_metric):
            histogram.observe(n / 40)  # type: ignore[attr-defined]
    assert generate_latest(ours) == generate_latest(theirs)
    assert generate_latest(h_ours) == generate_latest(h_theirs)


def test_the_errors_are_prometheus_clients() -> None:
    _, _, _, counter = both("Counter", "c", "c", ["reason"])
    _, _, _, histogram = both("Histogram", "h", "h", ["kind"])
    with pytest.raises(ValueError, match="missing label values"):
        counter.inc()  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="missing label values"):
        histogram.observe(1.0)  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="non-negative"):
        counter.labels("x").inc(-1)  # type: ignore[attr-defined]


def test_a_histogram_scraped_from_another_thread_while_it_is_observed_loses_nothing() -> None:
    """Observations wait in a deque until a fold (every FOLD_AT of them, or an exposition):
    a scrape thread folding while the loop thread observes must neither lose an observation
    nor count one twice, and each scrape must see every observation made before it began."""
    import threading

    theirs, reference, ours, metric = both("Histogram", "h_seconds", "h", buckets=BUCKETS)
    rng = random.Random(11)
    amounts = [rng.uniform(0, 2) for _ in range(60_000)]
    done = threading.Event()
    scrapes: list[tuple[int, float]] = []

    def scrape() -> None:
        while not done.is_set():
            observed = metric._observed_so_far  # type: ignore[attr-defined]
            text = generate_latest(ours).decode()
            count = float(
                next(line for line in text.splitlines() if line.startswith("h_seconds_count")).split()[1]
            )
            scrapes.append((observed, count))

    metric._observed_so_far = 0  # type: ignore[attr-defined]
    scraper = threading.Thread(target=scrape)
    scraper.start()
    try:
        for n, amount in enumerate(amounts, 1):
            metric.observe(amount)  # type: ignore[attr-defined]
            metric._observed_so_far = n  # type: ignore[attr-defined]
            reference.observe(amount)  # type: ignore[attr-defined]
    finally:
        done.set()
        scraper.join()
    assert len(scrapes) > 10, "the scrapes ran while the observations did"
    assert all(count >= observed for observed, count in scrapes), "a scrape missed an earlier observation"
    assert generate_latest(ours) == generate_latest(theirs)


def test_a_histogram_folds_its_observations_before_they_pile_up() -> None:
    _, _, _, metric = both("Histogram", "h_seconds", "h", buckets=BUCKETS)
    for n in range(10 * metric_types.FOLD_AT):
        metric.observe(n / 1000)  # type: ignore[attr-defined]
        assert len(metric._unfolded) < metric_types.FOLD_AT  # type: ignore[attr-defined]


def test_an_observation_with_an_exemplar_counts_after_the_ones_before_it() -> None:
    """prometheus_client's own observe keeps an exemplar; the amounts still waiting to be
    folded go in first, so the sum adds in the order the amounts came, as theirs does."""
    theirs, reference, ours, metric = both("Histogram", "h_seconds", "h", buckets=BUCKETS)
    rng = random.Random(5)
    for n in range(300):
        amount = rng.uniform(0, 2) * 10 ** rng.randint(-6, 6)
        exemplar = {"trace_id": str(n)} if n % 37 == 0 else None
        for histogram in (reference, metric):
            histogram.observe(amount, exemplar)  # type: ignore[attr-defined]
    assert generate_latest(ours) == generate_latest(theirs)
