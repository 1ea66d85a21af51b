"""prometheus_client's Counter, Gauge and Histogram without a lock per value, for metrics that
only the process's event loop thread writes.

prometheus_client guards every value with a mutex and checks each call's labels and exemplar
in Python: an activation's ten counter increments and five histogram observations cost about a
tenth of the whole activation (the suspension round trip's profile). Every keylane metric is
written from its process's event loop thread (lane jobs, timers, rebalance callbacks, which
Faust runs there too); the metrics server's thread only reads, and reading a float is atomic.
So a value here is a plain float, and ``observe`` finds its bucket by bisection. The
exposition is prometheus_client's own, unchanged (tests/unit/test_metric_types.py).

A metric written from another thread (a tool's worker thread, the pause watch) must use
prometheus_client's own types: two threads adding to one value here could lose an increment.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Any

import prometheus_client
from prometheus_client.values import MutexValue


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
        self._observable = True

    def observe(self, amount: float, exemplar: dict[str, str] | None = None) -> None:
        # prometheus_client's own observe for an exemplar, NaN (no bucket) or a labelled parent
        if exemplar or amount != amount or not self._observable:
            super().observe(amount, exemplar)
            return
        self._sum._value += amount
        # The first bucket whose upper bound is >= amount, as prometheus_client's own scan finds
        # it (the last bound is +Inf).
        self._buckets[bisect_left(self._upper_bounds, amount)]._value += 1
