"""--fail-on parsing and checking; the errors a person sees instead of a JVM trace."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pipeline.errors import PipelineError
from pipeline.spark import first_line, java_version
from pipeline.thresholds import check, check_rule_ids, parse_threshold

SUMMARY: dict[str, Any] = {
    "totals": {"records": 200, "unchanged": 150, "modified": 20, "dropped": 30,
               "rejected": 0, "failed": 0, "changed": 50, "differs": 25},
    "rules": [{"rule_id": "pii-mask", "matched": 100, "unchanged": 80, "modified": 20,
               "dropped": 0, "rejected": 0, "failed": 0}],
}


@pytest.mark.parametrize(("text", "crossed"), [
    ("dropped>0.1", True),        # 15% > 10%
    ("dropped>0.2", False),
    ("dropped>20%", False),
    ("dropped>=30", True),        # a count
    ("dropped>30", False),
    ("rejected>=1", False),
    ("differs>10%", True),
    ("changed==50", True),
    ("pii-mask:modified==0", False),
    ("pii-mask:matched>0.4", True),  # 100 of 200 records
    ("other-rule:modified>0", False),
])
def test_thresholds(text: str, crossed: bool) -> None:
    assert bool(check([parse_threshold(text)], SUMMARY)) is crossed


def test_crossed_lines_say_what_was_measured() -> None:
    assert check([parse_threshold("dropped > 10%")], SUMMARY) == [
        "dropped > 10%: measured 15.00%"]


@pytest.mark.parametrize(("text", "message"), [
    ("dropped~1", "expected \\[rule:\\]metric OP number"),
    ("lost>1", "unknown metric 'lost'"),
    ("r1:differs>1", "unknown metric 'differs'"),
    ("dropped>150%", "a fraction is between 0 and 1"),
])
def test_bad_thresholds(text: str, message: str) -> None:
    with pytest.raises(PipelineError, match=message):
        parse_threshold(text)


def test_a_threshold_naming_a_rule_the_set_lacks_is_refused() -> None:
    """A misspelled rule id measured 0 for ever: `nosuchrule:modified>0` never failed,
    `mask-emial:matched<1` always did."""
    thresholds = [parse_threshold("pii-mask:modified>0"), parse_threshold("dropped>1")]
    check_rule_ids(thresholds, {"pii-mask", "drop-deleted"})
    with pytest.raises(PipelineError, match="no rule 'pii-mas' \\(did you mean 'pii-mask'"):
        check_rule_ids([parse_threshold("pii-mas:modified>0")], {"pii-mask"})
    with pytest.raises(PipelineError, match=r"no rule 'nosuchrule'$"):
        check_rule_ids([parse_threshold("nosuchrule:modified>0")], {"pii-mask"})


def test_a_threshold_on_a_rule_the_backtest_does_not_evaluate_is_refused() -> None:
    """A gate on a deny (`no-payments:matched==0`) measured 0 whatever the rule did live
    (a backtest runs record rules only) and passed."""
    gate = [parse_threshold("no-payments:matched==0")]
    with pytest.raises(PipelineError, match="'no-payments' is a deny rule, which a backtest "
                                            "does not evaluate"):
        check_rule_ids(gate, {"no-payments", "pii-mask"}, {"no-payments": "deny"})
    check_rule_ids([parse_threshold("pii-mask:matched>0")], {"no-payments", "pii-mask"},
                   {"no-payments": "deny"})


def test_a_dry_run_rules_would_counts_can_be_gated_on() -> None:
    summary = {**SUMMARY, "rules": [{**SUMMARY["rules"][0], "would_dropped": 7}]}
    assert check([parse_threshold("pii-mask:would_dropped>5")], summary) == [
        "pii-mask:would_dropped>5: measured 7"]


def test_missing_java_is_one_clear_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(PipelineError, match="Spark needs Java 17 or newer and none was found"):
        java_version()


def test_old_java_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    java = tmp_path / "bin" / "java"
    java.parent.mkdir()
    java.write_text('#!/bin/sh\necho \'openjdk version "1.8.0_392"\' >&2\n')
    java.chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(PipelineError, match="is Java 8"):
        java_version()


def test_first_line_keeps_the_python_workers_error() -> None:
    wrapped = Exception(
        "An error occurred while calling o123.parquet.\n"
        ": org.apache.spark.SparkException: Job aborted due to stage failure: Task 0\n"
        "org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
        '  File "/x/pipeline/evaluate.py", line 10, in evaluate_batches\n'
        "ValueError: bad capture row\n"
        "\tat org.apache.spark.api.python.BasePythonRunner.handlePythonException(X.scala:1)\n")
    assert first_line(wrapped) == "ValueError: bad capture row"
    missing = "[PATH_NOT_FOUND] Path does not exist: file:/x."
    assert first_line(Exception(f"\tat java.base/Thread.run\n{missing}")) == missing
