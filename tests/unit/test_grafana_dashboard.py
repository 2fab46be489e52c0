"""The Grafana dashboard (docs/grafana/slicejournal.json) queries only series the Prometheus
exporter exports: every PromQL expression's metric names, a histogram's `_bucket`,
`_sum` and `_count` included, are checked against `telemetry_prometheus.METRIC_NAMES`
— a renamed metric fails here rather than as an empty panel in production."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from projections.telemetry_prometheus import METRIC_NAMES, PrometheusTelemetry
from tests.support import ROOT

DASHBOARD = ROOT / "docs" / "grafana" / "slicejournal.json"

_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset",
             "and", "or", "unless", "inf", "nan"}  # fmt: skip
# Clauses whose parentheses hold label names, not expressions.
_LABEL_LISTS = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")


def histograms() -> set[str]:
    """The exporter's histogram families, read from a registry of its own."""
    registry = CollectorRegistry()
    PrometheusTelemetry(registry)
    return {m.name for m in registry.collect() if m.type == "histogram"}


def known_series() -> set[str]:
    """Every series name a query may use: METRIC_NAMES, and each histogram's parts."""
    names = set(METRIC_NAMES)
    for h in histograms():
        assert h in names, f"histogram {h} missing from METRIC_NAMES"
        names |= {f"{h}_bucket", f"{h}_sum", f"{h}_count"}
    return names


def metric_names(expr: str) -> list[str]:
    """The metric names of a PromQL expression (or a Grafana `label_values(metric, label)`)."""
    label_values = re.fullmatch(r"\s*label_values\(\s*([a-zA-Z_:][\w:]*)\s*,\s*\w+\s*\)\s*", expr)
    if label_values:
        return [label_values.group(1)]
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # label values, quantile strings
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # range selectors
    text = _LABEL_LISTS.sub(" ", text)
    names = []
    for m in re.finditer(r"[a-zA-Z_:][\w:]*", text):
        rest = text[m.end() :].lstrip()
        if rest.startswith("(") or m.group(0).lower() in _KEYWORDS:
            continue  # a function or aggregation, or a keyword
        if m.start() > 0 and (text[m.start() - 1].isdigit() or text[m.start() - 1] == "."):
            continue  # the exponent of a number (1e3)
        names.append(m.group(0))
    return names


def expressions(node: Any) -> Iterator[str]:
    """Every query of the dashboard: panel targets' `expr`, template variables' `query`."""
    if isinstance(node, dict):
        for key, value in node.items():
            # A template variable's query is a string with a call (label_values(...)).
            is_query = key == "expr" or (key == "query" and "(" in str(value))
            if is_query and isinstance(value, str):
                yield value
            else:
                yield from expressions(value)
    elif isinstance(node, list):
        for item in node:
            yield from expressions(item)


@pytest.mark.timeout(30)
def test_every_dashboard_query_uses_only_exported_metrics() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    known = known_series()
    queries = list(expressions(dashboard))
    assert len(queries) >= 20, queries
    used: set[str] = set()
    for expr in queries:
        names = metric_names(expr)
        assert names, f"no metric in {expr!r}"
        unknown = [n for n in names if n not in known]
        assert not unknown, f"{expr!r} uses {unknown}, not exported (METRIC_NAMES)"
        used.update(names)
    # What the operating guide promises a panel for.
    promised = [
        f"slicejournal_{name}"
        for name in ("backlog_age_seconds", "backlog_events", "events_handled_total",
                     "handler_errors_total", "handler_retries_total", "dead_letters_total",
                     "lease_held", "append_duration_seconds_bucket")
    ]  # fmt: skip
    for wanted in promised:
        assert wanted in used, f"no panel shows {wanted}"


@pytest.mark.timeout(30)
def test_the_parser_finds_metric_names_and_only_them() -> None:
    expr = (
        "histogram_quantile(0.99, sum by (le, projection) (rate(slicejournal_batch_duration_"
        'seconds_bucket{projection=~"$projection", range!="0-1"}[$__rate_interval]))) / on '
        "(projection) group_left sum without (range) (slicejournal_instance_running) > 1e3"
    )
    assert metric_names(expr) == [
        "slicejournal_batch_duration_seconds_bucket",
        "slicejournal_instance_running",
    ]
    assert metric_names("label_values(slicejournal_lease_held, worker)") == [
        "slicejournal_lease_held"
    ]
    known = known_series()
    assert "slicejournal_append_duration_seconds_count" in known
    assert "slicejournal_backlog_events_bucket" not in known  # a gauge has no buckets
    assert [n for n in metric_names("rate(slicejournal_lag_seconds[5m])") if n not in known]
