"""The contract (tests/deploy/metric_contract.py) is what the code exports: every keylane metric
family of the live registry is in CONTRACT with its type and labels, and every row of CONTRACT
is exported. The dashboards and rules are checked against CONTRACT, so through it against the
code. docs/operations.md's table lists the same names."""

from __future__ import annotations

import re
from collections.abc import Iterable

from tests.deploy.metric_contract import CONTRACT, TARGET_LABELS, Metric, registry_metrics
from tests.deploy.tools import REPO


def _table(metrics: Iterable[Metric]) -> dict[str, tuple[str, frozenset[str]]]:
    return {m.name: (m.kind, frozenset(m.labels)) for m in metrics}


def test_every_exported_family_is_in_the_contract() -> None:
    exported, expected = _table(registry_metrics()), _table(CONTRACT)

    unexpected = {name: row for name, row in exported.items() if name not in expected}
    assert unexpected == {}, "exported but not in CONTRACT (add them, and to docs/operations.md)"


def test_every_contract_row_is_exported_as_written() -> None:
    exported, expected = _table(registry_metrics()), _table(CONTRACT)

    missing = sorted(set(expected) - set(exported))
    assert missing == [], "in CONTRACT but not exported by keylane.metrics"
    differ = {
        name: {"contract": expected[name], "exported": exported[name]}
        for name in expected
        if exported[name] != expected[name]
    }
    assert differ == {}


def test_contract_rows_are_unique_and_carry_no_target_labels() -> None:
    names = [m.name for m in CONTRACT]
    assert len(names) == len(set(names))
    for metric in CONTRACT:
        assert not set(metric.labels) & TARGET_LABELS, metric.name
        assert not metric.name.endswith(("_total", "_bucket", "_sum", "_count")), metric.name


def test_the_operations_doc_lists_every_exported_series() -> None:
    """docs/operations.md's metrics table names each family as Prometheus stores it."""
    text = (REPO / "docs" / "operations.md").read_text()
    section = text[text.index("## Metrics") : text.index("## Dashboards")]
    documented = set(re.findall(r"^\| `([a-z_:]+)` \|", section, flags=re.MULTILINE))

    expected = {f"{m.name}_total" if m.kind == "counter" else m.name for m in registry_metrics()}
    assert documented == expected
