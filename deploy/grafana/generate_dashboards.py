"""Writes keylane's Grafana dashboards (deploy/grafana/dashboards/*.json) with the Grafana
Foundation SDK (PyPI grafana-foundation-sdk, pinned in pyproject's `test` extra).

    .venv/bin/python deploy/grafana/generate_dashboards.py          # rewrite the JSON
    .venv/bin/python deploy/grafana/generate_dashboards.py --check  # exit 1 if it is stale

The JSON is committed (Grafana's file provisioning reads it as is); tests/deploy/test_dashboards.py
checks that it equals this script's output, so change the panels here and regenerate.

Every query filters on the `job` and `instance` variables (`instance` lists the processes of
the chosen jobs and topic prefixes, from keylane_info), every panel and query uses the
`${datasource}` variable, and every rate uses `$__rate_interval`. Metric names are the ones
docs/operations.md lists.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as builders
from grafana_foundation_sdk.builders import prometheus, statetimeline, table, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as models
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

OUT_DIR = Path(__file__).resolve().parent / "dashboards"

DATASOURCE = models.DataSourceRef(type_val="prometheus", uid="${datasource}")
# Every series selector in every panel carries this.
SEL = 'job=~"$job", instance=~"$instance"'
RATE = "[$__rate_interval]"

TIMESERIES_HEIGHT = 8


def _rate(metric: str, by: str = "") -> str:
    """sum [by (...)] (rate(metric{SEL}[$__rate_interval]))."""
    grouping = f" by ({by})" if by else ""
    return f"sum{grouping} (rate({metric}{{{SEL}}}{RATE}))"


CANCELLED = f'sum (rate(keylane_key_commands_total{{{SEL}, action="cancel", outcome="done"}}{RATE}))'
"""Suspensions operators ended with `keylane cancel`, per second."""


def _quantile(q: float, histogram: str, by: str = "") -> str:
    grouping = f"le, {by}" if by else "le"
    return f"histogram_quantile({q}, sum by ({grouping}) (rate({histogram}_bucket{{{SEL}}}{RATE})))"


def _target(expr: str, legend: str, ref_id: str) -> prometheus.Dataquery:
    return prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref_id).datasource(DATASOURCE)


def _refs(targets: list[tuple[str, str]]) -> list[prometheus.Dataquery]:
    return [_target(expr, legend, chr(ord("A") + i)) for i, (expr, legend) in enumerate(targets)]


def _legend() -> common_builders.VizLegendOptions:
    return (
        common_builders.VizLegendOptions()
        .display_mode(common.LegendDisplayMode.LIST)
        .placement(common.LegendPlacement.BOTTOM)
        .show_legend(True)
    )


def _tooltip() -> common_builders.VizTooltipOptions:
    return (
        common_builders.VizTooltipOptions()
        .mode(common.TooltipDisplayMode.MULTI)
        .sort(common.SortOrder.DESCENDING)
    )


def _timeseries(
    panel_id: int,
    title: str,
    description: str,
    targets: list[tuple[str, str]],
    *,
    unit: str,
    width: int,
    max_value: float | None = None,
) -> timeseries.Panel:
    panel = (
        timeseries.Panel()
        .id(panel_id)
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .targets(_refs(targets))
        .unit(unit)
        .min(0)
        .height(TIMESERIES_HEIGHT)
        .span(width)
        .line_width(1)
        .fill_opacity(10)
        .show_points(common.VisibilityMode.NEVER)
        .legend(_legend())
        .tooltip(_tooltip())
    )
    if max_value is not None:
        panel = panel.max(max_value)
    return panel


def _row(panel_id: int, title: str) -> builders.Row:
    return builders.Row(title).id(panel_id)


def _variables() -> list[builders.QueryVariable | builders.DatasourceVariable]:
    everything = models.VariableOption(selected=True, text="All", value="$__all")

    def query(name: str, label: str, expr: str, description: str) -> builders.QueryVariable:
        return (
            builders.QueryVariable(name)
            .label(label)
            .description(description)
            .datasource(DATASOURCE)
            .query(expr)
            .refresh(models.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(models.VariableSort.ALPHABETICAL_ASC)
            .multi(True)
            .include_all(True)
            .current(everything)
        )

    return [
        builders.DatasourceVariable("datasource")
        .label("Data source")
        .description("The Prometheus that scrapes keylane's workers and effectors.")
        .type("prometheus"),
        query("job", "Job", "label_values(keylane_info, job)", "Prometheus jobs exporting keylane_info."),
        # An empty topic prefix (the default) is no label at all in Prometheus: "All" is .*,
        # which matches it, rather than the list of the prefixes found.
        query(
            "prefix",
            "Topic prefix",
            'label_values(keylane_info{job=~"$job"}, topic_prefix)',
            "KEYLANE_TOPIC_PREFIX of the deployment; All includes the empty prefix.",
        ).all_value(".*"),
        query(
            "instance",
            "Instance",
            'label_values(keylane_info{job=~"$job", topic_prefix=~"$prefix"}, instance)',
            "Worker and effector processes of the chosen jobs and topic prefixes.",
        ),
    ]


def _links() -> list[builders.DashboardLink]:
    return [
        builders.DashboardLink("keylane dashboards")
        .type(models.DashboardLinkType.DASHBOARDS)
        .tags(["keylane"])
        .as_dropdown(False)
        .include_vars(True)
        .keep_time(True)
    ]


def _dashboard(uid: str, title: str, description: str) -> builders.Dashboard:
    dashboard = (
        builders.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(["keylane"])
        .timezone("browser")
        .editable()
        .tooltip(models.DashboardCursorSync.CROSSHAIR)
        .time("now-1h", "now")
        .refresh("30s")
        .links(_links())
    )
    for variable in _variables():
        dashboard = dashboard.with_variable(variable)
    return dashboard


def overview() -> builders.Dashboard:
    processes = (
        table.Panel()
        .id(2)
        .title("Processes")
        .description("Every worker and effector the variables select: role, app id, topic prefix, version.")
        .datasource(DATASOURCE)
        .with_target(
            prometheus.Dataquery()
            .expr(f"keylane_info{{{SEL}}}")
            .instant()
            .format(PromQueryFormat.TABLE)
            .ref_id("A")
            .datasource(DATASOURCE)
        )
        .with_transformation(
            models.DataTransformerConfig(
                id_val="organize",
                options={
                    "excludeByName": {"Time": True, "Value": True, "__name__": True},
                    "indexByName": {
                        "role": 0,
                        "instance": 1,
                        "job": 2,
                        "app_id": 3,
                        "topic_prefix": 4,
                        "version": 5,
                    },
                },
            )
        )
        .height(5)
        .span(24)
    )
    return (
        _dashboard(
            "keylane-overview",
            "keylane / Overview",
            "Activations, latency, suspensions, dead letters and Kafka consumption of keylane's "
            "workers and effectors. Runbooks: docs/operations.md.",
        )
        .with_row(_row(1, "Processes"))
        .with_panel(processes)
        .with_row(_row(10, "Throughput"))
        .with_panel(
            _timeseries(
                11,
                "Activations/s by kind",
                "Committed activations per second: starts (a new event) and resumes (a result, "
                "an approval or a timer).",
                [(_rate("keylane_activations_total", "kind"), "{{kind}}")],
                unit="ops",
                width=8,
            )
        )
        .with_panel(
            _timeseries(
                12,
                "Outputs/s",
                "Records produced to agent.output per second.",
                [(_rate("keylane_outputs_total"), "outputs")],
                unit="ops",
                width=8,
            )
        )
        .with_panel(
            _timeseries(
                13,
                "Intents emitted/s",
                "Records produced to agent.intents per second (side effects and approval requests).",
                [(_rate("keylane_intents_emitted_total"), "intents")],
                unit="ops",
                width=8,
            )
        )
        .with_row(_row(20, "Latency"))
        .with_panel(
            _timeseries(
                21,
                "Activation duration p50 / p95 / p99",
                "Wall time of one activation, model and tool calls included.",
                [
                    (_quantile(q, "keylane_activation_duration_seconds"), f"p{round(q * 100)}")
                    for q in (0.5, 0.95, 0.99)
                ],
                unit="s",
                width=12,
            )
        )
        .with_panel(
            _timeseries(
                22,
                "Activation overhead p50 / p95 / p99",
                "Activation wall time minus model and tool time: what keylane itself costs.",
                [
                    (_quantile(q, "keylane_activation_overhead_seconds"), f"p{round(q * 100)}")
                    for q in (0.5, 0.95, 0.99)
                ],
                unit="s",
                width=12,
            )
        )
        .with_row(_row(30, "Keys"))
        .with_panel(
            _timeseries(
                31,
                "Suspensions/s, events buffered/s and operator actions/s",
                "Activations that suspended (waiting for a tool result or an approval), events "
                "queued behind a suspended key, suspensions operators ended (keylane cancel), "
                "inputs paused keys held (keylane pause) and dead letters re-driven (keylane errors "
                "redrive).",
                [
                    (_rate("keylane_suspensions_total"), "suspensions"),
                    (_rate("keylane_events_buffered_total"), "events buffered"),
                    (CANCELLED, "cancelled by an operator"),
                    (_rate("keylane_inputs_held_total"), "held by a paused key"),
                    (_rate("keylane_redriven_records_total"), "re-driven dead letters"),
                ],
                unit="ops",
                width=6,
            )
        )
        .with_panel(
            _timeseries(
                32,
                "Keys waiting, paused and quarantined",
                "Keys suspended now, by what they wait for; keys an operator paused (keylane "
                "pause: their inputs are held); and keys whose state does not read (quarantined: "
                "their inputs go to agent.errors as poison_state).",
                [
                    (f"sum by (kind) (keylane_waiting_keys{{{SEL}}})", "{{kind}}"),
                    (f"sum(keylane_paused_keys{{{SEL}}})", "paused"),
                    (f"sum(keylane_quarantined_keys{{{SEL}}})", "quarantined"),
                ],
                unit="short",
                width=6,
            )
        )
        .with_panel(
            _timeseries(
                33,
                "Timers fired/s by kind",
                "Due timers (suspension deadlines, TTLs) applied by their key's lane.",
                [(_rate("keylane_timers_fired_total", "kind"), "{{kind}}")],
                unit="ops",
                width=6,
            )
        )
        .with_panel(
            _timeseries(
                34,
                "Key state and memory size p95",
                "Encoded size of the key states committed, and of the agents' memory.",
                [
                    (_quantile(0.95, "keylane_state_bytes"), "state p95"),
                    (_quantile(0.95, "keylane_memory_bytes"), "memory p95"),
                ],
                unit="bytes",
                width=6,
            )
        )
        .with_row(_row(40, "Errors"))
        .with_panel(
            _timeseries(
                41,
                "Dead letters/s by reason",
                "Records written to agent.errors, by reason (docs/runtime.md#reasons-on-agenterrors), "
                "and results or approvals refused by resume admission, by detail.",
                [
                    (_rate("keylane_agent_errors_total", "reason"), "{{reason}}"),
                    (_rate("keylane_orphaned_results_total", "detail"), "orphaned: {{detail}}"),
                ],
                unit="ops",
                width=12,
            )
        )
        .with_panel(
            _timeseries(
                42,
                "Refused, redelivered and abandoned records/s",
                "Inputs that kept failing (poison), records over their topic's limit, records with "
                "a missing or bad signature, events refused by a full buffer or state limit, "
                "redeliveries recognised, partitions and table restores read again after a stall, "
                "and records given up on a revocation.",
                [
                    (_rate("keylane_poison_records_total", "topic"), "poison: {{topic}}"),
                    (_rate("keylane_records_too_large_total", "topic"), "too large: {{topic}}"),
                    (_rate("keylane_unsigned_records_total", "kind"), "unsigned: {{kind}}"),
                    (_rate("keylane_buffered_events_rejected_total", "limit"), "buffer full: {{limit}}"),
                    (_rate("keylane_state_over_limit_total"), "state over limit"),
                    (_rate("keylane_redeliveries_total", "topic"), "redelivered: {{topic}}"),
                    (_rate("keylane_stall_rereads_total", "topic"), "stall re-read: {{topic}}"),
                    (_rate("keylane_restore_rereads_total"), "restore re-read"),
                    (_rate("keylane_records_abandoned_total"), "abandoned on revocation"),
                ],
                unit="ops",
                width=12,
            )
        )
        .with_row(_row(50, "Kafka consumption"))
        .with_panel(
            _timeseries(
                51,
                "Consumer lag by topic",
                "Records between the group's committed offset and the log end, summed over the "
                "topic's partitions (each counted once while a rebalance moves it).",
                [
                    (
                        f"sum by (topic) (max by (topic, partition) (keylane_consumer_lag{{{SEL}}}))",
                        "{{topic}}",
                    )
                ],
                unit="short",
                width=12,
            )
        )
        .with_panel(
            _timeseries(
                52,
                "Time since last commit",
                "Seconds since a commit last advanced each partition's offset. Large on an idle "
                "partition; with lag as well, the partition is stalled (KeylanePartitionStalled).",
                [
                    (
                        "time() - max by (topic, partition) "
                        f"(keylane_consumer_last_commit_timestamp_seconds{{{SEL}}})",
                        "{{topic}}[{{partition}}]",
                    )
                ],
                unit="s",
                width=12,
            )
        )
        .with_panel(
            _timeseries(
                53,
                "Lane queue depth",
                "Records waiting for their key's lane, per partition: a busy key shows here.",
                [
                    (
                        f"sum by (instance, partition) (keylane_lane_queue_depth{{{SEL}}})",
                        "{{instance}} p{{partition}}",
                    )
                ],
                unit="short",
                width=6,
            )
        )
        .with_panel(
            _timeseries(
                54,
                "Records in flight",
                "Records being processed now, per partition.",
                [
                    (
                        f"sum by (instance, partition) (keylane_in_flight{{{SEL}}})",
                        "{{instance}} p{{partition}}",
                    )
                ],
                unit="short",
                width=6,
            )
        )
        .with_panel(
            _timeseries(
                55,
                "Lane wait p95",
                "Time a record waited for its lane before it ran, per instance.",
                [(_quantile(0.95, "keylane_lane_wait_seconds", "instance"), "{{instance}}")],
                unit="s",
                width=6,
            )
        )
        .with_panel(
            _timeseries(
                56,
                "Partition pauses/s",
                "Times fetching stopped for a partition whose lane window was full (backpressure).",
                [
                    (
                        _rate("keylane_partition_pauses_total", "instance, partition"),
                        "{{instance}} p{{partition}}",
                    )
                ],
                unit="ops",
                width=6,
            )
        )
    )


def llm_effector() -> builders.Dashboard:
    breaker = (
        statetimeline.Panel()
        .id(7)
        .title("Circuit breaker")
        .description(
            "The model provider's circuit breaker per worker: open or half-open (calls fail fast), or closed."
        )
        .datasource(DATASOURCE)
        .with_target(_target(f"max by (instance) (keylane_llm_breaker_open{{{SEL}}})", "{{instance}}", "A"))
        .mappings(
            [
                models.ValueMap(
                    options={
                        "0": models.ValueMappingResult(text="closed", color="green", index=0),
                        "1": models.ValueMappingResult(text="open", color="red", index=1),
                    }
                )
            ]
        )
        .thresholds(
            builders.ThresholdsConfig()
            .mode(models.ThresholdsMode.ABSOLUTE)
            .steps([models.Threshold(value=None, color="green"), models.Threshold(value=1, color="red")])
        )
        .color_scheme(builders.FieldColor().mode(models.FieldColorModeId.THRESHOLDS))
        .legend(_legend())
        .tooltip(_tooltip())
        .height(TIMESERIES_HEIGHT)
        .span(8)
    )
    return (
        _dashboard(
            "keylane-llm-effector",
            "keylane / Model calls and effector",
            "Model calls, tokens, latency, retries and the circuit breaker of keylane's workers; "
            "the effector's intents, executions and in-doubt resolutions. Runbooks: docs/operations.md.",
        )
        .with_row(_row(1, "Model calls"))
        .with_panel(
            _timeseries(
                2,
                "Model calls/s",
                "Calls that reached the provider, calls answered by the replay cache, and read-only "
                "tool calls run inline.",
                [
                    (_rate("keylane_llm_calls_total"), "provider calls"),
                    (_rate("keylane_llm_cache_hits_total"), "cache hits"),
                    (_rate("keylane_tool_calls_total"), "inline tool calls"),
                ],
                unit="ops",
                width=8,
            )
        )
        .with_panel(
            _timeseries(
                3,
                "Cache-hit ratio",
                "Share of model calls answered by the replay cache (a redelivered or replayed "
                "activation) instead of the provider.",
                [
                    (
                        f"{_rate('keylane_llm_cache_hits_total')} / ({_rate('keylane_llm_cache_hits_total')} "
                        f"+ {_rate('keylane_llm_calls_total')})",
                        "cache hits",
                    )
                ],
                unit="percentunit",
                width=8,
                max_value=1,
            )
        )
        .with_panel(
            _timeseries(
                4,
                "Tokens/s by token type",
                "Tokens the provider reported, input and output (OpenTelemetry gen_ai.client.token.usage).",
                [(_rate("gen_ai_client_token_usage_sum", "gen_ai_token_type"), "{{gen_ai_token_type}}")],
                unit="short",
                width=8,
            )
        )
        .with_panel(
            _timeseries(
                5,
                "Model call latency p50 / p95 by model",
                "Duration of one provider call (OpenTelemetry gen_ai.client.operation.duration).",
                [
                    (
                        _quantile(q, "gen_ai_client_operation_duration_seconds", "gen_ai_request_model"),
                        f"p{round(q * 100)} {{{{gen_ai_request_model}}}}",
                    )
                    for q in (0.5, 0.95)
                ],
                unit="s",
                width=8,
            )
        )
        .with_panel(
            _timeseries(
                6,
                "Retries and errors/s by class",
                "Provider attempts retried, and calls that failed after retries, by error class.",
                [
                    (_rate("keylane_llm_retries_total", "error"), "retry: {{error}}"),
                    (_rate("keylane_llm_errors_total", "error"), "failed: {{error}}"),
                ],
                unit="ops",
                width=8,
            )
        )
        .with_panel(breaker)
        .with_panel(
            _timeseries(
                8,
                "Calls/s by model and outcome",
                "Provider calls per model; error_type is set on the calls that failed.",
                [
                    (
                        _rate(
                            "gen_ai_client_operation_duration_seconds_count",
                            "gen_ai_request_model, error_type",
                        ),
                        "{{gen_ai_request_model}} {{error_type}}",
                    )
                ],
                unit="ops",
                width=12,
            )
        )
        .with_panel(
            _timeseries(
                9,
                "Rate-limit wait p95",
                "Time a provider call waited for its key's or the worker's rate limit.",
                [(_quantile(0.95, "keylane_rate_limit_wait_seconds"), "p95")],
                unit="s",
                width=12,
            )
        )
        .with_row(_row(20, "Effector"))
        .with_panel(
            _timeseries(
                21,
                "Intents finished/s by status",
                "Intents the effector finished, by the status of their result.",
                [(_rate("keylane_effector_intents_total", "status"), "{{status}}")],
                unit="ops",
                width=6,
            )
        )
        .with_panel(
            _timeseries(
                22,
                "Tool executions/s",
                "Tool executions the effector started.",
                [(_rate("keylane_effector_executions_total"), "executions")],
                unit="ops",
                width=6,
            )
        )
        .with_panel(
            _timeseries(
                23,
                "In-doubt intents/s by resolution",
                "Intents found claimed without an outcome after their lease (an attempt died mid-tool), "
                "by how they were resolved (docs/effector.md).",
                [(_rate("keylane_effector_in_doubt_total", "resolution"), "{{resolution}}")],
                unit="ops",
                width=6,
            )
        )
        .with_panel(
            _timeseries(
                24,
                "Results republished/s",
                "Intents already done whose stored result was published again (a redelivered intent).",
                [(_rate("keylane_effector_republished_total"), "republished")],
                unit="ops",
                width=6,
            )
        )
    )


DASHBOARDS = {
    "keylane-overview.json": overview,
    "keylane-llm-effector.json": llm_effector,
}


def render() -> dict[str, str]:
    """File name -> the JSON text this script writes."""
    return {
        name: json.dumps(build().build(), cls=JSONEncoder, indent=2, ensure_ascii=False) + "\n"
        for name, build in DASHBOARDS.items()
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="exit 1 if a committed file differs")
    args = parser.parse_args(argv)
    stale = []
    for name, text in render().items():
        path = OUT_DIR / name
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print(f"stale: {', '.join(stale)}; run {Path(__file__).name} to regenerate", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
