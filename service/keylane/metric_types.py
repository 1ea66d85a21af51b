"""prometheus_client's Counter, Gauge and Histogram without a lock per value, for metrics that
only the process's event loop thread writes.

prometheus_client guards every value with a mutex and checks each call's labels and exemplar
in Python: an activation's ten counter increments and five histogram observations cost about a
tenth of the whole activation (the suspension round trip's profile). Every keylane metric is
written from its process's event loop thread (lane jobs, timers, rebalance callbacks, which
Faust runs there too); the metrics server's thread only reads, and reading a float is atomic.
So a value here is a plain float. The exposition is prometheus_client's own, unchanged
(tests/unit/test_metric_types.py).

A histogram's ``observe`` only appends the amount to a deque; its buckets and sum take the
amounts in (``_fold``, which finds each bucket by bisection) when FOLD_AT wait, and before
every exposition, from whichever thread asks. An activation observes six histograms after
its model answered, and bisecting each there and then cost 0.2 µs apiece. A deque's append
and popleft are atomic, and folds take the histogram's lock, so a scrape during a burst loses
nothing and counts nothing twice (tests/unit/test_metric_types.py scrapes from a thread while
the loop observes).

A metric written from another thread (a tool's worker thread, the pause watch) must use
prometheus_client's own types: two threads adding to one value here could lose an increment.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections import deque
from collections.abc import Iterable
from typing import Any

import prometheus_client
from prometheus_client.samples import Sample
from prometheus_client.values import MutexValue

FOLD_AT = 256
"""Observations a histogram keeps unfolded at most (about 2 KiB each, folded in ~30 µs)."""


class _LoopValue(MutexValue):
    """A float that one thread writes: MutexValue's layout, without taking its lock."""

    def inc(self, amount: float) -> None:
        self._value += amount

    def set(self, value: float, timestamp: float | None = None) -> None:
        self._value = value

    def get(self) -> float:
        return self._value


def _unlocked(value: Any) -> None:
    value.__class__ = _LoopValue  # same attributes: only the methods change


class Counter(prometheus_client.Counter):
    _observable = False
    """Set where prometheus_client gave the metric a value (``_metric_init``): an unlabelled
    metric or a labelled one's child, never a labelled parent. Its ``_is_observable`` says
    the same, at the cost of a method call on every write."""

    def _metric_init(self) -> None:
        super()._metric_init()
        _unlocked(self._value)
        self._observable = True

    def inc(self, amount: float = 1, exemplar: dict[str, str] | None = None) -> None:
        # prometheus_client's own inc raises (negative, a labelled parent) or keeps the exemplar
        if amount < 0 or exemplar or not self._observable:
            super().inc(amount, exemplar)
            return
        self._value._value += amount


class Gauge(prometheus_client.Gauge):
    def _metric_init(self) -> None:
        super()._metric_init()
        _unlocked(self._value)


class Histogram(prometheus_client.Histogram):
    _observable = False  # as Counter's

    def _metric_init(self) -> None:
        super()._metric_init()
        _unlocked(self._sum)
        for bucket in self._buckets:
            _unlocked(bucket)
        self._unfolded: deque[float] = deque()
        self._folding = threading.Lock()
        self._observable = True

    def observe(self, amount: float, exemplar: dict[str, str] | None = None) -> None:
        if not self._observable:  # a labelled parent: prometheus_client's own observe raises
            super().observe(amount, exemplar)
            return
        if exemplar:
            # prometheus_client's own observe keeps the exemplar. It adds to what a fold adds
            # to: after the amounts before it (a sum of floats depends on the order; only this
            # thread observes), under the folds' lock.
            self._fold()
            with self._folding:
                super().observe(amount, exemplar)
            return
        unfolded = self._unfolded
        unfolded.append(amount)
        if len(unfolded) >= FOLD_AT:
            self._fold()

    def _fold(self) -> None:
        """Add the unfolded observations to the sum and buckets, in the order they came (a sum
        of floats depends on it)."""
        with self._folding:
            unfolded, bounds = self._unfolded, self._upper_bounds
            counts = [0] * len(bounds)
            total = self._sum._value
            # popleft, not a swap of the deque: an append racing the swap would be lost
            for _ in range(len(unfolded)):
                amount = unfolded.popleft()
                total += amount
                if amount == amount:  # NaN counts in the sum only, as prometheus_client counts it
                    # The first bucket whose upper bound is >= amount, as prometheus_client's
                    # own scan finds it (the last bound is +Inf).
                    counts[bisect_left(bounds, amount)] += 1
            self._sum._value = total
            for bucket, count in zip(self._buckets, counts, strict=True):
                if count:
                    bucket._value += count

    def _child_samples(self) -> Iterable[Sample]:
        self._fold()
        return super()._child_samples()
