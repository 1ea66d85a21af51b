"""The PromQL reader the dashboard and rule checks rely on."""

from __future__ import annotations

import pytest

from tests.deploy.promql import PromqlError, parse, series_names


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ('up{job=~"keylane-worker"} == 0', {"up"}),
        ("keylane_consumer_lag", {"keylane_consumer_lag"}),
        (
            'sum by (kind) (rate(keylane_activations_total{job=~"$job", instance=~"$i"}[$__rate_interval]))',
            {"keylane_activations_total"},
        ),
        (
            "histogram_quantile(0.95, sum by (le) (rate(keylane_lane_wait_seconds_bucket[5m])))",
            {"keylane_lane_wait_seconds_bucket"},
        ),
        (
            "sum(rate(a_total[5m])) / sum(rate(b_total[5m])) > 0.05 and on (job) c > 1e3",
            {"a_total", "b_total", "c"},
        ),
        ("time() - max by (topic, partition) (ts_seconds)", {"ts_seconds"}),
        ("rate(x_sum[5m]) > 3 * rate(x_sum[1h] offset 1h)", {"x_sum"}),
        ("deriv(job_topic:keylane_consumer_lag:sum[10m]) > bool 0", {"job_topic:keylane_consumer_lag:sum"}),
        ('max_over_time(g{instance="a:9464"}[1m]) unless ignoring (partition) h', {"g", "h"}),
        ('label_replace(x, "dst", "$1", "src", "(.*)")', {"x"}),
        ("sum(x) by (job) or vector(0)", {"x"}),
        ("a > 0 and on (job) (time() - b) > 300 unless (c)", {"a", "b", "c"}),
        ("rate(x[5m] @ end())", {"x"}),
    ],
)
def test_series_names(expr: str, expected: set[str]) -> None:
    assert series_names(expr) == expected


def test_matchers_grouping_and_ranges() -> None:
    parsed = parse(
        'sum by (topic) (max by (topic, partition) (lag{job=~"$job", instance!="x"}))'
        ' / on (job) group_left (app_id) info{role="worker"} + rate(c_total[$__rate_interval])'
    )

    assert [(s.name, [(m.label, m.op, m.value) for m in s.matchers]) for s in parsed.selectors] == [
        ("lag", [("job", "=~", "$job"), ("instance", "!=", "x")]),
        ("info", [("role", "=", "worker")]),
    ]
    assert parsed.grouping_labels == {"topic", "partition", "job", "app_id"}
    assert parsed.ranges == ["$__rate_interval"]


def test_an_unknown_function_is_an_error() -> None:
    with pytest.raises(PromqlError, match="rates"):
        series_names("rates(x[5m])")
