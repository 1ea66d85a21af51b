"""A real Prometheus for broker tests, and the Grafana dashboards' queries to send it.

    with running_prometheus({"keylane-worker": [f"127.0.0.1:{port}"]}, tmp_path) as prometheus:
        prometheus.wait_targets_up({"keylane-worker"})
        empty = prometheus.wait_nonempty(panel_queries(DASHBOARDS, GrafanaVariables(prefix="t1.")))

Starting and stopping the process (and its configuration) is deploy/local_prometheus.py, shared
with `make run`; this adds the HTTP API (/api/v1/query, /targets, /rules) with polling, and
Grafana's template variables substituted the way Grafana does before it sends a query.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
import time
import urllib.error
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from tests.broker import REPO

DASHBOARDS = sorted((REPO / "deploy" / "grafana" / "dashboards").glob("*.json"))
SCRAPE_INTERVAL_S = 1


def local_prometheus() -> ModuleType:
    """deploy/local_prometheus.py, loaded by path (a script beside run_local.py, not a package)."""
    if "local_prometheus" in sys.modules:
        return sys.modules["local_prometheus"]
    spec = importlib.util.spec_from_file_location("local_prometheus", REPO / "deploy" / "local_prometheus.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["local_prometheus"] = module
    spec.loader.exec_module(module)
    return module


class PrometheusError(AssertionError):
    """Prometheus refused a query (status "error"): a bad expression, not a missing series."""


@dataclass
class Prometheus:
    """The HTTP API of a running Prometheus."""

    url: str

    def api(self, path: str, **params: str) -> Any:
        try:
            body = local_prometheus().get_json(self.url, f"/api/v1/{path}", params or None)
        except urllib.error.HTTPError as exc:  # 400 and 422 carry {"status": "error", "error": ...}
            body = json.loads(exc.read() or b"{}")
        if body.get("status") != "success":
            raise PrometheusError(f"/api/v1/{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query, now; the result's samples (a scalar becomes one sample)."""
        data = self.api("query", query=expr)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        result: list[dict[str, Any]] = data["result"]
        return result

    def value(self, expr: str) -> float | None:
        """The single sample of ``expr`` as a float; None when the result is empty."""
        result = self.query(expr)
        if not result:
            return None
        assert len(result) == 1, f"{expr} returned {len(result)} series: {result}"
        return float(result[0]["value"][1])

    def targets(self) -> list[dict[str, Any]]:
        targets: list[dict[str, Any]] = self.api("targets", state="active")["activeTargets"]
        return targets

    def rule_groups(self) -> list[dict[str, Any]]:
        groups: list[dict[str, Any]] = self.api("rules")["groups"]
        return groups

    def wait_targets_up(self, jobs: Iterable[str], timeout_s: float = 30) -> list[dict[str, Any]]:
        """Poll /api/v1/targets until every target of ``jobs`` is up (and each job has one)."""
        jobs = set(jobs)
        deadline = time.monotonic() + timeout_s
        while True:
            targets = [t for t in self.targets() if t["labels"].get("job") in jobs]
            seen = {t["labels"]["job"] for t in targets}
            if seen == jobs and all(t["health"] == "up" for t in targets):
                return targets
            if time.monotonic() > deadline:
                shown = [
                    (t["labels"].get("job"), t["scrapeUrl"], t["health"], t["lastError"]) for t in targets
                ]
                raise AssertionError(f"targets of {sorted(jobs)} not all up within {timeout_s}s: {shown}")
            time.sleep(0.5)

    def wait_rules_healthy(self, timeout_s: float = 30) -> list[dict[str, Any]]:
        """Poll /api/v1/rules until every rule of every group was evaluated and is healthy;
        fail with the rules that are not (health "unknown" is "not evaluated yet")."""
        deadline = time.monotonic() + timeout_s
        while True:
            groups = self.rule_groups()
            unhealthy = [
                (group["file"], group["name"], rule["name"], rule["health"], rule.get("lastError", ""))
                for group in groups
                for rule in group["rules"]
                if rule["health"] != "ok"
            ]
            if groups and not unhealthy:
                return groups
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"rule groups not healthy within {timeout_s}s ({len(groups)} groups): {unhealthy}"
                )
            time.sleep(0.5)

    def wait_nonempty(self, queries: Sequence[PanelQuery], timeout_s: float = 60) -> list[PanelQuery]:
        """Poll each query until its result is non-empty (a rate needs two scrapes in its
        window); returns those still empty at the deadline, each with ``problem`` set. A
        query Prometheus refuses is not retried."""
        pending = list(queries)
        failed: list[PanelQuery] = []
        deadline = time.monotonic() + timeout_s
        while pending:
            still: list[PanelQuery] = []
            for query in pending:
                try:
                    if not self.query(query.expr):
                        still.append(query)
                except PrometheusError as exc:
                    failed.append(query.with_problem(str(exc)))
            pending = still
            if pending and time.monotonic() > deadline:
                failed.extend(query.with_problem("empty result") for query in pending)
                break
            if pending:
                time.sleep(1)
        return failed


