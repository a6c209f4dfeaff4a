"""The backtest and analysis reports: what a reviewer of a rule change reads."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from pipeline.report import HtmlReport, bar_chart, time_chart

STATUS_COLUMNS: Final = ("unchanged", "modified", "dropped", "rejected", "failed")


def _mib(n: int | None) -> str:
    return f"{(n or 0) / (1 << 20):,.2f} MiB"


def backtest_report(summary: Mapping[str, Any], crossed: Sequence[str], path: Path) -> Path:
    totals = summary["totals"]
    report = HtmlReport("keg backtest",
                        f"rules {summary.get('rules_dir')} vs live "
                        f"{summary.get('live_rules_dir') or '(none)'} over {totals['records']:,}"
                        " records")
    report.heading("Verdict")
    if crossed:
        for line in crossed:
            report.paragraph(f"threshold crossed: {line}", "fail")
    else:
        report.paragraph("no threshold crossed", "pass")
    report.cards([
        ("records", totals["records"], False),
        *((s, totals[s], s in ("dropped", "rejected", "failed") and totals[s] > 0)
          for s in STATUS_COLUMNS),
        ("differ from live",
         totals["differs"] if summary.get("live_rules_dir") else "n/a", totals["differs"] > 0),
        ("bytes before", _mib(totals["bytes_before"]), False),
        ("bytes after", _mib(totals["bytes_after"]), False),
        *((("bytes after (live)", _mib(totals["live_bytes_after"]), False),)
          if summary.get("live_rules_dir") else ()),
    ])

    unjudged = [*summary.get("unjudged", ()), *summary.get("live_unjudged", ())]
    if unjudged:
        report.heading("Rules not judged as live")
        report.paragraph("A backtest runs record rules only, on what a capture records: "
                         "request rules are not evaluated, and a record rule whose match "
                         "reads the connection (client id, address, listener, broker) or the "
                         "API version is judged without it.", "meta")
        report.table(unjudged, ["rule_id", "kind", "where", "approximate", "reason"])

    rules = summary["rules"]
    report.heading("Per rule")
    dry = [c for c in ("would_modified", "would_dropped", "would_rejected")
           if any(r[c] for r in rules)]  # dry-run columns only when a dry-run rule acted
    report.table(rules, ["rule_id", "kind", "matched", "unchanged", "modified", "dropped",
                         "rejected", "failed", *dry, "bytes_before", "bytes_after",
                         "sample_reasons"], empty="no record rule matched any record")
    if rules:
        # A dry-run rule's would_* records too: without them its bar fell short of what
        # it matched (46 of 55 drawn for a dry-run mask).
        effects = ("unchanged", "modified", "dropped", "rejected", "failed", *dry)
        report.figure(bar_chart([r["rule_id"] for r in rules],
                                {e.replace("_", " "): [r[e] for r in rules] for e in effects},
                                "What each rule did", "records"), "records per rule and effect")

    report.heading("Difference from the live rules")
    diff = summary["diff"]
    report.table(diff["transitions"], ["live_status", "status", "records"],
                 empty="every record is treated as the live rules treat it")
    if diff["samples"]:
        report.paragraph(f"first {len(diff['samples'])} differing records:", "meta")
        report.table(diff["samples"])

    report.heading("Per topic")
    topics = summary["topics"]
    report.table(topics)
    if topics:
        report.figure(bar_chart([t["topic"] for t in topics],
                                {s: [t[s] for t in topics] for s in STATUS_COLUMNS},
                                "Records per topic and status", "records"),
                      "records per topic and status")

    timeline = summary.get("timeline") or []
    if timeline:
        report.heading("Over time (record timestamps)")
        times = [datetime.fromtimestamp(b["bucket_ms"] / 1000, tz=UTC) for b in timeline]
        report.figure(time_chart(times, {s: [b[s] for b in timeline] for s in STATUS_COLUMNS},
                                 "Records per status", "records"), "records per status over time")
    return report.write(path)


def analyze_report(summary: Mapping[str, Any], path: Path) -> Path:
    totals = summary["totals"]
    report = HtmlReport("keg audit analysis",
                        f"{summary['audit']} ({summary['files']} file(s)), "
                        f"{totals['first']} .. {totals['last']}")
    report.cards([
        ("events", totals["events"], False),
        ("bytes", _mib(totals["bytes"]), False),
        ("denied", totals["denied"], totals["denied"] > 0),
        ("would deny", totals["would_deny"], False),
        ("rejected", totals["rejected"], totals["rejected"] > 0),
        ("error answers", totals["errors"], False),
        ("principals", totals["principals"], False),
        ("topics", totals["topics"], False),
        ("malformed lines", totals["malformed"], totals["malformed"] > 0),
    ])
    report.heading("Outcomes")
    report.table(summary["outcomes"])
    timeline = summary["timeline"]
    if timeline:
        buckets = sorted({r["bucket"] for r in timeline})
        outcomes = sorted({str(r["outcome"]) for r in timeline})
        index = {(r["bucket"], str(r["outcome"])): r for r in timeline}
        for metric, label in (("events", "events"), ("bytes", "bytes")):
            series = {o: [index.get((b, o), {}).get(metric, 0) for b in buckets]
                      for o in outcomes}
            report.figure(time_chart(buckets, series, f"{label.capitalize()} per outcome",
                                     label), f"{label} per outcome over time")
    for name, title, key in (("topics", "Per topic", "topic"),
                             ("principals", "Per principal", "principal"),
                             ("clients", "Per client id", "client_id")):
        rows = summary[name]
        report.heading(title)
        report.table(rows[:50])
        if rows:
            top = rows[:20]
            report.figure(bar_chart([_name(r[key]) for r in top],
                                    {"events": [r["events"] for r in top]},
                                    f"Events {title.lower()}", "events"),
                          f"events {title.lower()}")
    report.heading("Per rule")
    report.table(summary["rules"][:100])
    report.heading("Denied and rejected")
    report.table(summary["denied"][:100], empty="nothing was denied or rejected")
    report.heading("Top talkers (bytes)")
    report.table(summary["top_talkers"])
    if summary["top_talkers"]:
        top = summary["top_talkers"]
        report.figure(bar_chart([f"{_name(r['principal'])} / {_name(r['client_id'])}"
                                 for r in top],
                                {"bytes": [r["bytes"] for r in top]}, "Top talkers", "bytes"),
                      "top talkers by bytes")
    report.heading("Latency (ms)")
    report.table([*_label(summary["latency"], "all"), *summary["latency_by_api"]],
                 empty="no event carries latency_ms")
    return report.write(path)


def impact_report(rows: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """The live impact page (keg analyze --follow): per rule over the last hour."""
    report = HtmlReport("keg live rule impact",
                        "per-minute aggregates of the audit stream (reloads every 10 s)",
                        refresh_s=10)
    if not rows:
        report.paragraph("no audit events yet", "meta")
        return report.write(path)
    rules = sorted({_name(r["rule_id"]) for r in rows})
    minutes = sorted({r["minute"] for r in rows})
    per_rule: dict[str, dict[str, Any]] = {}
    series: dict[str, dict[str, dict[Any, float]]] = {
        m: {rule: {} for rule in rules} for m in ("decisions", "bytes", "errors", "p99")}
    for r in rows:
        rule = _name(r["rule_id"])
        total = per_rule.setdefault(rule, {"rule_id": rule, "decisions": 0, "bytes": 0,
                                           "records": 0, "errors": 0, "outcomes": set()})
        for metric in ("decisions", "bytes", "records", "errors"):
            total[metric] += r[metric] or 0
        total["outcomes"].add(r["outcome"])
        for metric in ("decisions", "bytes", "errors"):
            points = series[metric][rule]
            points[r["minute"]] = points.get(r["minute"], 0) + (r[metric] or 0)
        p99 = series["p99"][rule]
        p99[r["minute"]] = max(p99.get(r["minute"], 0.0), r["p99_latency_ms"] or 0.0)
    totals = [{**t, "outcomes": sorted(t["outcomes"])} for t in per_rule.values()]
    report.cards([
        ("rules", len(rules), False),
        ("decisions", sum(t["decisions"] for t in totals), False),
        ("bytes", _mib(sum(t["bytes"] for t in totals)), False),
        ("errors", sum(t["errors"] for t in totals), any(t["errors"] for t in totals)),
        ("minutes", len(minutes), False),
    ])
    report.heading("Per rule (last hour)")
    report.table(sorted(totals, key=lambda t: -t["decisions"]))
    for metric, title, unit in (("decisions", "Decisions per minute", "decisions"),
                                ("bytes", "Bytes per minute", "bytes"),
                                ("errors", "Error answers per minute", "errors"),
                                ("p99", "p99 latency (slowest topic/principal)", "ms")):
        report.figure(time_chart(minutes, {rule: [series[metric][rule].get(m, 0)
                                                  for m in minutes] for rule in rules},
                                 title, unit), title.lower())
    report.heading("Latest minutes")
    report.table(sorted(rows, key=lambda r: r["minute"], reverse=True)[:100])
    return report.write(path)


def _name(value: Any) -> str:
    return "(none)" if value is None else str(value)


def _label(rows: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [{"api_name": name, **r} for r in rows if r.get("events")]


__all__ = ["analyze_report", "backtest_report", "impact_report"]
