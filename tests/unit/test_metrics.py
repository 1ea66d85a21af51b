"""keylane.metrics: base units and conventional names, OpenTelemetry's GenAI buckets, every
fixed label vocabulary exported as 0 from start-up, and an exposition promtool finds clean."""

from __future__ import annotations

import shutil
import subprocess
from typing import get_args

import pytest
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.metrics import MetricWrapperBase

from keylane import metrics
from keylane.records import OrphanDetail
from keylane.wire import ErrorReason, ToolStatus


def declared() -> dict[str, MetricWrapperBase]:
    return {name: value for name, value in vars(metrics).items() if isinstance(value, MetricWrapperBase)}


def test_durations_are_seconds_histograms_from_sub_millisecond_to_a_minute() -> None:
    """keylane's own: the gen_ai_ ones have OpenTelemetry's buckets (below)."""
    for name, metric in declared().items():
        if metric._type != "histogram" or not metric._name.startswith("keylane_"):
            continue
        if not metric._name.endswith("_seconds"):
            continue
        buckets = metric._upper_bounds  # type: ignore[attr-defined]
        assert buckets[0] <= 0.0001 and buckets[-2] >= 60, name  # [-1] is +Inf
    for name in ("ACTIVATION_SECONDS", "OVERHEAD_SECONDS", "LLM_SECONDS", "LANE_WAIT_SECONDS"):
        assert getattr(metrics, name)._upper_bounds[:-1] == list(metrics.SECONDS_BUCKETS)


def test_no_metric_name_carries_a_non_base_unit() -> None:
    for metric in declared().values():
        parts = metric._name.split("_")
        assert not {"ms", "milliseconds", "kb", "mb", "minutes"} & set(parts), metric._name


def test_the_gen_ai_histograms_have_opentelemetry_s_advised_buckets() -> None:
    assert metrics.GEN_AI_DURATION._upper_bounds[:-1] == [
        0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92
    ]  # fmt: skip
    assert metrics.GEN_AI_TOKENS._upper_bounds[:-1] == [
        1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("sample", "label", "values"),
    [
        ("keylane_activations_total", "kind", {"start", "resume"}),
        ("keylane_agent_errors_total", "reason", set(get_args(ErrorReason)) - {"orphaned_result"}),
        ("keylane_orphaned_results_total", "detail", set(get_args(OrphanDetail))),
        ("keylane_unsigned_records_total", "kind", {"intent", "approval", "result"}),
        ("keylane_timers_fired_total", "kind", {"hitl", "ttl"}),
        ("keylane_effector_intents_total", "status", set(get_args(ToolStatus))),
        (
            "keylane_effector_in_doubt_total",
            "resolution",
            {"reconciled_done", "reconciled_not_done", "rerun", "error", "expired"},
        ),
        ("keylane_buffered_events_rejected_total", "limit", {"events", "bytes", "state"}),
    ],
)
def test_fixed_vocabularies_are_exported_from_start_up(sample: str, label: str, values: set[str]) -> None:
    metrics.zero_fixed_labels()

    for value in values:
        assert REGISTRY.get_sample_value(sample, {label: value}) is not None, f"{sample}{{{label}={value!r}}}"


def test_the_exposition_passes_promtool_check_metrics() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not on PATH: run deploy/install-system-deps.sh", pytrace=False)
    metrics.zero_fixed_labels()
    metrics.set_info(role="worker", app_id="unit", topic_prefix="t.", version="0")
    gen_ai = ("chat", "fake", "m")
    metrics.GEN_AI_DURATION.labels(*gen_ai, "").observe(0.2)
    metrics.GEN_AI_TOKENS.labels(*gen_ai, "input").observe(12)
    metrics.CONSUMER_LAG.labels("t.agent.events", "0").set(0)

    try:
        exposition = generate_latest(REGISTRY)
    finally:
        metrics.CONSUMER_LAG.remove("t.agent.events", "0")

    result = subprocess.run([promtool, "check", "metrics"], input=exposition, capture_output=True, timeout=60)

    assert (result.returncode, result.stdout + result.stderr) == (0, b"")


def test_every_topic_label_leaves_the_prefix_out_as_the_catalog_names_the_topic() -> None:
    metrics.use_topic_prefix("prod.")
    try:
        assert metrics.topic_label("prod.agent.events") == "agent.events"
        assert metrics.topic_label("prod.keylane-state-changelog") == "keylane-state-changelog"
        assert metrics.topic_label("other.agent.events") == "other.agent.events"
    finally:
        metrics.use_topic_prefix("")
    assert metrics.topic_label("prod.agent.events") == "prod.agent.events"