@contextmanager
def running_prometheus(
    targets: Mapping[str, Sequence[str]], data_dir: Path, *, scrape_interval_s: int = SCRAPE_INTERVAL_S
) -> Iterator[Prometheus]:
    """Prometheus on a free port scraping ``targets`` (job -> host:port list) every
    ``scrape_interval_s`` and evaluating deploy/prometheus/rules/*.rules.yml as often, its
    configuration, TSDB and log in ``data_dir``; stopped on exit."""
    from keylane.testing.processes import free_port

    launcher = local_prometheus()
    port = free_port()
    config = launcher.scrape_config(targets, scrape_interval=f"{scrape_interval_s}s")
    process = launcher.launch(config, data_dir, port=port)
    try:
        yield Prometheus(launcher.url(port))
    finally:
        process.stop(10)


# -- Grafana's side --------------------------------------------------------------------------

# Grafana's own variable syntax (public/app/features/variables/utils.ts): $var, [[var]],
# [[var:format]], ${var}, ${var.field}, ${var:format}.
_VARIABLE = re.compile(r"\$(\w+)|\[\[(\w+?)(?::(\w+))?\]\]|\$\{(\w+)(?:\.([^:^}]+))?(?::([^}]+))?\}")
_LABEL_VALUES = re.compile(r"^\s*label_values\((?:(?P<query>.+),\s*)?(?P<label>\w+)\)\s*$", re.DOTALL)


@dataclass(frozen=True)
class GrafanaVariables:
    """What Grafana puts in place of each template variable for a test's Prometheus: every
    job and instance ("All" on a multi-value variable without a custom all value becomes a
    regex of all values; a regex of the name pattern is what the test means by it), the
    test's own topic prefix, and the built-in intervals."""

    prefix: str
    job: str = "keylane-.*"
    instance: str = ".*"
    rate_interval: str = "15s"
    interval_s: int = 5
    range_s: int = 300

    def values(self) -> dict[str, str]:
        return {
            "datasource": "keylane-prometheus",
            "job": self.job,
            "instance": self.instance,
            # Inside a PromQL string literal: a regex's backslash is written twice.
            "prefix": re.escape(self.prefix).replace("\\", "\\\\"),
            "__rate_interval": self.rate_interval,
            "__interval": f"{self.interval_s}s",
            "__interval_ms": str(self.interval_s * 1000),
            "__range": f"{self.range_s}s",
            "__range_s": str(self.range_s),
            "__range_ms": str(self.range_s * 1000),
        }

    def substitute(self, expr: str) -> str:
        """``expr`` with every variable replaced; KeyError naming one this does not know."""
        values = self.values()

        def replace(match: re.Match[str]) -> str:
            name = match.group(1) or match.group(2) or match.group(4)
            if name not in values:
                raise KeyError(f"unknown Grafana variable ${name} in {expr!r}")
            return values[name]

        return _VARIABLE.sub(replace, expr)


@dataclass(frozen=True)
class PanelQuery:
    """One query of one panel (or of a template variable), variables substituted."""

    dashboard: str
    panel: str
    expr: str
    problem: str = field(default="", compare=False)

    def with_problem(self, problem: str) -> PanelQuery:
        return PanelQuery(self.dashboard, self.panel, self.expr, problem)

    def __str__(self) -> str:
        problem = f"  ({self.problem})" if self.problem else ""
        return f"{self.dashboard} / {self.panel}: {self.expr}{problem}"


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every panel, rows and the panels inside (collapsed) rows included."""
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def panel_queries(paths: Iterable[Path], variables: GrafanaVariables) -> list[PanelQuery]:
    """Every panel target's expression of every dashboard file, variables substituted."""
    queries = []
    for path in paths:
        dashboard = json.loads(path.read_text())
        for panel in _panels(dashboard.get("panels", [])):
            for target in panel.get("targets", []):
                if target.get("expr"):
                    expr = variables.substitute(target["expr"])
                    queries.append(PanelQuery(dashboard["title"], panel.get("title", "?"), expr))
    return queries


def variable_queries(paths: Iterable[Path], variables: GrafanaVariables) -> dict[tuple[str, str], PanelQuery]:
    """Each query variable's ``label_values(<selector>, <label>)`` as the PromQL that returns the
    same values, ``count by (<label>) (<selector>)``, keyed by (dashboard title, variable name)."""
    queries = {}
    for path in paths:
        dashboard = json.loads(path.read_text())
        for variable in dashboard.get("templating", {}).get("list", []):
            if variable.get("type") != "query":
                continue
            query = variable["query"]
            query = query.get("query", "") if isinstance(query, dict) else query
            match = _LABEL_VALUES.match(query)
            assert match and match.group("query"), f"{path.name}: variable {variable['name']}: {query!r}"
            expr = f"count by ({match.group('label')}) ({variables.substitute(match.group('query'))})"
            name = variable["name"]
            queries[(dashboard["title"], name)] = PanelQuery(dashboard["title"], f"variable {name}", expr)
    return queries
