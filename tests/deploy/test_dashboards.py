"""deploy/grafana/dashboards/: each dashboard decodes into the Grafana Foundation SDK's
dashboard model and is what deploy/grafana/generate_dashboards.py writes; panels are unique,
on the `${datasource}` variable, filtered by the job and instance variables, with no host in
any expression, and read only the metrics and labels of the contract."""

from __future__ import annotations

import importlib.util
import json
import re
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from tests.deploy.metric_contract import exposed_series
from tests.deploy.promql import parse
from tests.deploy.tools import REPO, explain, require, run

GRAFANA = REPO / "deploy" / "grafana"
DASHBOARDS = sorted((GRAFANA / "dashboards").glob("*.json"))
GENERATOR = GRAFANA / "generate_dashboards.py"
DATASOURCE_REF = {"type": "prometheus", "uid": "${datasource}"}
SDK_PIN = "grafana-foundation-sdk==1769699379!11.6.0"


def _sdk() -> ModuleType:
    try:
        from grafana_foundation_sdk.cog import plugins
    except ImportError:
        pytest.fail(
            f"the Grafana Foundation SDK is not installed: .venv/bin/pip install '{SDK_PIN}' "
            "(or `.venv/bin/pip install -e '.[test]'`)",
            pytrace=False,
        )
    plugins.register_default_plugins()
    return plugins


def _load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, rows and the panels inside collapsed rows included."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def _queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    for panel in _panels(dashboard):
        for target in panel.get("targets", []):
            yield panel["title"], target["expr"]


def _is_subset(small: Any, big: Any, path: str = "") -> list[str]:
    """Where `small` has something `big` lacks (dict keys recursively, lists item by item)."""
    if isinstance(small, dict) and isinstance(big, dict):
        return [
            miss for key, value in small.items() for miss in _is_subset(value, big.get(key), f"{path}.{key}")
        ]
    if isinstance(small, list) and isinstance(big, list) and len(small) == len(big):
        return [
            miss
            for i, (a, b) in enumerate(zip(small, big, strict=True))
            for miss in _is_subset(a, b, f"{path}[{i}]")
        ]
    return [] if small == big else [path]


def test_there_are_the_two_dashboards() -> None:
    assert [path.name for path in DASHBOARDS] == ["keylane-llm-effector.json", "keylane-overview.json"]


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda path: path.name)
def test_decodes_into_the_sdk_dashboard_model(path: Path) -> None:
    _sdk()
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models import dashboard as models
    from grafana_foundation_sdk.models import prometheus

    data = _load(path)
    decoded = models.Dashboard.from_json(data)

    assert decoded.uid == path.stem
    assert decoded.schema_version >= 39
    assert decoded.panels
    for panel in decoded.panels:
        if isinstance(panel, models.RowPanel):
            continue
        assert isinstance(panel, models.Panel)
        assert panel.targets, panel.title
        for target in panel.targets:
            assert isinstance(target, prometheus.Dataquery), f"{panel.title}: not a Prometheus query"
    # Nothing the model does not know: re-encoding what was decoded keeps every field.
    encoded = json.loads(json.dumps(decoded, cls=JSONEncoder))
    assert _is_subset(data, encoded) == []


