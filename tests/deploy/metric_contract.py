"""The metrics keylane's workers and effectors export, as the dashboards and alert rules in
deploy/ may use them: names, types and labels (the table in docs/operations.md).

CONTRACT is the expected table; ``registry_metrics()`` reads the same from the live registry
(prometheus_client's REGISTRY once keylane.metrics, where every keylane metric is declared, is
imported), and tests/deploy/test_metric_contract.py holds the two equal both ways. So the checks
of the dashboards and rules against CONTRACT hold them to the code itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, cast

# Every scraped series carries these, whatever the metric.
TARGET_LABELS = frozenset({"job", "instance"})


@dataclass(frozen=True)
class Metric:
    """One metric family: its name without the `_total` / `_bucket` suffixes Prometheus adds."""

    name: str
    kind: Literal["counter", "histogram", "gauge"]
    labels: tuple[str, ...] = ()

    def exposed(self) -> dict[str, frozenset[str]]:
        """Series names Prometheus stores for this family -> the labels each one may carry."""
        labels = frozenset(self.labels) | TARGET_LABELS
        if self.kind == "counter":
            return {f"{self.name}_total": labels}
        if self.kind == "histogram":
            return {
                f"{self.name}_bucket": labels | {"le"},
                f"{self.name}_sum": labels,
                f"{self.name}_count": labels,
            }
        return {self.name: labels}


_GEN_AI = ("gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_request_model")
_TOPIC_PARTITION = ("topic", "partition")

CONTRACT: tuple[Metric, ...] = (
    # Counters.
    Metric("keylane_activations", "counter", ("kind",)),
    Metric("keylane_outputs", "counter"),
    Metric("keylane_intents_emitted", "counter"),
    Metric("keylane_suspensions", "counter"),
    Metric("keylane_events_buffered", "counter"),
    Metric("keylane_agent_errors", "counter", ("reason",)),
    Metric("keylane_orphaned_results", "counter", ("detail",)),
    Metric("keylane_llm_calls", "counter"),
    Metric("keylane_llm_cache_hits", "counter"),
    Metric("keylane_llm_errors", "counter", ("error",)),
    Metric("keylane_llm_retries", "counter", ("error",)),
    Metric("keylane_tool_calls", "counter"),
    Metric("keylane_unsigned_records", "counter", ("kind",)),
    Metric("keylane_partition_pauses", "counter", ("partition",)),
    Metric("keylane_records_abandoned", "counter"),
    Metric("keylane_poison_records", "counter", ("topic",)),
    Metric("keylane_stall_rereads", "counter", ("topic",)),
    Metric("keylane_restore_rereads", "counter"),
    Metric("keylane_quarantined_keys", "gauge"),
    Metric("keylane_paused_keys", "gauge"),
    Metric("keylane_inputs_held", "counter", ("topic",)),
    Metric("keylane_redriven_records", "counter", ("topic",)),
    Metric("keylane_stale_state_writes", "counter"),
    Metric("keylane_records_too_large", "counter", ("topic",)),
    Metric("keylane_redeliveries", "counter", ("topic",)),
    Metric("keylane_timers_fired", "counter", ("kind",)),
    Metric("keylane_key_commands", "counter", ("action", "outcome")),
    Metric("keylane_effector_intents", "counter", ("status",)),
    Metric("keylane_effector_executions", "counter"),
    Metric("keylane_effector_republished", "counter"),
    Metric("keylane_effector_in_doubt", "counter", ("resolution",)),
    Metric("keylane_buffered_events_rejected", "counter", ("limit",)),
    Metric("keylane_state_over_limit", "counter"),
    # Counters no dashboard or rule reads: diagnostics docs/runtime.md explains.
    Metric("keylane_records_rerouted", "counter", ("topic",)),
    Metric("keylane_streams_restarted", "counter", ("topic",)),
    Metric("keylane_unawaited_results", "counter", ("kind",)),
    Metric("keylane_memory_soft_cap_warnings", "counter"),
    Metric("keylane_timers_ignored", "counter"),
    Metric("keylane_timers_sent", "counter", ("kind",)),
    Metric("keylane_state_cache_trimmed", "counter"),
    # Histograms.
    Metric("keylane_activation_duration_seconds", "histogram"),
    Metric("keylane_activation_overhead_seconds", "histogram"),
    Metric("keylane_lane_wait_seconds", "histogram"),
    Metric("keylane_rate_limit_wait_seconds", "histogram"),
    Metric("keylane_llm_call_duration_seconds", "histogram"),
    Metric("keylane_state_bytes", "histogram"),
    Metric("keylane_memory_bytes", "histogram"),
    Metric("keylane_buffered_depth", "histogram"),
    # OpenTelemetry GenAI, as Prometheus translates them.
    Metric("gen_ai_client_operation_duration_seconds", "histogram", (*_GEN_AI, "error_type")),
    Metric("gen_ai_client_token_usage", "histogram", (*_GEN_AI, "gen_ai_token_type")),
    # Gauges.
    Metric("keylane_in_flight", "gauge", ("partition",)),
    Metric("keylane_lane_queue_depth", "gauge", ("partition",)),
    Metric("keylane_llm_breaker_open", "gauge"),
    Metric("keylane_waiting_keys", "gauge", ("kind",)),
    Metric("keylane_consumer_lag", "gauge", _TOPIC_PARTITION),
    Metric("keylane_consumer_committed_offset", "gauge", _TOPIC_PARTITION),
    Metric("keylane_consumer_last_commit_timestamp_seconds", "gauge", _TOPIC_PARTITION),
    Metric("keylane_info", "gauge", ("role", "app_id", "topic_prefix", "version")),
)

# Prometheus jobs scraping keylane (deploy/prometheus/prometheus.yml).
JOBS = ("keylane-worker", "keylane-effector")


def exposed_series() -> dict[str, frozenset[str]]:
    """Every series name of the contract -> the labels it may carry."""
    series: dict[str, frozenset[str]] = {}
    for metric in CONTRACT:
        series.update(metric.exposed())
    return series


# The prefixes of keylane's own metric families; the rest of the registry is prometheus_client's
# process and platform collectors.
PREFIXES = ("keylane_", "gen_ai_")


def registry_metrics() -> tuple[Metric, ...]:
    """Every keylane metric family the live registry exports, as a contract row: its name,
    type and label names (in declaration order), sorted by name."""
    from prometheus_client import REGISTRY

    import keylane.metrics  # noqa: F401 - declares (registers) every keylane metric

    collectors = cast(dict[str, Any], REGISTRY._names_to_collectors)  # name -> its metric object
    found = []
    for family in REGISTRY.collect():
        if not family.name.startswith(PREFIXES):
            continue
        collector = collectors[family.name]
        labels = tuple(collector._labelnames)
        for sample in family.samples:  # what is exported carries exactly those labels
            assert set(sample.labels) - {"le"} == set(labels), (family.name, sample)
        kind = cast(Literal["counter", "histogram", "gauge"], family.type)
        found.append(Metric(family.name, kind, labels))
    return tuple(sorted(found, key=lambda metric: metric.name))
