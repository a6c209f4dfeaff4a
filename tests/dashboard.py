"""The Grafana dashboard's queries, and what they name: checked against real exporters.

`dashboard_queries()` lists every (panel title, PromQL expression) of
deploy/grafana/dashboards/keg-gateway.json; `referenced(expr)` the metric names it
selects, with the labels each selector matches on and the labels its aggregations
group by. `unknown_references` compares them with the series an exporter really
exposed (`exposed(text)` reads a Prometheus text exposition): tests feed it what a
real ext_proc `Metrics` and control-plane API exposed after traffic, and what a real
Envoy with keg's native module exposed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from keg.paths import REPO_ROOT

DASHBOARD = REPO_ROOT / "deploy" / "grafana" / "dashboards" / "keg-gateway.json"
# Native path: Envoy stats of keg's Kafka filter. Envoy 1.40 exports a dynamic module's
# custom namespace (keg_kafka.api.produce.requests) under this prefix on /stats/prometheus.
NATIVE_PREFIX = "envoy_dynamicmodulescustom_keg_kafka_"
ENVOY_PREFIX = "envoy_"

_NAME = re.compile(r"\b((?:keg|envoy)_[a-z0-9_]+)\b(\{[^}]*\})?")
_MATCHER_LABEL = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
_GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
# Labels no exporter writes: `le` of histogram buckets (histogram_quantile groups by
# it), and the target labels Prometheus adds to every scraped series.
_NOT_EXPORTED = {"le", "instance", "job"}
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="')


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def dashboard_queries() -> list[tuple[str, str]]:
    return [(panel["title"], target["expr"]) for panel in dashboard()["panels"]
            for target in panel["targets"]]


def referenced(expr: str) -> tuple[dict[str, set[str]], set[str]]:
    """({metric name: labels its selectors match on}, labels grouped by)."""
    names: dict[str, set[str]] = {}
    for name, matchers in _NAME.findall(_GROUPING.sub("", expr)):
        labels = names.setdefault(name, set())
        if matchers:
            labels.update(_MATCHER_LABEL.findall(matchers))
    grouped = {label.strip() for group in _GROUPING.findall(expr)
               for label in group.split(",") if label.strip()}
    return names, grouped - _NOT_EXPORTED


def exposed(text: str) -> dict[str, set[str]]:
    """Every sample name of a Prometheus text exposition, as Prometheus stores it, with its
    label names. Read from the lines themselves: prometheus_client's parser would add
    `_total` to the samples of counters whose exposition has none (Envoy's)."""
    series: dict[str, set[str]] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is not None:
            name, labels = match.group(1), match.group(2) or ""
            series.setdefault(name, set()).update(_LABEL.findall(labels))
    return series


def unknown_references(series: dict[str, set[str]], prefixes: Iterable[str],
                       skip_prefixes: Iterable[str] = ()) -> list[str]:
    """What the dashboard's queries name, among metrics starting with `prefixes` (and
    not `skip_prefixes`), that `series` does not have: a missing metric, a label a
    selector matches that the metric lacks, or a grouping label none of the query's
    metrics has."""
    prefixes, skip = tuple(prefixes), tuple(skip_prefixes)
    problems: list[str] = []
    for title, expr in dashboard_queries():
        names, grouped = referenced(expr)
        mine = {n: labels for n, labels in names.items()
                if n.startswith(prefixes) and not n.startswith(skip)}
        if not mine:
            continue
        for name, labels in mine.items():
            if name not in series:
                problems.append(f"{title}: {name} is not exported")
            elif labels - series[name]:
                problems.append(f"{title}: {name} has no label {sorted(labels - series[name])}")
        if set(mine) == set(names):  # every metric of the query is this exporter's
            available = set().union(*(series.get(n, set()) for n in mine))
            if grouped - available:
                problems.append(f"{title}: grouped by {sorted(grouped - available)}, "
                                f"which none of {sorted(mine)} has")
    return problems
