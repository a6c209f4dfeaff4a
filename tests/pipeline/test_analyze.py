"""keg analyze: Spark's aggregates equal DuckDB's over the same audit file."""

from __future__ import annotations

import random
import shutil
import subprocess
from pathlib import Path
from typing import Any

import duckdb
import pytest
from typer.testing import CliRunner

from ext_proc.audit import AuditEvent, JsonlAuditLog, utc_timestamp
from keg.cli import app
from pipeline.analyze import run_analyze
from pipeline.errors import PipelineError


def _audit_log(path: Path, n: int = 600) -> Path:
    rng = random.Random(7)
    with JsonlAuditLog(path) as log:
        for i in range(n):
            log.emit(AuditEvent(
                ts=utc_timestamp(1_700_000_000 + i * 3.7),
                principal=rng.choice(["User:alice", "User:bob", "User:carol", None]),
                client_id=rng.choice(["billing", "etl", None]),
                topic=rng.choice(["orders", "events", "payments.eu", None]),
                api_name=rng.choice(["Produce", "Fetch", "Metadata"]),
                rule_id=rng.choice(["deny-x", "observe-all", None]),
                action=rng.choice(["deny", "observe"]),
                outcome=rng.choice(["denied", "observed", "would-deny", "rejected"]),
                error_code=rng.choice([None, 0, 29, 87]),
                bytes=rng.choice([None, rng.randint(0, 10_000)]),
                latency_ms=rng.choice([None, round(rng.uniform(0.05, 40), 3)]),
                reason=rng.choice([None, "not allowed", "schema mismatch"]),
            ))
    with path.open("a") as f:  # a cut line and garbage: counted, not fatal
        f.write('{"ts": "2023-11-14T22:13:20.000Z", "topic": "orders"\nnot json at all\n')
    return path


def _duck(path: Path, sql: str) -> list[tuple[Any, ...]]:
    con = duckdb.connect()
    con.execute(f"CREATE VIEW audit AS SELECT * FROM read_json('{path}', format='newline_"
                "delimited', ignore_errors=true, columns={ts: 'VARCHAR', principal: 'VARCHAR',"
                " client_id: 'VARCHAR', topic: 'VARCHAR', api_name: 'VARCHAR', rule_id: "
                "'VARCHAR', action: 'VARCHAR', mode: 'VARCHAR', outcome: 'VARCHAR', "
                "error_code: 'INTEGER', bytes: 'BIGINT', latency_ms: 'DOUBLE'})")
    return con.execute(sql).fetchall()


GROUPED = """
SELECT {key}, count(*), coalesce(sum(bytes), 0),
       count(*) FILTER (WHERE outcome = 'denied'),
       count(*) FILTER (WHERE outcome = 'would-deny'),
       count(*) FILTER (WHERE outcome = 'rejected'),
       count(*) FILTER (WHERE error_code IS NOT NULL AND error_code <> 0)
FROM audit WHERE ts IS NOT NULL AND outcome IS NOT NULL GROUP BY {key}
"""


def _rows(summary: dict[str, Any], name: str, *keys: str) -> set[tuple[Any, ...]]:
    return {(*(r[k] for k in keys), r["events"], r["bytes"], r["denied"], r["would_deny"],
             r["rejected"], r["errors"]) for r in summary[name]}


def test_analytics_equal_duckdb(spark: Any, tmp_path: Path) -> None:
    log = _audit_log(tmp_path / "audit.jsonl")
    result = run_analyze(spark, log, tmp_path / "out")
    summary = result.summary

    # DuckDB skips the garbage line but reads the cut one as an object missing fields;
    # the reference keeps only complete events, as Spark's permissive reader does.
    events, total_bytes = _duck(log, "SELECT count(*), sum(bytes) FROM audit "
                                "WHERE outcome IS NOT NULL")[0]
    assert summary["totals"]["events"] == events == 600
    assert summary["totals"]["bytes"] == total_bytes
    assert summary["totals"]["malformed"] == 2
    for name, key in (("topics", "topic"), ("principals", "principal"),
                      ("clients", "client_id"), ("apis", "api_name")):
        assert _rows(summary, name, key) == set(_duck(log, GROUPED.format(key=key))), name
    rules = set(_duck(log, GROUPED.format(key="rule_id, action, mode")))
    assert _rows(summary, "rules", "rule_id", "action", "mode") == rules

    outcomes = _duck(log, "SELECT outcome, count(*) FROM audit WHERE outcome IS NOT NULL "
                     "GROUP BY outcome")
    assert {(r["outcome"], r["events"]) for r in summary["outcomes"]} == set(outcomes)

    quantiles = _duck(log, "SELECT count(latency_ms), quantile_cont(latency_ms, 0.5), "
                      "quantile_cont(latency_ms, 0.9), quantile_cont(latency_ms, 0.99), "
                      "max(latency_ms) FROM audit WHERE outcome IS NOT NULL")[0]
    latency = summary["latency"][0]
    assert latency["events"] == quantiles[0]
    for column, expected in zip(("p50", "p90", "p99", "max"), quantiles[1:], strict=True):
        assert latency[column] == pytest.approx(expected), column

    talkers = _duck(log, "SELECT principal, client_id, coalesce(sum(bytes), 0) AS b FROM "
                    "audit WHERE outcome IS NOT NULL GROUP BY ALL ORDER BY b DESC LIMIT 1")
    top = summary["top_talkers"][0]
    assert (top["principal"], top["client_id"], top["bytes"]) == talkers[0]
    assert sum(r["events"] for r in summary["timeline"]) == 600
    assert (tmp_path / "out" / "topics.parquet").is_file()


