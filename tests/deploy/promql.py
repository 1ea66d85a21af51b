"""Just enough PromQL reading to check dashboards and alert rules against the metric contract:
which series names an expression selects, with which label matchers, and which labels it
groups or matches by.

Not a parser: it blanks string literals, range and subquery brackets, offsets and `@`
modifiers, then reads identifiers. An identifier followed by `(` is a function or an
aggregation (and must be a known one), a keyword is skipped, any other identifier (bare, or
followed by `{` or `[`) is a series name. Selectors without a name (`{__name__=~"..."}`) are not
supported: keylane's expressions name their series.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

AGGREGATIONS = frozenset(
    {
        "sum",
        "min",
        "max",
        "avg",
        "group",
        "stddev",
        "stdvar",
        "count",
        "count_values",
        "bottomk",
        "topk",
        "quantile",
        "limitk",
        "limit_ratio",
    }
)

FUNCTIONS = frozenset(
    {
        "abs",
        "absent",
        "absent_over_time",
        "acos",
        "acosh",
        "asin",
        "asinh",
        "atan",
        "atanh",
        "avg_over_time",
        "ceil",
        "changes",
        "clamp",
        "clamp_max",
        "clamp_min",
        "cos",
        "cosh",
        "count_over_time",
        "day_of_month",
        "day_of_week",
        "day_of_year",
        "days_in_month",
        "deg",
        "delta",
        "deriv",
        "exp",
        "floor",
        "histogram_avg",
        "histogram_count",
        "histogram_fraction",
        "histogram_quantile",
        "histogram_stddev",
        "histogram_stdvar",
        "histogram_sum",
        "holt_winters",
        "double_exponential_smoothing",
        "hour",
        "idelta",
        "increase",
        "irate",
        "label_join",
        "label_replace",
        "last_over_time",
        "ln",
        "log10",
        "log2",
        "mad_over_time",
        "max_over_time",
        "min_over_time",
        "minute",
        "month",
        "pi",
        "predict_linear",
        "present_over_time",
        "quantile_over_time",
        "rad",
        "rate",
        "resets",
        "round",
        "scalar",
        "sgn",
        "sin",
        "sinh",
        "sort",
        "sort_by_label",
        "sort_by_label_desc",
        "sort_desc",
        "sqrt",
        "stddev_over_time",
        "stdvar_over_time",
        "sum_over_time",
        "tan",
        "tanh",
        "time",
        "timestamp",
        "vector",
        "year",
    }
)

# Binary operators, modifiers and literals that read like identifiers.
KEYWORDS = frozenset(
    {
        "and",
        "or",
        "unless",
        "atan2",
        "bool",
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "offset",
        "inf",
        "nan",
    }
)

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_BRACKETS = re.compile(r"\[[^\]]*\]")
_OFFSET = re.compile(r"\boffset\s+-?[0-9a-zA-Z_$]+", re.IGNORECASE)
_AT = re.compile(r"@\s*(?:start\(\)|end\(\)|[0-9.eE+-]+)")
_SELECTOR = re.compile(r"(?<![\w:.$])([A-Za-z_:][\w:]*)?\s*\{([^}]*)\}")
_MATCHER = re.compile(r'([A-Za-z_]\w*)\s*(=~|!~|!=|=)\s*("(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`)')
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)", re.IGNORECASE)
_IDENT = re.compile(r"(?<![\w:.$])([A-Za-z_:][\w:]*)")


@dataclass(frozen=True)
class Matcher:
    label: str
    op: str
    value: str  # unquoted


@dataclass
class Selector:
    name: str  # "" for a selector without a name
    matchers: list[Matcher] = field(default_factory=list)


@dataclass
class Parsed:
    series: set[str]
    selectors: list[Selector]
    grouping_labels: set[str]
    ranges: list[str]  # the text inside each [...]


class PromqlError(ValueError):
    pass


def parse(expr: str) -> Parsed:
    selectors = [
        Selector(
            name or "",
            [Matcher(label, op, raw[1:-1]) for label, op, raw in _MATCHER.findall(body)],
        )
        for name, body in _SELECTOR.findall(_BRACKETS.sub("[]", expr))
    ]
    ranges = _BRACKETS.findall(_STRING.sub('""', expr))
    text = _STRING.sub('""', expr)
    text = _BRACKETS.sub("[]", text)
    text = _OFFSET.sub(" ", text)
    text = _AT.sub(" ", text)
    text = re.sub(r"\{[^}]*\}", "{}", text)
    grouping: set[str] = set()
    for _, labels in _GROUPING.findall(text):
        grouping.update(label.strip() for label in labels.split(",") if label.strip())
    text = _GROUPING.sub(" ", text)

    series: set[str] = set()
    for match in _IDENT.finditer(text):
        word = match.group(1)
        if word.lower() in KEYWORDS:
            continue
        if text[match.end() :].lstrip().startswith("("):
            if word not in FUNCTIONS and word not in AGGREGATIONS:
                raise PromqlError(f"unknown function {word!r} in {expr!r}")
            continue
        series.add(word)
    return Parsed(series, selectors, grouping, [r[1:-1] for r in ranges])


def series_names(expr: str) -> set[str]:
    """The series (metric) names an expression reads."""
    return parse(expr).series