def test_the_committed_json_is_the_generators_output() -> None:
    _sdk()
    spec = importlib.util.spec_from_file_location("generate_dashboards", GENERATOR)
    assert spec is not None and spec.loader is not None
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)

    rendered: dict[str, str] = generator.render()

    assert sorted(rendered) == [path.name for path in DASHBOARDS]
    for path in DASHBOARDS:
        assert path.read_text() == rendered[path.name], (
            f"{path.name} is stale: run .venv/bin/python deploy/grafana/generate_dashboards.py"
        )


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda path: path.name)
def test_panel_ids_are_unique_and_panels_do_not_overlap(path: Path) -> None:
    dashboard = _load(path)
    ids = [panel["id"] for panel in _panels(dashboard)]

    assert len(ids) == len(set(ids)), f"duplicate panel ids: {sorted(i for i in ids if ids.count(i) > 1)}"
    cells: dict[tuple[int, int], str] = {}
    for panel in _panels(dashboard):
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = panel["title"]


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda path: path.name)
def test_every_panel_and_query_uses_the_datasource_variable(path: Path) -> None:
    dashboard = _load(path)

    for panel in _panels(dashboard):
        if panel["type"] == "row":
            assert "targets" not in panel, panel["title"]
            continue
        assert panel.get("datasource") == DATASOURCE_REF, panel["title"]
        for target in panel["targets"]:
            assert target.get("datasource", DATASOURCE_REF) == DATASOURCE_REF, panel["title"]
    # And no data source uid anywhere else (variables, annotations) but the variable.
    uids = re.findall(r'"uid":\s*"([^"]*)"', json.dumps({k: v for k, v in dashboard.items() if k != "uid"}))
    assert set(uids) <= {"${datasource}"}


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda path: path.name)
def test_the_template_variables(path: Path) -> None:
    variables = {v["name"]: v for v in _load(path)["templating"]["list"]}

    assert list(variables) == ["datasource", "job", "prefix", "instance"]
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["job"]["query"] == "label_values(keylane_info, job)"
    assert variables["prefix"]["query"] == 'label_values(keylane_info{job=~"$job"}, topic_prefix)'
    assert (
        variables["instance"]["query"]
        == 'label_values(keylane_info{job=~"$job", topic_prefix=~"$prefix"}, instance)'
    )
    for name in ("job", "prefix", "instance"):
        assert variables[name]["type"] == "query"
        assert variables[name]["datasource"] == DATASOURCE_REF, name
        assert variables[name]["includeAll"] and variables[name]["multi"], name


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda path: path.name)
def test_every_selector_filters_on_job_and_instance_and_no_host_is_hard_coded(path: Path) -> None:
    for title, expr in _queries(_load(path)):
        parsed = parse(expr)
        assert parsed.selectors, f"{title}: {expr}"
        for selector in parsed.selectors:
            matchers = {(m.label, m.op, m.value) for m in selector.matchers}
            assert ("job", "=~", "$job") in matchers, f'{title}: {selector.name} lacks job=~"$job"'
            assert ("instance", "=~", "$instance") in matchers, f"{title}: {selector.name} lacks instance"
            for m in selector.matchers:
                if m.label in {"job", "instance"}:
                    assert m.value == f"${m.label}", f"{title}: {m.label}{m.op}{m.value!r} is hard-coded"
        assert not re.search(r"[\w.-]+:\d{2,5}\b", expr), f"{title}: a host:port in {expr}"
        assert not re.search(r"\b(localhost|127\.0\.0\.1)\b", expr), f"{title}: a host in {expr}"


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda path: path.name)
def test_rates_use_the_rate_interval(path: Path) -> None:
    for title, expr in _queries(_load(path)):
        assert set(parse(expr).ranges) <= {"$__rate_interval"}, f"{title}: {expr}"


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda path: path.name)
def test_queries_read_only_contract_metrics_and_their_labels(path: Path) -> None:
    known = exposed_series()

    for panel in _panels(_load(path)):
        for target in panel.get("targets", []):
            parsed = parse(target["expr"])
            unknown = parsed.series - set(known)
            assert unknown == set(), f"{panel['title']}: not in the contract: {sorted(unknown)}"
            available = set().union(*(known[name] for name in parsed.series))
            for selector in parsed.selectors:
                labels = {m.label for m in selector.matchers}
                assert labels <= known[selector.name], f"{panel['title']}: {selector.name} {labels}"
            assert parsed.grouping_labels <= available, f"{panel['title']}: by {parsed.grouping_labels}"
            legend = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", target.get("legendFormat", "")))
            assert legend <= available, f"{panel['title']}: legend {legend}"
            if parsed.grouping_labels:
                assert legend <= parsed.grouping_labels, (
                    f"{panel['title']}: legend {legend} is aggregated away"
                )


def test_every_query_is_valid_promql(tmp_path: Path) -> None:
    """promtool parses each query, Grafana's variables replaced by what they expand to."""
    promtool = require("promtool")
    expand = {"$__rate_interval": "1m", "$job": "keylane-worker|keylane-effector", "$instance": ".+"}
    rules = []
    for path in DASHBOARDS:
        for i, (_, expr) in enumerate(_queries(_load(path))):
            for variable, value in expand.items():
                expr = expr.replace(variable, value)
            assert "$" not in expr, expr
            rules.append({"record": f"dashboard:{path.stem.replace('-', '_')}:{i}", "expr": expr})
    rule_file = tmp_path / "dashboard-queries.yml"
    rule_file.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))

    result = run([promtool, "check", "rules", str(rule_file)])

    assert result.returncode == 0, explain(result)
    assert f"{len(rules)} rules found" in result.stdout, explain(result)


def test_the_provisioned_datasource_and_dashboard_provider() -> None:
    datasources = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text())
    providers = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "keylane.yml").read_text())

    (datasource,) = datasources["datasources"]
    assert datasource["type"] == "prometheus"
    assert datasource["uid"] == "keylane-prometheus"
    assert datasource["url"] == "http://prometheus:9090"
    (provider,) = providers["providers"]
    assert provider["type"] == "file"
    assert provider["options"]["path"] == "/etc/grafana/dashboards"