def test_missing_audit_log(spark: Any, tmp_path: Path) -> None:
    with pytest.raises(PipelineError, match="does not exist"):
        run_analyze(spark, tmp_path / "nope.jsonl", tmp_path / "out")


def test_empty_audit_directory(spark: Any, tmp_path: Path) -> None:
    with pytest.raises(PipelineError, match="holds no files"):
        run_analyze(spark, tmp_path, tmp_path / "out")


def test_an_empty_audit_log_gives_an_empty_report(spark: Any, tmp_path: Path) -> None:
    """A gateway that saw no traffic writes an empty audit log: `keg analyze` died with
    KeyError 'totals' and a traceback (regression). It now reports nothing happened."""
    log = tmp_path / "audit.jsonl"
    log.write_text("")
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["analyze", "--audit", str(log), "--out", str(out), "-q"])
    assert result.exit_code == 0, result.output
    assert '"events": 0' in result.output and "Traceback" not in result.output
    assert (out / "report.html").is_file() and (out / "topics.parquet").is_file()


@pytest.fixture(scope="module")
def analyzed(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """`keg analyze` run once from the command line: its output and result directory."""
    base = tmp_path_factory.mktemp("analyze")
    log = _audit_log(base / "audit.jsonl", 200)
    out = base / "out"
    result = CliRunner().invoke(app, ["analyze", "--audit", str(log), "--out", str(out), "-q"])
    assert result.exit_code == 0, result.output
    return result.output, out


def test_cli_analyze_writes_an_offline_report(analyzed: tuple[str, Path]) -> None:
    output, out = analyzed
    assert '"events": 200' in output
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") >= 4
    assert "<script" not in page and "http" not in page  # renders offline


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="no headless Chromium (apt-get install chromium)")
def test_report_renders_in_headless_chromium(analyzed: tuple[str, Path]) -> None:
    from PIL import Image

    _, out = analyzed
    shot = out / "report.png"
    subprocess.run([str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu",
                    f"--screenshot={shot}", "--window-size=1280,2400",
                    (out / "report.html").as_uri()], check=True, capture_output=True,
                   timeout=120)
    with Image.open(shot) as image:
        assert image.size == (1280, 2400)
        colours = image.convert("RGB").getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 50  # text and plots, not a blank page


def test_cli_analyze_bad_path_exit_2(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["analyze", "--audit", str(tmp_path / "missing")])
    assert result.exit_code == 2
    assert "does not exist" in result.output and "Traceback" not in result.output


def test_follow_reads_the_audit_topic_only(tmp_path: Path) -> None:
    log = _audit_log(tmp_path / "audit.jsonl", 5)
    result = CliRunner().invoke(app, ["analyze", "--follow", "--audit", str(log), "-q"])
    assert result.exit_code == 2
    assert "--follow reads the audit topic: --audit kafka://host:port/topic" in result.output


def test_the_live_impact_page_plots_each_rule(tmp_path: Path) -> None:
    from datetime import UTC, datetime, timedelta

    from pipeline.reports import impact_report

    start = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
    rows = [{"minute": start + timedelta(minutes=m), "rule_id": rule, "topic": "orders",
             "principal": "User:alice", "outcome": outcome, "decisions": 3 + m, "bytes": 100,
             "records": 10, "errors": 1 if outcome == "denied" else 0,
             "p50_latency_ms": 1.0, "p99_latency_ms": 4.0 + m}
            for m in range(5) for rule, outcome in (("mask", "modified"), ("deny", "denied"))]
    page = impact_report(rows, tmp_path / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 4
    assert '<meta http-equiv="refresh" content="10">' in page
    assert "<script" not in page and "mask" in page and "deny" in page
    empty = impact_report([], tmp_path / "empty.html").read_text()
    assert "no audit events yet" in empty
